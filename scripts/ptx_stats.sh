#!/usr/bin/env bash
# Memory and MMA instruction counts in the PTX of cached Triton kernels whose name matches $1
# (default: _wo_), to check vectorized loads and tensor-core lowering. Usage: scripts/ptx_stats.sh [pattern]
PAT=${1:-_wo_}
for f in $(ls -t ~/.triton/cache/*/*.ptx 2>/dev/null | xargs grep -l "\.entry $PAT" 2>/dev/null | head -${2:-12}); do
  name=$(grep -o "\.entry [a-zA-Z0-9_]*" "$f" | head -1)
  printf '%s %s\n' "$name" "$(grep -oE 'ld\.global(\.[a-z0-9]+)*|wgmma\.mma_async[a-z0-9.]*|mma\.sync[a-z0-9.]*|cp\.async[a-z0-9.]*|prmt\.b32|lop3\.b32|cvt\.[a-z0-9.]*' "$f" | sort | uniq -c | sort -rn | awk '{printf "%s:%s ", $2, $1}')"
done

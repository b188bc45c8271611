#!/usr/bin/env bash
# The decoder runtime on a GPU in one call: its tests (attention kernels, models vs transformers), then
# `qkernels bench runtime`. Usage: scripts/gpu_runtime.sh OUTDIR [--models llama3-8b,qwen3-1.7b]
# TUNE_ATTENTION=1: between the two, decode attention's configs swept in the decode step and written into this GPU's
# table (scripts/tune_attention.py --write; the table and the sweep's log copied to OUTDIR), so the bench runs them.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_runtime.sh OUTDIR [bench args...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests/ops/test_attention.py tests/models -q -p no:cacheprovider -n 4 2>&1 \
    | tee "$OUT/tests_runtime.log" | tail -15
fi
if [ -n "${TUNE_ATTENTION:-}" ]; then
  python3 scripts/tune_attention.py --write 2>&1 | tee "$OUT/tune_attention.log" | grep -E "^==>|^wrote"
  table=$(grep "^wrote" "$OUT/tune_attention.log" | cut -d" " -f2)
  [ -n "$table" ] && cp "$table" "$OUT/"
fi
python3 -m qkernels.cli bench runtime --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_runtime.log"

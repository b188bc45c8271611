#!/usr/bin/env bash
# The gpu-marked tests under NVIDIA compute-sanitizer: memcheck (out-of-bounds and misaligned
# accesses, leaks of device memory) and racecheck (shared-memory hazards).
# Usage: scripts/sanitize.sh OUTDIR [pytest selection for racecheck]
# PyTorch's caching allocator is switched off (MEM_CACHING=1 keeps it) so every tensor is its own
# allocation and an access past its end is caught; without it the largest tests run out of memory under
# memcheck, so run those with MEM_CACHING=1. racecheck instruments only qkernels' Triton kernels
# (RACE_KERNELS; PyTorch's own reduction kernels, used by the tests' comparisons, report benign
# hazards). Writes OUTDIR/memcheck.log, OUTDIR/racecheck.log and OUTDIR/sanitize_summary.txt.
set -uo pipefail
OUT=${1:?usage: scripts/sanitize.sh OUTDIR}
RACE_SEL=${2:-tests/ops/test_fused.py tests/ops/test_quant.py}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
[ -z "${MEM_CACHING:-}" ] && export PYTORCH_NO_CUDA_MEMORY_CACHING=1
RACE_KERNELS=${RACE_KERNELS:-'^_(norm|silu_and_mul|softmax|scaled_mm|quantize|stats|dequantize|pack|unpack|wo)_'}
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$CS" ]; then echo "compute-sanitizer not found" | tee "$OUT/sanitize_summary.txt"; exit 2; fi
# memcheck: the gpu tests of every kernel family (the compile / graph-capture tests are left to the
# plain run: capture under the sanitizer measures the sanitizer, not the kernels)
MEM_SEL=${MEM_SEL:-tests/ops tests/reliability/test_shapes.py tests/reliability/test_numerics.py}
timeout "${MEM_TIMEOUT:-330}" "$CS" --tool memcheck --leak-check no --error-exitcode 99 --target-processes all \
  python3 -m pytest -q -p no:cacheprovider -m gpu -k "${MEM_K:-not compile and not graph}" $MEM_SEL > "$OUT/memcheck.log" 2>&1
echo "memcheck exit $? ($MEM_SEL)" > "$OUT/sanitize_summary.txt"
timeout "${RACE_TIMEOUT:-200}" "$CS" --tool racecheck --error-exitcode 99 --target-processes all \
  --kernel-regex "kns=$RACE_KERNELS" \
  python3 -m pytest -q -p no:cacheprovider -m gpu -k "not compile and not graph" $RACE_SEL > "$OUT/racecheck.log" 2>&1
echo "racecheck exit $? ($RACE_SEL)" >> "$OUT/sanitize_summary.txt"
for t in memcheck racecheck; do
  echo "== $t: $(grep -c '=========   ' "$OUT/$t.log") sanitizer report lines; summary:" >> "$OUT/sanitize_summary.txt"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/$t.log" | tail -3 >> "$OUT/sanitize_summary.txt"
done
cat "$OUT/sanitize_summary.txt"

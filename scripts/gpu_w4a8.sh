#!/usr/bin/env bash
# W4A8-FP8 on a GPU in one call: its tests (the op's and the layer's: graphs, torch.compile), the tile sweep in the
# decode chain beside fp16, W4A16 and W8A8-FP8 (scripts/tune_w4a8.py), then the decode-GEMV rows of W4A8 and its
# rivals (our W4A16 and W8A8-FP8, gemlite's A8W4 FP8) on the table the sweep wrote.
# Usage: scripts/gpu_w4a8.sh OUTDIR [tune_w4a8 args...]
#   SKIP_TESTS=1 skips the tests (TESTS names other test files); SKIP_TUNE=1 the sweep; TUNE_S (default 420) stops
#   the sweep after that many seconds (the rows so far are in OUTDIR/w4a8_sweep.json); APPLY=1 writes its winners
#   into the table (OUTDIR/<gpu>.json); DECODE_MS (e.g. 16,32,64,128,256) runs `bench decode-gemv` at those M on both
#   models' shapes for PROVIDERS (default: ours W4A16, W8A8-FP8, W4A8-FP8 and gemlite's A8W4 FP8; fp16 always), its
#   rows merged into a copy of this GPU's decode_gemv.json under OUTDIR/results, stopped after BENCH_S (default
#   330) seconds (the layers done so far are written).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_w4a8.sh OUTDIR}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh
SLUG=$(python3 -c 'import torch; from qkernels._runtime import gpu_slug, device_name
print(gpu_slug(device_name(torch.device("cuda"))))')
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest ${TESTS:-tests/ops/test_w4a8.py tests/nn/test_linear.py} -q -p no:cacheprovider -n 4 2>&1 \
    | tee "$OUT/tests_w4a8.log" | tail -8
fi
if [ -z "${SKIP_TUNE:-}" ]; then
  timeout "${TUNE_S:-420}" python3 scripts/tune_w4a8.py --out "$OUT" "$@" 2>&1 | tee "$OUT/tune_w4a8.log"
  if [ -n "${APPLY:-}" ]; then
    python3 scripts/tune_w4a8.py --apply "$OUT/w4a8_sweep.json" | tail -1
    cp "src/qkernels/configs/$SLUG.json" "$OUT/"
  fi
fi
if [ -n "${DECODE_MS:-}" ]; then      # only the file the rows merge into: OUTDIR stays small
  mkdir -p "$OUT/results/$SLUG"
  cp "benchmarks/results/$SLUG/decode_gemv.json" "$OUT/results/$SLUG/" 2>/dev/null
  timeout "${BENCH_S:-330}" python3 -m qkernels.cli bench decode-gemv --out "$OUT/results" \
    --models llama3-8b,qwen3-1.7b --ms "$DECODE_MS" \
    --providers "${PROVIDERS:-qkernels w4a16,qkernels w8a8-fp8,w4a8}" 2>&1 | tee "$OUT/decode_gemv.log" | tail -3
fi

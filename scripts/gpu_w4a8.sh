#!/usr/bin/env bash
# W4A8-FP8 on a GPU in one call: its tests (the op's and the layer's: graphs, torch.compile), then the tile sweep in
# the decode chain beside fp16, W4A16 and W8A8-FP8 (scripts/tune_w4a8.py).
# Usage: scripts/gpu_w4a8.sh OUTDIR [tune_w4a8 args...]   SKIP_TESTS=1 skips the tests, TESTS names other test files,
# TUNE_S (default 420) stops the sweep after that many seconds (the rows so far are in OUTDIR/w4a8_sweep.json).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_w4a8.sh OUTDIR}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest ${TESTS:-tests/ops/test_w4a8.py tests/nn/test_linear.py} -q -p no:cacheprovider -n 4 2>&1 \
    | tee "$OUT/tests_w4a8.log" | tail -8
fi
timeout "${TUNE_S:-420}" python3 scripts/tune_w4a8.py --out "$OUT" "$@" 2>&1 | tee "$OUT/tune_w4a8.log"

#!/usr/bin/env bash
# W4A8-FP8 on a GPU in one call: its tests, then the tile sweep in the decode chain beside fp16, W4A16 and
# W8A8-FP8 (scripts/tune_w4a8.py). Usage: scripts/gpu_w4a8.sh OUTDIR [tune_w4a8 args...]  (SKIP_TESTS=1 to skip them)
set -uo pipefail
OUT=${1:?usage: scripts/gpu_w4a8.sh OUTDIR}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests/ops/test_w4a8.py -q -p no:cacheprovider -n 4 2>&1 | tee "$OUT/tests_w4a8.log" | tail -8
fi
python3 scripts/tune_w4a8.py --out "$OUT" "$@" 2>&1 | tee "$OUT/tune_w4a8.log"

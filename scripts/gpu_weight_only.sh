#!/usr/bin/env bash
# Weight-only work on a GPU in one call: its tests, the config sweep, then the benchmark.
# Usage: scripts/gpu_weight_only.sh OUTDIR [tune args...]   (SKIP_TUNE=1 / SKIP_TESTS=1 / SKIP_BENCH=1 to skip steps;
#   MS=128,1024: the benchmark at those M only, merged into the committed file: with the peers installed the whole
#   grid took more than 7 minutes on an H200 with an empty kernel cache, gemlite compiling its kernels)
set -uo pipefail
OUT=${1:?usage: scripts/gpu_weight_only.sh OUTDIR}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests/ops/test_weight_only.py tests/test_packed_weight.py -q -p no:cacheprovider -n 8 2>&1 \
    | tee "$OUT/tests_weight_only.log" | tail -15
fi
if [ -z "${SKIP_TUNE:-}" ]; then
  python3 scripts/tune_weight_only.py "$@" 2>&1 | tee "$OUT/tune_weight_only.log" | grep -E "==>|wrote|failed" | head -60
  cp src/qkernels/configs/*.json "$OUT/"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  # into the working tree's results (MS="128,1024": only those M, their rows replacing the file's), then to OUT
  SLUG=$(python3 -c 'import torch; from qkernels._runtime import gpu_slug, device_name
print(gpu_slug(device_name(torch.device("cuda"))))')
  python3 -m qkernels.cli bench weight-only --out benchmarks/results ${MS:+--ms "$MS"} 2>&1 \
    | tee "$OUT/bench_weight_only.log" | tail -5
  mkdir -p "$OUT/$SLUG" && cp "benchmarks/results/$SLUG/weight_only.json" "$OUT/$SLUG/"
fi

#!/usr/bin/env bash
# The calibrated quantizers and checkpoint formats on a GPU in one call: their tests (GPTQ / AWQ, GPTQ / AWQ
# directories, the transformers integration, the runtime reading them), then `qkernels bench quantizers`.
# Usage: scripts/gpu_quantizers.sh OUTDIR [bench args...]   (SKIP_TESTS=1: the benchmark only)
set -uo pipefail
OUT=${1:?usage: scripts/gpu_quantizers.sh OUTDIR [bench args...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests/nn tests/models tests/ops/test_attention.py tests/reliability/test_compile_graphs.py \
    tests/test_cli_generate.py -q -p no:cacheprovider -n 8 2>&1 | tee "$OUT/tests_quantizers.log" | tail -15
fi
python3 -m qkernels.cli bench quantizers --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_quantizers.log"

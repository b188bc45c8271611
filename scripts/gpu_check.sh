#!/usr/bin/env bash
# One call on a GPU machine: environment report, the whole test suite (gpu-marked real sizes
# included), then every benchmark. Usage: scripts/gpu_check.sh OUTDIR [bench names...]
# Writes OUTDIR/env.txt, OUTDIR/tests.log, OUTDIR/bench.log and OUTDIR/<gpu>/<bench>.{json,png}.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR [bench...]}
shift
BENCHES=${*:-all}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
python3 -m qkernels.cli env 2>&1 | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >> "$OUT/env.txt" 2>&1
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" 2>&1 | tee "$OUT/tests.log" | tail -25
fi
for b in $BENCHES; do
  python3 -m qkernels.cli bench "$b" --out "$OUT" 2>&1 | tee -a "$OUT/bench.log"
done

#!/usr/bin/env bash
# Ship a config table for the GPU of this machine in one call: the GEMM sweep (int8, fp8), then the
# weight-only sweep, each under a time budget; the table is copied to OUTDIR after each step, so a run cut
# off by the call's time limit keeps what it finished. Last, the weight-only batched-decode buckets (M = 5-16)
# again as a decode step runs them (tune_weight_only.py --chain, tc and wg candidates).
# The table as it was is kept in OUTDIR/before/<gpu>.json: before shipping the new one, time the two in the runtime's
# decode step (a chain sweep's pick can lose there), in a second call with the new table in src/qkernels/configs:
#   PYTHONPATH=src python3 scripts/table_ab.py --table OUTDIR/before --table shipped --schemes w4a16 w8a16
# Usage: scripts/gpu_tune.sh OUTDIR [gemm_s] [wo_s] [chain_s]
set -uo pipefail
OUT=${1:?usage: scripts/gpu_tune.sh OUTDIR [gemm budget s] [weight-only budget s] [decode-chain budget s]}
GEMM_S=${2:-240}
WO_S=${3:-200}
CHAIN_S=${4:-150}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
SLUG=$(python3 -c 'import torch; from qkernels._runtime import gpu_slug, device_name
print(gpu_slug(device_name(torch.device("cuda"))))')
mkdir -p "$OUT/before"
cp "src/qkernels/configs/$SLUG.json" "$OUT/before/" 2>/dev/null || echo "no shipped table for $SLUG"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt" 2>&1
python3 scripts/tune_gemm.py --kinds int8 fp8 --budget-s "$GEMM_S" 2>&1 | tee "$OUT/tune_gemm.log" | grep -E "==>|wrote|budget"
cp src/qkernels/configs/*.json "$OUT/"
python3 scripts/tune_weight_only.py --budget-s "$WO_S" 2>&1 | tee "$OUT/tune_weight_only.log" | grep -E "==>|wrote|budget"
cp src/qkernels/configs/*.json "$OUT/"
python3 scripts/tune_weight_only.py --chain --bits 4 --buckets 8 16 --paths tc wg --budget-s "$CHAIN_S" 2>&1 \
  | tee "$OUT/tune_weight_only_chain.log" | grep -E "==>|wrote|budget"
cp src/qkernels/configs/*.json "$OUT/"

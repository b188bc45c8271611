#!/usr/bin/env bash
# Tensor parallelism on a machine of two GPUs in one call: the TP tests over NCCL (tests/ops/test_collective.py,
# tests/models/test_parallel.py, the `generate --tp 2` CLI test), then `qkernels bench runtime --tp 2` under torchrun (TP=2 beside TP=1 in the same
# run; OUTDIR/<gpu>/tp.json). Usage: scripts/gpu_tp.sh OUTDIR [bench args, e.g. --models llama3-8b]
# SKIP_TESTS=1: the benchmark alone. TUNE_TP=1: before it, a rank's decode shapes (TUNE_TP_MODELS', llama3-8b by
# default, llama3-70b too; split 2 ways) swept at the M = 1 and 16 buckets on one GPU (scripts/tune_weight_only.py
# --chain --tp 2: W4A16 shape overrides only, OUTDIR/<gpu>.json), so the TP=2 rows run them; TUNE_TP_BUDGET_S (200).
# Before the bench, scripts/bench_allreduce.py (OUTDIR/allreduce.json: where the one-shot cap, 16 MB by default,
# should lie; the LL protocol beside the flag one up to 1 MB; SKIP_ALLREDUCE=1 skips it). The bench times the decode
# step with both protocols of the one-shot kernels and with NCCL.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_tp.sh OUTDIR [bench args...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
# NVLink multicast stays off (NCCL's NVLS and PyTorch's symmetric memory): shared hosts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
nvidia-smi topo -m >> "$OUT/gpus.txt" 2>&1
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest tests/ops/test_collective.py tests/models/test_parallel.py tests/test_cli_generate.py -q \
    -p no:cacheprovider 2>&1 \
    | tee "$OUT/tests_tp.log" | tail -15
fi
if [ -z "${SKIP_ALLREDUCE:-}" ]; then     # the one-shot all-reduce against NCCL's, 8 KB to 16 MB (seconds)
  torchrun --nproc-per-node 2 scripts/bench_allreduce.py --json "$OUT/allreduce.json" 2>&1 \
    | grep -vE "^W1|^\*+$|OMP_NUM_THREADS" | tee "$OUT/allreduce.log"
fi
if [ -n "${TUNE_TP:-}" ]; then
  python3 scripts/tune_weight_only.py --chain --tp 2 --bits 4 --buckets 1 16 --models ${TUNE_TP_MODELS:-llama3-8b} \
    --budget-s "${TUNE_TP_BUDGET_S:-200}" 2>&1 | tee "$OUT/tune_tp.log" | grep -E "==>|failed|budget|wrote" | head -20
  cp src/qkernels/configs/*.json "$OUT/" 2>/dev/null
fi
torchrun --nproc-per-node 2 -m qkernels.cli bench runtime --tp 2 --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_tp.log"

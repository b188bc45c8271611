#!/usr/bin/env bash
# Tensor parallelism on a machine of two GPUs in one call: the TP tests over NCCL (tests/ops/test_collective.py,
# tests/models/test_parallel.py, the `generate --tp 2` CLI test), then `qkernels bench runtime --tp 2` under torchrun (TP=2 beside TP=1 in the same
# run; OUTDIR/<gpu>/tp.json). Usage: scripts/gpu_tp.sh OUTDIR [bench args, e.g. --models llama3-8b]
# SKIP_TESTS=1: the benchmark alone.
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
torchrun --nproc-per-node 2 -m qkernels.cli bench runtime --tp 2 --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_tp.log"

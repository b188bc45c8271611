#!/usr/bin/env bash
# Decode-size work on one GPU: the GEMM and weight-only GPU tests of the decode paths, the M <= 16 GEMM sweep (tile
# configs with K split against the 8-bit GEMV; decode chains, as the benchmark times them), the weight-only
# decode-chain sweep, then the decode-GEMV and host-cost benchmarks with the new tables. Times on an H100 with no
# compiled-kernel cache: tests 195 s (8 workers), GEMM sweep about 180 s (four kinds, in chains), weight-only sweep 120 s,
# `bench decode-gemv --models llama3-8b` and `bench host` 60 s together without the peers, the former over 300 s
# with gemlite (which compiles its kernels for every shape). So in 10 minutes: one job with
# SKIP_BENCH=1, then one with SKIP_TESTS=1 SKIP_TUNE=1 after putting its OUTDIR/<gpu>.json in src/qkernels/configs/.
# Usage: scripts/gpu_decode.sh OUTDIR
#   SKIP_TESTS=1 / SKIP_TUNE=1 / SKIP_BENCH=1 skip a step; TESTS (the GPU tests' files; the three decode ones by default); GEMM_KINDS ("int8 fp8 w8a8 w8a8-fp8": the GEMMs on
#   codes, then the W8A8 linears at M <= 16, the GEMVs quantizing x against quantize + the GEMM just tuned),
#   GEMM_BUCKETS ("16 1"; "32 64 128 256" for batched decode, GEMM_KINDS "int8 fp8"), GEMM_BUDGET_S; SKIP_GEMM=1
#   skips the GEMM sweep, SKIP_WO=1 the weight-only one;
#   WO_BUCKETS ("16"), WO_PATHS ("gvt": its candidates beside the table's current configs), WO_BUDGET_S (100),
#   WO_BITS ("4 8"), WO_MODELS ("llama3-8b": whose decode shapes; "llama3-8b qwen3-1.7b" for both): the weight-only
#   sweep (WO_BUCKETS="16 32" WO_PATHS="gvt mm wg tc" for batched decode, if the call has the time);
#   DECODE_MODELS ("llama3-8b"; "qwen3-1.7b" too), DECODE_SHAPES (NxK,...: all of the models' by default),
#   DECODE_MS (M,...: all of the bench's by default), PROVIDERS (names holding one of these, comma-separated; all by
#   default): the decode-GEMV rows measured, merged into the committed file;
#   SKIP_HOST=1 skips `bench host`; MARLIN=1 builds Marlin first (scripts/build_marlin.sh; carry .peers) and times it;
#   after the sweeps the table before and after them in the runtime's decode step (scripts/table_ab.py; AB_SCHEMES
#   "w4a16 w8a8", AB_MODELS "llama3-8b", AB_BATCHES "1 8 32", SKIP_AB=1 to skip: about 2 minutes a model): keep only
#   what the step confirms.
# Writes OUTDIR/decode.log (everything), OUTDIR/<gpu>.json (the config table after the sweeps) and
# OUTDIR/<gpu>/{decode_gemv,host}.json (benchmarks/results/<gpu>/'s, the new rows merged in).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_decode.sh OUTDIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
source scripts/_gpu_env.sh    # PYTHONPATH, the carried wheels, the compiled-kernel cache
LOG="$OUT/decode.log"
python3 -m qkernels.cli env 2>&1 | tee "$LOG"
SLUG=$(python3 -c 'import torch; from qkernels._runtime import gpu_slug, device_name
print(gpu_slug(device_name(torch.device("cuda"))))')
if [ -z "${SKIP_TESTS:-}" ]; then
  WORKERS=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TEST_WORKERS:-8}")
  # a kernel that never finishes (a barrier waited on forever) ends its test after 300 s instead of the whole call
  LIMIT=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 300 -o timeout_method=thread")
  python3 -m pytest ${TESTS:-tests/ops/test_gemm.py tests/ops/test_weight_only.py tests/bench/test_peers.py} -q \
    -p no:cacheprovider $WORKERS $LIMIT 2>&1 | tee -a "$LOG" | tail -8
fi
if [ -z "${SKIP_TUNE:-}" ]; then
  mkdir -p "$OUT/table_before" && cp "src/qkernels/configs/$SLUG.json" "$OUT/table_before/"
  echo "sweeping the decode configs first (minutes; SKIP_TUNE=1 benches the tables as they are)" | tee -a "$LOG"
  if [ -z "${SKIP_GEMM:-}" ]; then
    python3 scripts/tune_gemm.py --kinds ${GEMM_KINDS:-int8 fp8 w8a8 w8a8-fp8} --buckets ${GEMM_BUCKETS:-16 1} \
      --chain --budget-s "${GEMM_BUDGET_S:-1e9}" 2>&1 | tee -a "$LOG" | grep -E "==>|failed|budget" | head -40
  fi
  if [ -z "${SKIP_WO:-}" ]; then
    python3 scripts/tune_weight_only.py --chain --bits ${WO_BITS:-4 8} --buckets ${WO_BUCKETS:-16} \
      --paths ${WO_PATHS:-gvt} --models ${WO_MODELS:-llama3-8b} --budget-s "${WO_BUDGET_S:-100}" 2>&1 \
      | tee -a "$LOG" | grep -E "==>|failed|budget" | head -40
  fi
  cp "src/qkernels/configs/$SLUG.json" "$OUT/"
  if [ -z "${SKIP_AB:-}" ]; then
    # a chain times one shape's calls back to back; the decode step is what the table serves (docs/design/weight-only.md, "A
    # decode-chain sweep that misled"): both tables in the runtime's step, before anything is kept
    for model in ${AB_MODELS:-llama3-8b}; do
      python3 scripts/table_ab.py --table "$OUT/table_before" --table shipped --model "$model" \
        --schemes ${AB_SCHEMES:-w4a16 w8a8} --batches ${AB_BATCHES:-1 8 32} 2>&1 | tee -a "$LOG" | tail -8
    done
  fi
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  if [ -n "${MARLIN:-}" ]; then      # Marlin built from .peers/marlin (carried) as a peer of the decode-GEMV bench
    scripts/build_marlin.sh 2>&1 | tee -a "$LOG" | tail -3 && export PYTHONPATH="/tmp/qkernels_peers:$PYTHONPATH"
  fi
  # into the working tree's results, so the rows of the models named replace theirs and the others stay; one model
  # at a time, its file copied out after each, so that a call cut short keeps the models it finished
  mkdir -p "$OUT/$SLUG"
  for model in $(echo "${DECODE_MODELS:-llama3-8b}" | tr ',' ' '); do
    python3 -m qkernels.cli bench decode-gemv --models "$model" --shapes "${DECODE_SHAPES:-}" \
      --ms "${DECODE_MS:-}" --providers "${PROVIDERS:-}" --out benchmarks/results 2>&1 | tee -a "$LOG" \
      | grep -E "qkernels|marlin|wrote" | tail -60
    cp "benchmarks/results/$SLUG/decode_gemv.json" "$OUT/$SLUG/"
  done
  if [ -z "${SKIP_HOST:-}" ]; then
    python3 -m qkernels.cli bench host --out benchmarks/results 2>&1 | tee -a "$LOG" | tail -14
    cp "benchmarks/results/$SLUG/host.json" "$OUT/$SLUG/"
  fi
fi

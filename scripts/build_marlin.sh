#!/usr/bin/env bash
# Marlin (IST-DASLab/marlin: the FP16 x INT4 kernel that vLLM's GPTQ / AWQ Marlin kernels grew from), built from its
# public source as a benchmark peer, on the GPU machine at benchmark time: the source in .peers/marlin (ignored by
# git: `git archive` of a fetched copy, docs/benchmarks.md "Peers"), built for this GPU's architecture into
# $MARLIN_SITE (/tmp/qkernels_peers), which the caller puts on PYTHONPATH (bench/peers.py then times it); MARLIN_SRC
# names another source folder. It builds a copy of the source ($MARLIN_BUILD, /tmp/qkernels_marlin_build) whose weight
# copies lose their L2 cache hint (scripts/marlin_drop_cache_hint.py: with it, built by CUDA 13 for an H200, the kernel
# hit an illegal instruction at its first call); MARLIN_KEEP_CACHE_HINT=1 builds the source as it is.
# Usage: scripts/build_marlin.sh        (minutes: one CUDA file of many template instances)
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${MARLIN_SRC:-.peers/marlin}
SITE=${MARLIN_SITE:-/tmp/qkernels_peers}
BUILD=${MARLIN_BUILD:-/tmp/qkernels_marlin_build}
if [ ! -f "$SRC/setup.py" ]; then
  echo "build_marlin: expected Marlin's source (setup.py, marlin/) in $SRC, got none: put a copy there and carry it" >&2
  exit 2
fi
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "build_marlin: needs a CUDA GPU (its architecture picks the build) and nvcc, got no GPU" >&2
  exit 2
fi
rm -rf "$BUILD" && mkdir -p "$BUILD" && cp -r "$SRC"/. "$BUILD"/
if [ -z "${MARLIN_KEEP_CACHE_HINT:-}" ] && [ -f "$BUILD/marlin/marlin_cuda_kernel.cu" ]; then
  python3 scripts/marlin_drop_cache_hint.py "$BUILD/marlin/marlin_cuda_kernel.cu"
fi
ARCH=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
mkdir -p "$SITE"
(cd "$BUILD" && TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS=${MAX_JOBS:-16} \
  python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$SITE" . 2>&1 | tail -5)
# one call on the GPU before any benchmark imports it: a kernel that faults poisons its process's CUDA context, so a
# build that fails here is removed (the bench then lists Marlin as missing) instead of ending the benchmark's run
if ! PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 - <<'EOF'
import torch, marlin
layer = marlin.Layer(256, 256, groupsize=128).cuda()
out = layer(torch.randn(16, 256, dtype=torch.half, device="cuda"))
torch.cuda.synchronize()
print("marlin built for sm_%d%d:" % torch.cuda.get_device_capability(), marlin.__file__, "one call ran")
EOF
then
  echo "build_marlin: the built kernel failed its first call on this GPU; removed from $SITE" >&2
  rm -rf "$SITE"/marlin*
  exit 3
fi

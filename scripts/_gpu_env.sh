# Sourced by the gpu_*.sh scripts (after `OUT=...; mkdir -p "$OUT"; cd` to the repository root): the source tree on
# PYTHONPATH; the peers' wheels installed when .whl/ holds them (README); and a compiled-kernel cache kept between
# jobs on machines that start empty. Triton compiles every kernel variant a job runs (most of a GPU test run's time);
# with .kernel_cache.txz in the repository root (ignored by git; the OUT/kernel_cache.txz of an earlier job on the
# same Triton and GPU architecture) those variants load instead. On exit the cache's binaries, launchers and metadata
# (not the intermediate IR) go to OUT/kernel_cache.txz, unless that would pass KERNEL_CACHE_MAX_MB (15). A stale
# entry costs nothing: Triton keys each entry by the kernel's source, options and versions, compiles what it lacks.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-deps --no-index .whl/*.whl 2>&1 | grep -v "^WARNING: Running pip as" | tail -2
fi
# a fixed absolute path: Triton's cache index records its files by absolute path
export TRITON_CACHE_DIR=/tmp/qkernels_kernel_cache
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .kernel_cache.txz ]; then
  tar xJf .kernel_cache.txz -C "$TRITON_CACHE_DIR" \
    && echo "kernel cache: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) binaries restored"
fi
_save_kernel_cache() {
  local archive="$OUT/kernel_cache.txz"
  (cd "$TRITON_CACHE_DIR" && find . -type f \( -name '*.cubin' -o -name '*.json' -o -name '*.hsaco' -o -name '*.so' \) \
    -print0 | XZ_OPT="-T0 -6" tar cJf "$archive" --null -T -) 2>/dev/null
  if [ -f "$archive" ] && [ "$(du -m "$archive" | cut -f1)" -gt "${KERNEL_CACHE_MAX_MB:-15}" ]; then
    echo "kernel cache: $(du -m "$archive" | cut -f1) MB is over ${KERNEL_CACHE_MAX_MB:-15} MB, not kept" && rm -f "$archive"
  fi
}
trap _save_kernel_cache EXIT

"""Drop the L2 cache hint from Marlin's weight copies in a copy of its source (scripts/build_marlin.sh runs this).

Marlin's cp_async4_stream issues `createpolicy.fractional.L2::evict_first` and
`cp.async.cg.shared.global.L2::cache_hint`; built by CUDA 13 for an H200 the kernel stopped at its first call with
"an illegal instruction was encountered", as IST-DASLab/marlin issues #30 and #40 report for newer toolchains. Their
workaround: the same cp.async.cg copy without the eviction policy. A source without the hint is left as it is.

  python3 scripts/marlin_drop_cache_hint.py PATH/marlin/marlin_cuda_kernel.cu
"""
from __future__ import annotations

import re
import sys

POLICY = re.compile(r'[ \t]*"\s*createpolicy\.fractional\.L2::evict_first\.b64 p, 1\.0;"[ \t]*\n?')
HINTED = re.compile(r"cp\.async\.cg\.shared\.global\.L2::cache_hint \[%0\], \[%1\], %2, p;")


def drop_cache_hint(text: str) -> tuple[str, bool]:
    """(the source without the hint, whether it had one)."""
    if not (POLICY.search(text) and HINTED.search(text)):
        return text, False
    return HINTED.sub("cp.async.cg.shared.global [%0], [%1], %2;", POLICY.sub("", text)), True


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: marlin_drop_cache_hint.py PATH/marlin/marlin_cuda_kernel.cu", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        text, had = drop_cache_hint(f.read())
    if had:
        with open(argv[0], "w") as f:
            f.write(text)
    print("build_marlin: " + ("the weight copies' L2 cache hint dropped (IST-DASLab/marlin #30, #40)" if had else
                              "no L2 cache hint in the weight copies; the source built as it is"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

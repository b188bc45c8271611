"""scripts/sass_count.py (offline sm_90 compile, SASS of the decode kernels' loops) still builds each case: the
kernels' signatures it names follow theirs, and the Gluon kernels (no interpreter twin) still compile on a CPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
triton = pytest.importorskip("triton")
NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"


@pytest.mark.skipif(not NVDISASM.exists(), reason="Triton's CUDA tools are not installed")
@pytest.mark.parametrize("case", ["gemv8-fp8", "gemv8-fp8-quant", "w4a16-gemv", "w4a16-gv", "w4a16-gvt", "w4a16-wg",
                                  "w8a8-gvt", "w8a8-gvt-fp8"])
def test_sass_count_counts_each_decode_loop(case):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)       # a real compile, not the interpreter
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_count.py"), case], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"{case}: loop ") and " per byte; " in first, run.stdout
    per_byte = float(first.split(" -> ")[1].split()[0])
    assert 0.5 < per_byte < 100, first          # a loop was found and counted

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
@pytest.mark.parametrize("case", ["gemv8-fp8", "gemv8-fp8-quant", "w4a16-gemv", "w4a16-gv", "w4a16-gv-wpt2",
                                  "w4a16-gv-wpt2-intz", "w4a16-gvp", "w4a16-gvt", "w4a16-wg", "w4a16-wg-128",
                                  "w4a16-wg-swiglu", "w4a16-wg-tail",
                                  "w4a16-wg-ws", "w4a16-gvt-ring",
                                  "w8a8-gvt", "w8a8-gvt-fp8", "w4a8-wg-cpg2"])
def test_sass_count_counts_each_decode_loop(case):
    """Each case compiles, its loop is found and counted, and nothing spills (the wg tail's fix-up once made ptxas
    spill in the main loop)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)       # a real compile, not the interpreter
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_count.py"), case], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first = run.stdout.splitlines()[0]
    assert first.startswith(f"{case}: loop ") and " per byte; " in first, run.stdout
    per_byte = float(first.split(" -> ")[1].split()[0])
    assert 0.5 < per_byte < 100, first          # a loop was found and counted
    assert "spills" not in run.stdout, run.stdout


@pytest.mark.skipif(not NVDISASM.exists(), reason="Triton's CUDA tools are not installed")
def test_sass_count_caps_registers():
    """--maxnreg: the compile holds the cap, and the spills it costs are counted."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_count.py"), "w4a16-gvt", "--maxnreg", "64",
                          "--top", "0"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    first, second = run.stdout.splitlines()[:2]
    assert first.endswith("64 registers per thread") and second.strip().startswith("local-memory"), run.stdout

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
                                  "w4a16-gv-wpt2-intz", "w4a16-gvp", "w4a16-gvt", "w4a16-wg", "w4a16-wg-swiglu",
                                  "w4a16-wg-tail",
                                  "w4a16-wg-ws", "w4a16-gvt-ring",
                                  "w8a8-gvt", "w8a8-gvt-fp8"])
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


@pytest.mark.skipif(not NVDISASM.exists(), reason="Triton's CUDA tools are not installed")
def test_probe_tma_stream_kernel_compiles_for_hopper():
    """scripts/probe_tma_stream.py's kernel (Hopper only, no interpreter) still builds offline for sm_90, streaming
    through TMA (cp.async.bulk.tensor) with and without its shared-memory consumer."""
    code = """
import sys, triton
sys.path.insert(0, sys.argv[1])
import probe_tma_stream as P
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
wl = "NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)"
types = dict(w_desc=f"tensordesc<u8[64,256],{wl}>", out_ptr="*i32", n_tiles="i32", n_cols="i32")
k = P._stream_kernel
for consume, work in ((False, 0), (True, 2)):
    sig = {n: types.get(n, "constexpr") for n in k.arg_names}
    c = triton.compile(GluonASTSource(k, sig, dict(STAGES=4, CONSUME=consume, WORK=work), {}),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1))
    print(consume, "cp.async.bulk.tensor" in c.asm["ptx"], c.metadata.shared)
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / "scripts")], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.split()
    assert lines[1] == "True" and lines[4] == "True", run.stdout       # TMA copies in both builds
    assert int(lines[2]) >= 4 * 64 * 256, run.stdout                    # the ring's 4 stages of 16 KB

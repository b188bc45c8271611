"""qkernels export-c: the C API around AOT-compiled kernels. On any machine the export compiles and its C
sources build; on a GPU the example program runs and its outputs carry the Python ops' bits."""
import os
import shutil
import subprocess
import sys

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import qkernels as qk

from .conftest import DEVICE

# the kernel-library guide where it was given to the project (not in the repository): its C snippet is built when
# the guide is beside the checkout
GUIDE = Path(__file__).resolve().parents[2] / "shared" / "guides" / "cuda-quantization-kernels.md"


def _export(out, gpu: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # real kernels, compiled for `gpu`
    done = subprocess.run([sys.executable, "-m", "qkernels.cli", "export-c", str(out), "--gpu", gpu], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_export_writes_a_c_api_that_compiles(tmp_path):
    _export(tmp_path, "sm_80")
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"qkernels.h", "qkernels.c", "example.c", "Makefile", "cuda_kernels.h"}
    header = (tmp_path / "qkernels.h").read_text()
    for fn in ("qk_quantize_int8_rows", "qk_int8_matmul", "qk_w4a16_gemv"):
        assert f"CUresult {fn}(CUstream stream" in header
    guide = (tmp_path / "cuda_kernels.h").read_text()        # the kernel-library guide's C entry point
    assert ("CUresult int8_matmul_cuda(const int8_t *A, const int8_t *B, int32_t *C, int M, int N, int K, float "
            "scale_a,\n                          float scale_b, float scale_c, cudaStream_t stream);") in guide
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    from qkernels.export_c import cuda_include
    done = subprocess.run(["gcc", "-fsyntax-only", "-Wall", f"-I{cuda_include()}", f"-I{tmp_path}",
                           str(tmp_path / "qkernels.c"), str(tmp_path / "example.c")], capture_output=True, text=True)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    # the guide's C snippet as it is written (C++: its includes, then its statements in a function that declares the
    # host buffers and sizes it uses) builds against the header, with the CUDA runtime's headers Triton ships
    if not GUIDE.is_file():
        pytest.skip("the kernel-library guide is not beside this checkout (../shared/guides/)")
    snippet = re.findall(r"```cpp\n(.*?)```", GUIDE.read_text(), flags=re.S)[0]
    lines = snippet.splitlines()
    includes = [ln for ln in lines if ln.startswith("#include")]
    body = [ln for ln in lines if not ln.startswith("#include")]
    cpp = tmp_path / "guide_snippet.cpp"
    cpp.write_text("\n".join(includes) + "\nvoid guide(int M, int N, int K, int8_t *h_A, int8_t *h_B, int32_t *h_C) {\n"
                   + "\n".join(body) + "\n}\n")
    if shutil.which("g++") is None:
        pytest.skip("no C++ compiler here")
    done = subprocess.run(["g++", "-fsyntax-only", "-Wall", f"-I{cuda_include()}", f"-I{tmp_path}", str(cpp)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


def test_export_refuses_bad_arguments():
    from qkernels.export_c import export_c
    with pytest.raises(ValueError, match=r"ops must be a non-empty subset of .*got \['gemm'\]"):
        export_c("/nonexistent", ("gemm",))
    with pytest.raises(ValueError, match=r"gpu must name an architecture sm_80 or newer .*got 'sm_75'"):
        export_c("/nonexistent", ("quantize",), "sm_75")


@pytest.mark.gpu
def test_exported_example_gives_the_python_ops_bits(tmp_path):
    """The example (C, driver API) runs every exported op on inputs written here; its outputs equal the Python ops'
    bit for bit (the GEMV through the same config), and it reports its host cost per launch."""
    from qkernels.export_c import W4A16_GEMV
    from qkernels.ops.weight_only import dispatch
    major, minor = torch.cuda.get_device_capability()
    _export(tmp_path, f"sm_{major}{minor}")
    subprocess.run(["make", "-C", str(tmp_path)], check=True, capture_output=True, timeout=600)
    M, K, N = 3, 33 * 128, 1000            # K not a multiple of the GEMV's 2048-step, N not of its 8 rows
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    a = torch.randint(-128, 128, (M, K), device=DEVICE, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), device=DEVICE, dtype=torch.int8)
    pw = qk.PackedWeight.from_float(torch.randn(N, K, device=DEVICE, dtype=torch.float16), 4, 128)
    (tmp_path / "dims.txt").write_text(f"{M} {K} {N}\n")
    b_kn = torch.randint(-128, 128, (K, N), device=DEVICE, dtype=torch.int8)      # the guide's B [K, N]
    for name, t in (("x", x), ("a", a), ("w", w), ("qweight", pw.qweight), ("scale_zero", pw.scale_zero),
                    ("b_kn", b_kn)):
        t.contiguous().cpu().view(torch.uint8).numpy().tofile(tmp_path / f"{name}.bin")
    done = subprocess.run([str(tmp_path / "example"), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr

    def out(name, dtype, shape):
        raw = np.fromfile(tmp_path / f"{name}.out", dtype=np.uint8)
        return torch.from_numpy(raw).view(dtype).reshape(shape)

    q = qk.quantize(x, "int8", "row")
    assert torch.equal(out("codes", torch.int8, (M, K)), q.data.cpu())
    assert torch.equal(out("scales", torch.float32, (M,)), q.scale.reshape(-1).cpu())
    assert torch.equal(out("c", torch.int32, (M, N)), qk.int8_matmul(a, w.t()).cpu())
    assert torch.equal(out("c_guide", torch.int32, (M, N)), (a.cpu().long() @ b_kn.cpu().long()).int())
    with dispatch.use_config(W4A16_GEMV):
        y = qk.w4a16_linear(x, pw)
    assert torch.equal(out("y", torch.float16, (M, N)), y.cpu())
    host = float(done.stdout.split("host_us_per_launch")[1])
    from qkernels.bench.harness import host_us
    with dispatch.use_config(W4A16_GEMV):
        eager = host_us(lambda: qk.w4a16_linear(x, pw))
    print(f"\nhost cost per w4a16 GEMV call: C API {host:.2f} us, Python eager {eager:.2f} us")
    assert 0 < host < 1000


"""qkernels.cuda_wrapper: the kernel-library guide's Python interface (docs/guide/index.md). Every Python snippet of
the guide, read where it was given to the project (../shared/guides/ beside the checkout; these tests skip where it
is not), runs as written with only its import changed to qkernels.cuda_wrapper (on a machine without CUDA: the device
swapped to the CPU and the sizes shrunk for the interpreter), and the math the guide claims is checked on what it
computed. The wrapper's own behaviour (exact integer products, the INT4 layout, its errors) is tested without the
guide's file."""
import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from qkernels import cuda_wrapper as cw
from tests.conftest import ON_GPU

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT.parent / "shared" / "guides" / "cuda-quantization-kernels.md"     # the guide as given, not in the repo
needs_guide = pytest.mark.skipif(not GUIDE.is_file(), reason="the kernel-library guide is not beside this checkout "
                                 "(../shared/guides/cuda-quantization-kernels.md)")
# the interpreter's sizes for the guide's (M, K, N) triples and loop counts
SMALL = {"1024, 2048, 512": "24, 40, 16", "2048, 4096, 1024": "16, 72, 8", "iterations=100": "iterations=2",
         "range(10)": "range(1)"}


def snippets(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def run_snippet(code: str, ns: dict | None = None) -> tuple[dict, str]:
    """Exec a guide snippet as a user would run it against qkernels: the import changed, and on a machine without
    CUDA the device is the CPU, the sizes small, and the CUDA synchronizations no-ops."""
    code = code.replace("from cuda_wrapper import", "from qkernels.cuda_wrapper import")
    if not ON_GPU:
        code = code.replace('torch.device("cuda")', 'torch.device("cpu")')
        code = code.replace("assert torch.cuda.is_available()", "assert torch.device('cpu')")
        code = code.replace("torch.cuda.synchronize()", "pass")
        for big, small in SMALL.items():
            code = code.replace(big, small)
    ns = {} if ns is None else ns
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(code, str(GUIDE), "exec"), ns)
    return ns, out.getvalue()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


@needs_guide
def test_the_guide_has_the_snippets_tested_here():
    assert len(snippets("python")) == 3 and len(snippets("cpp")) == 1


def test_the_guide_is_not_copied_into_the_project():
    assert not (ROOT / "docs" / "guide" / "cuda-quantization-kernels.md").exists()


@needs_guide
def test_guide_python_interface_snippet():
    """Quantize two matrices, int8_matmul, dequantize with scale_a * scale_b: C_int32 is the exact integer product
    and C_fp32 ≈ A @ B (per-tensor int8 on both: ~1% relative error)."""
    ns, _ = run_snippet(snippets("python")[0])
    a, b = ns["A_int8"], ns["B_int8"]
    assert ns["C_int32"].dtype == torch.int32
    assert torch.equal(ns["C_int32"].cpu().long(), a.cpu().long() @ b.cpu().long())
    assert ns["C_fp32"].dtype == torch.float32
    assert rel_err(ns["C_fp32"], ns["A"] @ ns["B"]) < 3e-2


@needs_guide
def test_guide_benchmark_snippet():
    """The benchmark script runs both of its calls and prints a time and a GFLOPS figure for each."""
    _, out = run_snippet(snippets("python")[1])
    lines = [ln for ln in out.splitlines() if ln.startswith("M=")]
    assert len(lines) == 2, out
    assert all(re.search(r"\d+\.\d{3} ms, \d+\.\d{2} GFLOPS$", ln) for ln in lines), out


@needs_guide
@pytest.mark.parametrize("in_f, out_f", [(48, 16), (40, 24)])
def test_guide_quantized_linear_snippet(in_f, out_f):
    """The guide's QuantizedLinear: its float path before quantize_weights, and after it a layer within int8
    quantization error of its float linear (x @ W.T + b), the weight [out, in] taken as the linear's."""
    ns, _ = run_snippet(snippets("python")[2])
    dev = torch.device("cuda" if ON_GPU else "cpu")
    layer = ns["QuantizedLinear"](in_f, out_f).to(dev)
    with torch.no_grad():
        layer.bias.normal_()
        x = torch.randn(8, in_f, device=dev)
        want = torch.nn.functional.linear(x, layer.weight, layer.bias)
        assert torch.equal(layer(x), want)
        layer.quantize_weights()
        assert layer.weight_int8.dtype == torch.int8 and layer.weight_int8.shape == (out_f, in_f)
        got = layer(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert rel_err(got, want) < 3e-2


def test_int8_matmul_is_the_exact_product_either_layout(device):
    M, K, N = 9, 70, 13
    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (K, N), dtype=torch.int8, device=device)
    want = a.cpu().long() @ b.cpu().long()
    assert torch.equal(cw.int8_matmul(a, b).cpu().long(), want)
    assert torch.equal(cw.int8_matmul(a, b.t().contiguous(), 0.5, torch.tensor(2.0)).cpu().long(), want)  # [N, K]
    # scale_c: rounded half to even, saturated to int32
    assert torch.equal(cw.int8_matmul(a, b, scale_c=0.25).cpu(), torch.round(want.double() * 0.25).to(torch.int32))
    big = torch.full((1, 8192), -128, dtype=torch.int8, device=device)
    assert int(cw.int8_matmul(big, big.t(), scale_c=1e3)[0, 0]) == cw.INT32_MAX


@pytest.mark.parametrize("K", [1, 31, 64])
def test_int4_pack_and_matmul_in_the_guides_layout(device, K):
    """A packed along rows, B along columns, lower nibble first, ceil(K / 2) bytes (odd K padded): pack / unpack
    round-trip and int4_matmul is the exact product, whatever B's padding nibble holds."""
    M, N = 5, 7
    qa = torch.randint(-8, 8, (M, K), dtype=torch.int8, device=device)
    qb = torch.randint(-8, 8, (K, N), dtype=torch.int8, device=device)
    ap, bp = cw.pack_int4(qa), cw.pack_int4(qb, dim=0)
    assert ap.shape == (M, (K + 1) // 2) and bp.shape == ((K + 1) // 2, N) and ap.dtype == torch.uint8
    assert int(ap[0, 0]) == (int(qa[0, 0]) & 0xF) | ((int(qa[0, 1]) & 0xF) << 4 if K > 1 else 0)
    assert torch.equal(cw.unpack_int4(ap, K), qa) and torch.equal(cw.unpack_int4(bp, K, dim=0), qb)
    if K % 2:
        bp[-1] |= 0x70          # garbage in B's padding nibbles
    want = qa.cpu().long() @ qb.cpu().long()
    assert torch.equal(cw.int4_matmul(ap, bp, K).cpu().long(), want)


def test_quantize_tensor_int4_odd_k(device):
    x = torch.randn(6, 33, device=device)
    packed, scale = cw.quantize_tensor_int4(x)
    assert packed.shape == (6, 17) and scale.dim() == 0
    q = cw.unpack_int4(packed, 33)
    assert int(q.abs().max()) == 7 and torch.allclose(scale, x.abs().max() / 7)
    assert float((q.float() * scale - x).abs().max()) <= float(scale) / 2 * (1 + 1e-6)
    assert int(cw.unpack_int4(packed, 34)[:, -1].abs().max()) == 0       # the padding nibble is a zero code


def test_dequantize_tensor_takes_int8_codes_and_int32_products(device):
    q = torch.randint(-128, 128, (4, 8), dtype=torch.int8, device=device)
    assert torch.equal(cw.dequantize_tensor(q, 0.5), q.float() * 0.5)
    c = torch.randint(-2 ** 30, 2 ** 30, (4, 8), dtype=torch.int32, device=device)
    assert torch.equal(cw.dequantize_tensor(c, torch.tensor(0.25, device=device)), c.float() * 0.25)


def test_bad_inputs_name_the_argument(device):
    a = torch.zeros(4, 8, dtype=torch.int8, device=device)
    with pytest.raises(ValueError, match=r"B must be \[K, N\] \(or an nn.Linear weight \[N, K\]\) with K = 8"):
        cw.int8_matmul(a, torch.zeros(5, 6, dtype=torch.int8, device=device))
    with pytest.raises(TypeError, match="B must have dtype"):
        cw.int8_matmul(a, torch.zeros(8, 6, device=device))
    with pytest.raises(ValueError, match="scale_b must be finite and > 0, got -1.0"):
        cw.int8_matmul(a, a.t(), 1.0, -1.0)
    with pytest.raises(ValueError, match="scale_a must be a number or a one-element tensor, got shape"):
        cw.int8_matmul(a, a.t(), torch.ones(2))
    with pytest.raises(ValueError, match=r"q must hold int4 values in \[-8, 7\], got values in \[0, 9\]"):
        cw.pack_int4(torch.tensor([[0, 9]], dtype=torch.int8, device=device))
    with pytest.raises(ValueError, match=r"A_packed must be \[M, ceil\(K / 2\) = 2\] and B_packed \[2, N\] for K = 3"):
        cw.int4_matmul(torch.zeros(2, 3, dtype=torch.uint8, device=device),
                       torch.zeros(2, 4, dtype=torch.uint8, device=device), 3)
    with pytest.raises(ValueError, match=r"k must be an int with ceil\(k / 2\)"):
        cw.unpack_int4(torch.zeros(2, 3, dtype=torch.uint8, device=device), 8)

"""W4A16 / W8A16 linears vs qkernels.reference.weight_only_linear (fp32 matmul with the dequantized
weight). Each of the three paths (gemv, mm, dequant+cuBLAS) is forced at every M tested, besides
the M-dispatched default."""
import contextlib
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qkernels as qk
from qkernels import _runtime
from qkernels import reference as ref
from qkernels.ops import weight_only as WO

from ..conftest import DEVICE, ON_GPU
from ..helpers import assert_bit_exact, graph_replay, rel_err, shipped_table_entries, table_entry_case

gpu = pytest.mark.gpu
PATHS = [p for p in WO.PATHS if ON_GPU or p.split("-")[0] not in WO.SUPPORTED]   # tc, wg: Gluon, no interpreter
# fp32 accumulation, weights rounded to x's dtype once ((u - z) * s), output rounded once: a few units
# of the dtype's epsilon, relative to |x| @ |W|.T
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def _weight(N, K, bits=4, group_size=128, symmetric=False, dtype=torch.float16):
    w = torch.randn(N, K, device=DEVICE, dtype=torch.float32)
    return qk.PackedWeight.from_float(w, bits, group_size, symmetric, scale_dtype=dtype)


def _ref(x, pw, bias=None):
    want = ref.weight_only_linear(x, pw.qweight, pw.scales, pw.zeros, pw.bits, pw.group_size, pw.perm, bias)
    # |x| @ |W|.T (+ |bias|): the scale of the rounding error of a dot product, robust to cancellation
    mag = x.reshape(-1, x.shape[-1]).abs().float() @ pw.dequantize().abs().t()
    if bias is not None:
        mag = mag + bias.abs().float()
    return want, mag.reshape(want.shape)


def _run(x, pw, bias=None, path=None):
    """The op with outputs poisoned, on `path` (WO.force_path) or the path the table picks (None)."""
    with qk.poison_outputs(), WO.force_path(path) if path else contextlib.nullcontext():
        return WO._weight_only(x, pw, bias, pw.bits, "test")


def _check(got, want_mag, dtype):
    want, mag = want_mag
    assert got.dtype == want.dtype and got.shape == want.shape
    assert not torch.isnan(got).any(), "unwritten (poisoned) or NaN outputs"
    err = ((got.double() - want.double()).norm() / mag.double().norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], f"error {err:.3g} (relative to |x| @ |W|.T) above {TOL[dtype]}"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bits", [4, 8])
def test_float_and_integer_zero_points(bits, path):
    """Integer zero points in [0, 2**bits] let the kernels fold their magic number into the zero point
    (PackedWeight.int_zeros); float ones (HQQ) and out-of-range ones must not take that shortcut."""
    N, K, M = 40, 256, 3
    q = torch.randint(0, 2 ** bits, (N, K), device=DEVICE, dtype=torch.uint8)
    s = torch.rand(N, 2, device=DEVICE, dtype=torch.float16) / 8 + 0.01
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    top = 2 ** bits
    for z, want_int in ((torch.randint(0, top + 1, (N, 2), device=DEVICE).half(), True),
                        (torch.rand(N, 2, device=DEVICE, dtype=torch.float16) * (top - 1), False),
                        (torch.full((N, 2), top + 3.0, device=DEVICE, dtype=torch.float16), False)):
        pw = qk.PackedWeight.from_int(q, s, z, bits=bits, group_size=128)
        assert pw.int_zeros == want_int
        _check(_run(x, pw, path=path), _ref(x, pw), torch.float16)
    assert qk.PackedWeight.from_int(q.to(torch.int8) - top // 2, s, None, bits=bits, group_size=128).int_zeros


def test_quantized_linear_loads_decide_integer_zeros():
    """A QuantizedLinear takes int_zeros from what it loads: float zero points loaded into a layer built with
    integer ones must turn the kernels' integer shortcut off (else a silently wrong result)."""
    lin = torch.nn.Linear(128, 48, bias=False, device=DEVICE, dtype=torch.float16)
    x = torch.randn(5, 128, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin, "w4a16", group_size=64)
    assert ql.int_zeros and ql.packed_weight().int_zeros
    ql(x)                                                    # builds and caches the PackedWeight view
    sd = ql.state_dict()
    sd["scale_zero"] = sd["scale_zero"].clone()
    sd["scale_zero"][..., 1] += 0.3                          # float zero points, in place of integer ones
    ql.load_state_dict(sd)
    pw = ql.packed_weight()
    assert not ql.int_zeros and not pw.int_zeros
    _check(ql(x), _ref(x, pw), torch.float16)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (4, 64, True), (4, 128, False),
                                                        (4, -1, True), (8, -1, True), (8, 64, False)])
@pytest.mark.parametrize("M", [1, 2, 17])
def test_paths_vs_reference(M, bits, group_size, symmetric, path):
    N, K = 37, 256
    pw = _weight(N, K, bits, group_size, symmetric)
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    _check(_run(x, pw, path=path), _ref(x, pw), torch.float16)


@pytest.mark.parametrize("M", [1, 2, 3, 7, 15, 16, 17, 33, 64, 65, 129])
def test_m_sweep_dispatch(M):
    """M-dispatched default path, odd N, bias."""
    pw = _weight(45, 128, 4, 64, False)
    x = torch.randn(M, 128, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(45, device=DEVICE, dtype=torch.float16)
    _check(qk.w4a16_linear(x, pw, bias), _ref(x, pw, bias), torch.float16)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dtypes_and_bias(dtype, path):
    pw = _weight(40, 128, 4, 32, False, dtype=dtype)
    x = torch.randn(5, 128, device=DEVICE, dtype=dtype)
    for bias in (torch.randn(40, device=DEVICE, dtype=dtype), torch.randn(40, device=DEVICE)):
        y = _run(x, pw, bias, path)
        assert y.dtype == dtype
        _check(y, _ref(x, pw, bias), dtype)


@pytest.mark.parametrize("path", PATHS)
def test_k_not_multiple_of_block(path):
    """Per-channel weights with K not a multiple of any BLOCK_K: the masked K tail."""
    for bits in (4, 8):
        pw = _weight(24, 72, bits, -1, bits == 8)
        x = torch.randn(3, 72, device=DEVICE, dtype=torch.float16)
        _check(_run(x, pw, path=path), _ref(x, pw), torch.float16)


def test_views_and_3d():
    pw = _weight(32, 128, 4, 128, True)
    x3 = torch.randn(2, 3, 128, device=DEVICE, dtype=torch.float16)
    y = qk.w4a16_linear(x3, pw)
    assert y.shape == (2, 3, 32)
    _check(y, _ref(x3, pw), torch.float16)
    wide = torch.randn(4, 256, device=DEVICE, dtype=torch.float16)
    _check(qk.w4a16_linear(wide[:, ::2], pw), _ref(wide[:, ::2], pw), torch.float16)    # strided columns
    xt = torch.randn(128, 5, device=DEVICE, dtype=torch.float16).t()                     # column-major
    _check(qk.w4a16_linear(xt, pw), _ref(xt, pw), torch.float16)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bits", [4, 8])
def test_identity_is_exact(bits, path):
    """x @ I through the quantized path: codes 1 on the diagonal, scale 1, so y == x exactly."""
    K = 64
    q = torch.eye(K, dtype=torch.int8, device=DEVICE)
    pw = qk.PackedWeight.from_int(q, torch.ones(K, K // 32, device=DEVICE, dtype=torch.float16), bits=bits,
                                  group_size=32)
    x = torch.randn(9, K, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(_run(x, pw, path=path), x, "x @ I")


@pytest.mark.parametrize("path", PATHS)
def test_act_order(path):
    """GPTQ act-order: a permuted g_idx; x is gathered by the permutation."""
    N, K, G = 20, 128, 32
    q = torch.randint(0, 16, (N, K), device=DEVICE, dtype=torch.uint8)
    s = torch.rand(N, K // G, device=DEVICE).half() + 0.01
    z = torch.randint(0, 16, (N, K // G), device=DEVICE).half()
    g_idx = torch.randperm(K, device=DEVICE) // G
    pw = qk.PackedWeight.from_int(q, s, z, bits=4, group_size=G, g_idx=g_idx)
    assert pw.perm is not None
    x = torch.randn(3, K, device=DEVICE, dtype=torch.float16)
    w = (q.float() - z.float()[:, g_idx]) * s.float()[:, g_idx]       # the documented formula
    _check(_run(x, pw, path=path), ((x.float() @ w.t()).half(), x.abs().float() @ w.abs().t()), torch.float16)


def test_empty():
    pw = _weight(16, 64, 4, 32, False)
    with qk.poison_outputs():
        y = qk.w4a16_linear(torch.randn(0, 64, device=DEVICE, dtype=torch.float16), pw)
    assert y.shape == (0, 16)
    y = qk.w4a16_linear(torch.randn(2, 0, 64, device=DEVICE, dtype=torch.float16), pw)
    assert y.shape == (2, 0, 16)
    pw0 = qk.PackedWeight.from_int(torch.zeros(8, 0, dtype=torch.int8, device=DEVICE),
                                   torch.ones(8, 1, device=DEVICE, dtype=torch.float16), bits=4, group_size=-1)
    bias = torch.randn(8, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(qk.w4a16_linear(torch.randn(3, 0, device=DEVICE, dtype=torch.float16), pw0, bias),
                     bias.expand(3, 8))


def _bad_cases():
    pw4 = lambda: _weight(40, 64, 4, 32, False)   # noqa: E731
    x = lambda dt=torch.float16, k=64: torch.randn(3, k, device=DEVICE, dtype=dt)   # noqa: E731
    return [
        (lambda: qk.w4a16_linear(x(torch.float32), pw4()), TypeError, r"x must have dtype in \(float16, bfloat16\), got float32"),
        (lambda: qk.w4a16_linear(x(k=96), pw4()), ValueError, r"x's last dim must be the weight's in_features K=64, got x.shape=\(3, 96\)"),
        (lambda: qk.w4a16_linear(x(), torch.zeros(40, 32, dtype=torch.uint8)), TypeError, r"w_packed must be a qkernels.PackedWeight"),
        (lambda: qk.w8a16_linear(x(), pw4()), ValueError, r"w8a16_linear needs a 8-bit PackedWeight, got bits=4"),
        (lambda: qk.w4a16_linear(x(), pw4(), torch.ones(41, device=DEVICE)), ValueError, r"bias must have shape \(40,\), got \(41,\)"),
        (lambda: qk.PackedWeight.from_float(torch.randn(8, 100), 4, 64), ValueError, r"K=100 .* must be a multiple of group_size=64"),
        (lambda: qk.PackedWeight.from_float(torch.randn(8, 96), 4, 48), ValueError, r"group_size must be a power of two >= 32, or -1"),
        (lambda: qk.PackedWeight.from_float(torch.randn(8, 63), 4, -1), ValueError, r"K=63 must be even for 4-bit"),
        (lambda: qk.PackedWeight.from_float(torch.randn(8, 64), 3), ValueError, r"bits must be 4 or 8, got 3"),
        (lambda: qk.PackedWeight.from_int(torch.full((8, 64), 9), torch.ones(8, 2), bits=4, group_size=32), ValueError,
         r"q must hold signed \(symmetric, zeros=None\) 4-bit values in \[-8, 7\], got values in \[9, 9\]"),
        (lambda: qk.PackedWeight.from_int(torch.zeros(8, 64, dtype=torch.int8), torch.ones(8, 3), bits=4, group_size=32),
         ValueError, r"scales must have shape \(8, 2\)"),
        (lambda: qk.PackedWeight.from_int(torch.zeros(8, 64, dtype=torch.uint8), torch.ones(8, 2), torch.zeros(8, 2),
                                          bits=4, group_size=32, g_idx=torch.zeros(64, dtype=torch.int32)),
         ValueError, r"g_idx must assign exactly group_size=32 input channels to each of the 2 groups"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_cases())))
def test_bad_inputs(case):
    call, exc, match = _bad_cases()[case]
    with pytest.raises(exc, match=match):
        call()


@gpu
def test_mixed_devices():
    pw = _weight(16, 64, 4, 32)
    with pytest.raises(RuntimeError, match=r"w_packed must be on the same device as x"):
        qk.w4a16_linear(torch.randn(2, 64, dtype=torch.float16, device=DEVICE), pw.to("cpu"))


def test_cpu_without_interpreter_message():
    if ON_GPU:
        pw = _weight(16, 64, 4, 32).to("cpu")
        with pytest.raises(RuntimeError, match=r"x must be on a CUDA device, got cpu"):
            qk.w4a16_linear(torch.randn(2, 64, dtype=torch.float16), pw)
    else:
        assert qk._runtime.is_interpreter()


@given(m=st.integers(1, 40), n=st.integers(1, 50), groups=st.integers(1, 4), bits=st.sampled_from([4, 8]),
       group_size=st.sampled_from([32, 64, 128, -1]), symmetric=st.booleans(),
       dtype=st.sampled_from([torch.float16, torch.bfloat16]), scale=st.sampled_from([1e-3, 1.0, 30.0]))
def test_property_vs_reference(m, n, groups, bits, group_size, symmetric, dtype, scale):
    K = groups * (group_size if group_size > 0 else 48)
    w = torch.randn(n, K, device=DEVICE) * scale
    pw = qk.PackedWeight.from_float(w, bits, group_size, symmetric, scale_dtype=dtype)
    x = torch.randn(m, K, device=DEVICE, dtype=dtype)
    f = qk.w4a16_linear if bits == 4 else qk.w8a16_linear
    _check(f(x, pw), _ref(x, pw), dtype)


def test_opcheck():
    pw = _weight(24, 64, 4, 32, False)
    x = torch.randn(5, 64, device=DEVICE, dtype=torch.float16)
    b = torch.randn(24, device=DEVICE, dtype=torch.float16)
    for path in (None, "gemv", "mm"):
        with WO.force_path(path) if path else contextlib.nullcontext():
            torch.library.opcheck(WO._weight_only_op, (x, pw.qweight, pw.scale_zero, b, 4, 32, pw.symmetric))
    pw8 = _weight(24, 64, 8, -1, True)
    torch.library.opcheck(WO._weight_only_op, (x, pw8.qweight, pw8.scale_zero, None, 8, 64, pw8.symmetric))


def test_quantized_linear_schemes():
    lin = torch.nn.Linear(128, 48, device=DEVICE, dtype=torch.float16)
    x = torch.randn(4, 128, device=DEVICE, dtype=torch.float16)
    for scheme, tol in (("w4a16", 0.2), ("w8a16", 0.01)):
        ql = qk.QuantizedLinear.from_linear(lin, scheme)
        pw = ql.packed_weight()
        _check(ql(x), _ref(x, pw, lin.bias.detach()), torch.float16)
        assert rel_err(ql(x), lin(x).detach()) < tol      # quantization error of the weights themselves
        sd = ql.state_dict()
        ql2 = qk.QuantizedLinear(128, 48, True, scheme, DEVICE, torch.float16, ql.group_size, ql.zeros is None)
        ql2.load_state_dict(sd)
        assert_bit_exact(ql2(x), ql(x), "state_dict round trip")
        # state dicts from before scale_zero (separate scales / zeros) still load
        old = {k: v for k, v in sd.items() if k != "scale_zero"}
        old["scales"] = ql.scales.clone()
        if ql.zeros is not None:
            old["zeros"] = ql.zeros.clone()
        ql3 = qk.QuantizedLinear(128, 48, True, scheme, DEVICE, torch.float16, ql.group_size, ql.zeros is None)
        ql3.load_state_dict(old)
        assert_bit_exact(ql3(x), ql(x), "old state_dict layout")


def test_torch_compile_fullgraph():
    lin = torch.nn.Linear(64, 48, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin, "w4a16", group_size=32)
    x = torch.randn(7, 64, device=DEVICE, dtype=torch.float16)
    compiled = torch.compile(ql, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    assert_bit_exact(compiled(x), ql(x))


@gpu
@pytest.mark.parametrize("M", [1, 16, 4096])
def test_cuda_graph_replay(M):
    lin = torch.nn.Linear(512, 256, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin, "w4a16")
    x = torch.randn(M, 512, device=DEVICE, dtype=torch.float16)
    want = ql(x)
    assert_bit_exact(graph_replay(lambda: ql(x)), want)


@gpu
@pytest.mark.parametrize("M", [1, 5, 16, 19])
def test_tc_alignment_and_fallback(M):
    """The tensor-core kernel reads x and code rows as 16-byte vectors: a 2-byte-offset x view is copied
    first; cases it does not run (group 64, K % 128) take the config's fallback. Both against the reference."""
    N, K = 72, 384
    for group_size, k in ((128, K), (-1, K), (64, K), (128, 256 + 128), (-1, 320)):
        pw = _weight(N, k, 4, group_size, False)
        buf = torch.randn(M * k + 1, device=DEVICE, dtype=torch.float16)
        x = buf[1:].view(M, k)                                   # data pointer 2 bytes past alignment
        assert x.data_ptr() % 16
        _check(_run(x, pw, path="tc"), _ref(x, pw), torch.float16)
        _check(_run(x, pw, path="tc-splitk"), _ref(x, pw), torch.float16)
    assert WO.tc_supported(4, 384, 128, pw.qweight) and not WO.tc_supported(4, 384, 64, pw.qweight)


def _check_gemv_case(cfg, M, N, k, group_size, sym, scale):
    """One 4-bit case of a decode GEMV config against the reference: a 2-byte-offset x view (copied first) scaled by
    `scale` (large x: small weights, so the output stays finite), bias, outputs poisoned. Returns the weight."""
    w = torch.randn(N, k, device=DEVICE) * (1e-4 if scale > 1 else 1.0)
    pw = qk.PackedWeight.from_float(w, 4, group_size, sym, scale_dtype=torch.float16)
    buf = torch.randn(M * k + 1, device=DEVICE, dtype=torch.float16)
    x = buf[1:].view(M, k)                                   # data pointer 2 bytes past alignment
    if scale != 1.0:
        x = (x.float() * scale).clamp(-6e4, 6e4).half()
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    for int_zeros in sorted({pw.int_zeros, False}):     # integer zero points taken as such, and as floats
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, bias, 4, pw.group_size, int_zeros, cfg)
        assert torch.isfinite(got).all()
        _check(got, _ref(x, pw, bias), torch.float16)
    return pw


@gpu
@pytest.mark.parametrize("cfg", [dict(BLOCK_N=8, BLOCK_K=2048, WPT=4, num_warps=2),
                                 dict(BLOCK_N=4, BLOCK_K=4096, WPT=4, num_warps=4),
                                 dict(BLOCK_N=16, BLOCK_K=1024, WPT=2, num_warps=2),
                                 dict(BLOCK_N=8, BLOCK_K=512, WPT=1, num_warps=2, SPLIT_K=3, MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_N=4, BLOCK_K=1024, WPT=4, num_warps=1, STAGES=3),
                                 dict(BLOCK_N=8, BLOCK_K=1024, WPT=4, num_warps=1, PERSISTENT=1),
                                 dict(BLOCK_N=8, BLOCK_K=512, WPT=2, num_warps=1, PERSISTENT=16),
                                 dict(BLOCK_N=16, BLOCK_K=2048, WPT=4, num_warps=2, PERSISTENT=3)])
def test_gv_tails_scales_and_fallback(cfg):
    """The paired-fp16 GEMV: K not a multiple of its step (masked chunks), split-K slices, N tails, M > 1, bias,
    the codes through a shared-memory ring (STAGES), the persistent grid (PERSISTENT: equal runs of (row block,
    step) units per program, row blocks split between programs and added up in the kernel), SwiGLU in the epilogue (the bits of product + silu_and_mul),
    per channel / group 64 / 128, symmetric and not, integer zero points taken out in the dequantizing fmas (INT_Z)
    or as floats, a 2-byte-offset x view (copied first); x of 1e-3 (fp16 subnormal products) and of 3e4 (no lane
    may overflow). bf16 x and group 32 take the fallback. Against the reference."""
    cfg = dict(path="gv", **cfg)
    cfg["fallback"] = WO.dispatch.path_config(None, "gemv", 4, 200, 320, DEVICE)
    for M, N, k, group_size, sym, scale in ((1, 200, 4160, 64, True, 1.0), (3, 77, 2048, 128, False, 1.0),
                                            (1, 300, 4096, -1, False, 1e-3), (2, 64, 1536, 128, True, 3e4),
                                            (1, 1000, 14336, 128, False, 1.0), (5, 72, 384, 32, False, 1.0),
                                            (1, 64, 1024, 128, False, 3e4)):
        pw = _check_gemv_case(cfg, M, N, k, group_size, sym, scale)
        assert WO.gv_supported(4, k, group_size, pw.qweight, torch.float16) == (group_size != 32)
    pw = _weight(2 * 72, 2048, 4, 128, False)                   # SwiGLU in the epilogue: the bits of product + silu
    x = torch.randn(3, 2048, device=DEVICE, dtype=torch.float16)
    assert WO.launch.fused_swiglu(cfg)
    with qk.poison_outputs():
        got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg, True)
        want = qk.silu_and_mul(WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size,
                                                    pw.int_zeros, cfg))
    assert_bit_exact(got, want)
    xb = torch.randn(3, 2048, device=DEVICE, dtype=torch.bfloat16)
    pw = _weight(64, 2048, 4, 128, False, torch.bfloat16)
    assert not WO.gv_supported(4, 2048, 128, pw.qweight, torch.bfloat16)
    with qk.poison_outputs():
        got = WO.launch.run_config(xb, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg)
    _check(got, _ref(xb, pw), torch.bfloat16)


@gpu
@pytest.mark.parametrize("cfg", [dict(TILES=2, WPT=4, num_warps=1),
                                 dict(TILES=4, WPT=8, num_warps=2),
                                 dict(TILES=1, WPT=16, num_warps=1),
                                 dict(TILES=2, WPT=4, num_warps=1, SPLIT_K=3, MIN_PROGRAMS=1 << 30),
                                 dict(TILES=4, WPT=4, num_warps=4, SPLIT_K=2, MIN_PROGRAMS=1 << 30),
                                 dict(TILES=4, WPT=4, num_warps=1, PAIRS=True),
                                 dict(TILES=2, WPT=4, num_warps=1, PAIRS=True, SPLIT_K=3, MIN_PROGRAMS=1 << 30),
                                 dict(TILES=1, WPT=8, num_warps=1, STAGES=3),
                                 dict(TILES=4, WPT=4, num_warps=2, STAGES=4, SPLIT_K=3, MIN_PROGRAMS=1 << 30)])
def test_gvt_tails_scales_and_fallback(cfg):
    """The tensor-core GEMV: K not a multiple of its step (masked chunks), split-K slices, two steps per iteration
    (PAIRS) with an odd step count, the codes through a ring of async copies (STAGES) deeper than a slice's steps,
    N tails (wrapped rows), M of 1..16 (one or two x tiles per program) and past 16,
    bias, per channel / group 128 / 256, symmetric and not, GPTQ's zero point 16, a 2-byte-offset x view (copied
    first), x of 1e-3 and 3e4, SwiGLU in the epilogue (the bits of product + silu_and_mul); 8-bit codes (groups of
    64 up, per channel); bf16 scales with fp16 x. Float zero points, bf16 x and groups of 64 (4-bit) / 32 (8-bit) take
    the fallback. Against the reference."""
    cfg = dict(path="gvt", **cfg)
    cfg["fallback"] = WO.dispatch.path_config(None, "gemv", 4, 200, 320, DEVICE)
    for M, N, k, group_size, sym, scale in ((1, 200, 4160, -1, True, 1.0), (3, 77, 2048, 128, False, 1.0),
                                            (8, 300, 4096, -1, False, 1e-3), (9, 64, 1536, 256, True, 3e4),
                                            (16, 1000, 14336, 128, False, 1.0), (19, 72, 384, -1, False, 1.0),
                                            (5, 72, 384, 64, False, 1.0)):
        pw = _check_gemv_case(cfg, M, N, k, group_size, sym, scale)
        assert WO.gvt_supported(4, k, group_size, pw.qweight, torch.float16, pw.int_zeros) == (group_size != 64)
    for M, N, k, group_size, sym in ((1, 200, 4160, -1, True), (5, 77, 2048, 64, False), (12, 300, 4096, 128, True),
                                     (16, 1000, 14336, -1, True), (3, 72, 384, 32, True)):     # 8-bit codes
        pw = qk.PackedWeight.from_float(torch.randn(N, k, device=DEVICE), 8, group_size, sym, scale_dtype=torch.float16)
        x = torch.randn(M, k, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 8, pw.group_size, pw.int_zeros, cfg)
        _check(got, _ref(x, pw), torch.float16)
        assert WO.gvt_supported(8, k, group_size, pw.qweight, torch.float16, pw.int_zeros) == (group_size != 32)
    for bits in (4, 8):          # bf16 scales with fp16 x: the zero pairs made outside the asm
        pw = _weight(96, 2048, bits, 128, False, torch.bfloat16)
        x = torch.randn(4, 2048, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, bits, pw.group_size, pw.int_zeros, cfg)
        _check(got, _ref(x, pw), torch.float16)
    pw = _weight(2 * 72, 2048, 4, 128, False)                   # SwiGLU in the epilogue: the bits of product + silu
    assert WO.launch.fused_swiglu(cfg)
    for M in (3, 12):
        x = torch.randn(M, 2048, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg, True)
            want = qk.silu_and_mul(WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size,
                                                        pw.int_zeros, cfg))
        assert_bit_exact(got, want)
    pw = _weight(2 * 72, 2048, 8, -1, True)                     # the same with 8-bit codes
    x = torch.randn(5, 2048, device=DEVICE, dtype=torch.float16)
    with qk.poison_outputs():
        got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 8, pw.group_size, pw.int_zeros, cfg, True)
        want = qk.silu_and_mul(WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 8, pw.group_size,
                                                    pw.int_zeros, cfg))
    assert_bit_exact(got, want)
    q = torch.randint(0, 16, (48, 1024), device=DEVICE)
    s = torch.rand(48, 8, device=DEVICE, dtype=torch.float16) / 8
    for z, want in ((torch.full((48, 8), 16.0, device=DEVICE), True),           # GPTQ's stored-minus-one zero
                    (torch.rand(48, 8, device=DEVICE) * 15, False)):            # float zero points: the fallback
        pw = qk.PackedWeight.from_int(q, s, z.half(), bits=4, group_size=128)
        assert pw.int_zeros == want and WO.gvt_supported(4, 1024, 128, pw.qweight, torch.float16, pw.int_zeros) == want
        x = torch.randn(6, 1024, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg)
        _check(got, _ref(x, pw), torch.float16)
    xb = torch.randn(3, 2048, device=DEVICE, dtype=torch.bfloat16)
    pw = _weight(64, 2048, 4, 128, False, torch.bfloat16)
    assert not WO.gvt_supported(4, 2048, 128, pw.qweight, torch.bfloat16)
    with qk.poison_outputs():
        got = WO.launch.run_config(xb, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg)
    _check(got, _ref(xb, pw), torch.bfloat16)


@gpu
@pytest.mark.parametrize("cfg", [dict(BLOCK_M=256, BLOCK_N=128, num_warps=8, STAGES=4),
                                 dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, STAGES=3),
                                 dict(BLOCK_M=128, BLOCK_N=256, num_warps=8, STAGES=3),
                                 dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, STAGES=5),
                                 dict(BLOCK_M=8, BLOCK_N=64, num_warps=4, STAGES=8, SPLIT_K=3, MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, STAGES=6, SPLIT_K=4, MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_M=16, BLOCK_N=256, num_warps=8, STAGES=2, KC=4, SPLIT_K=2,
                                      MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, STAGES=3, KC=2, SPLIT_K=3,
                                      MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, STAGES=3, TAIL=4),
                                 dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, STAGES=3, KC=2, TAIL=3, PER_SM=2),
                                 dict(BLOCK_M=256, BLOCK_N=128, num_warps=8, STAGES=4, WS=True),
                                 dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, STAGES=3, KC=2, SPLIT_K=3,
                                      MIN_PROGRAMS=1 << 30, WS=True),
                                 dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, STAGES=4, TAIL=4, WS=True),
                                 dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, STAGES=3, SPLIT_K=3, MIN_PROGRAMS=1 << 30,
                                      XBAR=True),
                                 dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, STAGES=2, KC=2, XBAR=True),
                                 dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, STAGES=3, TAIL=3, XBAR=True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_wg_tiles_tails_and_fallback(cfg, dtype, bits):
    """The Hopper wgmma kernel over its tile shapes and split-K, 4- and 8-bit codes: M and N tails (rows past M / N
    are read but not stored, split-K slices of unequal length), ring stages of several 64-k chunks (KC; K / 64 not a
    multiple of KC: one chunk per stage),
    a 2-byte-offset x view (copied first), bias, symmetric / asymmetric, integer zero points taken as such or not,
    per channel; group 32 and K % 64 take the fallback; the last wave split (TAIL), the warp-specialized loop
    (WS) and the x tiles on barriers of their own (XBAR). Against the reference."""
    cfg = dict(WO.WG_DEFAULT, GROUP_M=4, **cfg)
    cfg["fallback"] = WO.dispatch.path_config(None, "mm", bits, 200, 320, DEVICE)
    for M, N, k, group_size, sym in ((1, 200, 320, 64, True), (130, 200, 640, 128, False), (300, 72, 512, -1, True),
                                     (77, 300, 384, 128, True), (64, 96, 256, 32, False), (5, 64, 352, -1, False)):
        pw = _weight(N, k, bits, group_size, sym, dtype)
        buf = torch.randn(M * k + 1, device=DEVICE, dtype=dtype)
        x = buf[1:].view(M, k)                                   # data pointer 2 bytes past alignment
        bias = torch.randn(N, device=DEVICE, dtype=dtype)
        for int_zeros in sorted({pw.int_zeros, False}):
            with qk.poison_outputs():
                got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, bias, bits, pw.group_size, int_zeros, cfg)
            _check(got, _ref(x, pw, bias), dtype)
    assert WO.wg_supported(bits, 384, 128, pw.qweight) == (torch.cuda.get_device_capability() == (9, 0))
    assert not WO.wg_supported(bits, 384, 32, pw.qweight) and not WO.wg_supported(bits, 352, 352, pw.qweight)


@gpu
@pytest.mark.parametrize("cfg", [dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, STAGES=4, SPLIT_K=4, MIN_PROGRAMS=1 << 30),
                                 dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, STAGES=2, KC=2),
                                 dict(BLOCK_M=256, BLOCK_N=128, num_warps=8, STAGES=4),
                                 dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, STAGES=3, TAIL=3),
                                 dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, STAGES=3, KC=2, WS=True),
                                 dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, STAGES=4, SPLIT_K=4, MIN_PROGRAMS=1 << 30,
                                      XBAR=True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [4, 8])
def test_wg_swiglu_in_the_epilogue(cfg, dtype, bits):
    """wg with swiglu=True (a tile of gate rows and their up rows, paired in the epilogue): the bits of the product
    followed by silu_and_mul, over M / I tails (I not a multiple of the half tile), split-K, ring stages of two
    chunks, bias, per group and per channel."""
    cfg = dict(WO.WG_DEFAULT, GROUP_M=4, **cfg)
    assert WO.launch.fused_swiglu(cfg)
    for M, I, k, group_size in ((1, 100, 384, 128), (17, 40, 256, -1), (130, 72, 512, 64), (3, 256, 1024, 128)):
        pw = _weight(2 * I, k, bits, group_size, False, dtype)
        x = torch.randn(M, k, device=DEVICE, dtype=dtype)
        bias = torch.randn(2 * I, device=DEVICE, dtype=dtype)
        assert WO.wg_supported(bits, k, pw.group_size, pw.qweight, dtype, pw.int_zeros)
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, bias, bits, pw.group_size, pw.int_zeros, cfg,
                                       swiglu=True)
            full = WO.launch.run_config(x, pw.qweight, pw.scale_zero, bias, bits, pw.group_size, pw.int_zeros, cfg)
        assert got.shape == (M, I) and not torch.isnan(got).any(), "unwritten (poisoned) or NaN outputs"
        assert_bit_exact(got, qk.silu_and_mul(full), f"M={M} I={I}")
        _check(full, _ref(x, pw, bias), dtype)


def test_wg_tail_plan():
    """TAIL: the tiles of the last, partial wave of programs (SMs x PER_SM slots) split along K into at most TAIL
    slices, no more than the idle slots take, in whole stages, none empty; the tiles before run whole. No split where
    the tiles fill their waves, with one slot per tail tile, with no SM count, or where the x ring cannot hold the
    fp32 tile for the fix-up; refused on other paths."""
    cfg = dict(path="wg", BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=3, num_warps=4, TAIL=4)
    # 2 x 5 = 10 tiles on 4 SMs: 8 whole, 2 split 2 ways (two idle slots each)
    kernel, grid, split, cx, scratch = WO.launch._plan(cfg, 100, 320, 1024, 4, 128, False, True, False, 4)
    assert grid == (8 + 2 * 2, 1) and split == 1 and cx["TAIL"] == 2 and scratch == (2 * 2 * 64 * 64, 2, 8)
    # two slots per SM: 10 tiles on 8 slots, 2 with 4 idle slots each; K of 5 steps in 4 slices would leave one empty:
    # 3 slices (2, 2, 1)
    _, grid, _, cx, scratch = WO.launch._plan(dict(cfg, PER_SM=2), 100, 320, 320, 4, 128, False, True, False, 4)
    assert grid == (8 + 2 * 3, 1) and cx["TAIL"] == 3 and "PER_SM" not in cx and scratch == (2 * 3 * 64 * 64, 2, 8)
    # full waves; 1 idle slot per tile; no SMs; a ring too small for the fp32 tile (2 stages of 64 x 64 fp16)
    for M, N, sms, c in ((128, 256, 4, cfg), (100, 320, 6, cfg), (100, 320, 0, cfg),
                         (100, 320, 4, dict(cfg, BLOCK_N=128, STAGES=2))):
        _, grid, split, cx, scratch = WO.launch._plan(c, M, N, 1024, 4, 128, False, True, False, sms)
        assert grid[0] == -(-M // 64) * -(-N // c["BLOCK_N"]) and "TAIL" not in cx and scratch is None
    with pytest.raises(RuntimeError, match="TAIL / PER_SM .* are wg config keys"):
        WO.launch._plan(dict(path="gvt", TILES=1, WPT=8, num_warps=1, TAIL=2), 1, 64, 4096, 4, 128, False, True)


def test_wg_maxnreg_reaches_the_launch():
    """maxnreg (registers per thread capped) reaches the wg launch with the constexprs, as a compile option."""
    cfg = dict(path="wg", BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=3, num_warps=4, maxnreg=80)
    _, _, _, cx, _ = WO.launch._plan(cfg, 64, 4096, 4096, 4, 128, False, True)
    assert cx["maxnreg"] == 80


def test_wg_xbar_reaches_the_launch_and_is_refused_elsewhere():
    """XBAR (the x tiles on barriers of their own) is a wg constexpr; with WS (the producer warp issues the copies)
    or on another path the config is refused, naming the key."""
    cfg = dict(path="wg", BLOCK_M=32, BLOCK_N=64, GROUP_M=8, STAGES=3, num_warps=4, XBAR=True)
    _, _, _, cx, _ = WO.launch._plan(cfg, 32, 4096, 4096, 4, 128, False, True)
    assert cx["XBAR"] is True
    for bad in (dict(cfg, WS=True), dict(path="gvt", TILES=1, WPT=8, num_warps=1, XBAR=True)):
        with pytest.raises(RuntimeError, match="XBAR .* is a wg config key, not with WS"):
            WO.launch._plan(bad, 32, 4096, 4096, 4, 128, False, True)


@gpu
@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
def test_wg_tail_split_mixed_wave(bits, ws):
    """TAIL with more tiles than one wave: the first waves' tiles whole, the last wave's split along K (slices of
    unequal length), against the reference, twice (the tail counters are back at zero after a launch)."""
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    cfg = dict(WO.WG_DEFAULT, BLOCK_M=16, BLOCK_N=64, num_warps=4, STAGES=3, GROUP_M=4, TAIL=4, WS=ws)
    M, N, K = 17, 64 * (sms // 2 + 5), 640      # 2 x (sms / 2 + 5) tiles: 10 past the first wave; slices 3, 3, 3, 1
    _, grid, _, cx, scratch = WO.launch._plan(cfg, M, N, K, bits, 64, True, True, False, sms)
    assert cx["TAIL"] == 4 and scratch[1] == 2 * (sms // 2 + 5) - sms
    pw = _weight(N, K, bits, 64, False)
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    for _ in range(2):
        with qk.poison_outputs():
            got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, bias, bits, 64, pw.int_zeros, cfg)
        _check(got, _ref(x, pw, bias), torch.float16)


@pytest.mark.parametrize("path", [p for p in PATHS if p.endswith("-splitk")])
def test_splitk_fixup_counters_and_graphs(path):
    """Split-K partials are added by the last program of each tile (every kernel: no second launch), counted
    with per-tile counters that must be back at zero after every launch; in slice order, so results are
    deterministic, eager or replayed in a CUDA graph."""
    K = 4096 if ON_GPU else 512
    pw = _weight(1000 if ON_GPU else 40, K, 4, 128, False)
    for M in (1, 3, 9, 100) if ON_GPU else (1, 3):
        x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
        first = _run(x, pw, path=path)
        _check(first, _ref(x, pw), torch.float16)
        for _ in range(3 if ON_GPU else 1):
            assert_bit_exact(_run(x, pw, path=path), first, "repeat")
        if ON_GPU:
            assert_bit_exact(graph_replay(lambda: _run(x, pw, None, path)), first, "graph")
        assert all(not buf.any() for buf in _runtime._COUNTERS.values()), "split-K counters left non-zero"


@gpu
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 14336, 4096), (128, 4096, 14336), (1024, 4096, 4096)])
@pytest.mark.parametrize("bits,group_size", [(4, 128), (4, 64), (8, -1)])
def test_real_sizes(M, N, K, bits, group_size, path):
    pw = _weight(N, K, bits, group_size, bits == 4 and group_size == 64)
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    _check(_run(x, pw, path=path), _ref(x, pw), torch.float16)


@gpu
@pytest.mark.parametrize("kind,key,cfg", shipped_table_entries(("w4a16", "w8a16"), DEVICE),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_shipped_config(kind, key, cfg):
    """Each entry of this GPU's table (and its fallback) at its bucket's M on the shape it was tuned for (a shape
    override's N x K; 4096 x 4096 for a bucket), as the dispatch runs it."""
    M, N, K = table_entry_case(key)
    bits = int(kind[1])
    pw = _weight(N, K, bits, 128 if bits == 4 else -1, bits == 8)
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    for c in [cfg] + ([cfg["fallback"]] if "fallback" in cfg else []):
        with qk.poison_outputs(), WO.use_config(c):
            got = WO._weight_only(x, pw, None, bits, "test")
        _check(got, _ref(x, pw), torch.float16)


def test_gv_config_checked():
    """A paired-fp16 GEMV config whose step does not cover its threads' chunks (BLOCK_K a multiple of 256 x WPT x
    warps) or with another WPT is refused with the config named, before anything launches."""
    for bad in (dict(BLOCK_N=8, BLOCK_K=1024, WPT=4, num_warps=2), dict(BLOCK_N=8, BLOCK_K=1536, WPT=3, num_warps=1)):
        want = r"gv config needs WPT in \(1, 2, 4, 8\).*'BLOCK_K': " + str(bad["BLOCK_K"])
        with pytest.raises(RuntimeError, match=want):
            WO.launch._plan(dict(path="gv", **bad), 1, 64, 4096, 4, 128, False, True)
    kernel, grid, split, cx, _ = WO.launch._plan(dict(path="gv", BLOCK_N=8, BLOCK_K=2048, WPT=4, num_warps=2), 3, 100,
                                              4160, 4, 128, True, True, True)
    assert grid == (13, 1, 3) and split == 1 and cx["SWIGLU"] and not cx["EVEN_K"] and cx["HAS_BIAS"]


@pytest.mark.parametrize("ch", [1, 2, 4])
def test_gv_chain_constants(ch):
    """gv's asm for a chain of ch code words: its paired-fma constants turn every nibble's magic-number fp16
    (1024 + u low, 1024 + 16 u high) into u / (64 ch) exactly (one rounding, as fma), no lane of 4 ch products can
    overflow for any finite fp16 x, and the asm takes ch words and four x pairs per word."""
    from qkernels.kernels.weight_only.gv import _dot_asm
    asm = _dot_asm(ch)
    half = {n: np.uint16(int(v, 16) & 0xFFFF).view(np.float16) for n, v in re.findall(r"mov.b32 (\w+), (0x\w+);", asm)}
    assert all(re.search(rf"mov.b32 {n}, 0x([0-9A-F]{{4}})\1;", asm) for n in ("sl", "bl", "sh", "bh"))
    weights = []
    for u in range(16):
        lo = np.uint16(0x6400 | u).view(np.float16)
        hi = np.uint16(0x6400 | u << 4).view(np.float16)
        for a, m, b in ((lo, half["sl"], half["bl"]), (hi, half["sh"], half["bh"])):
            weights.append(np.float16(float(a) * float(m) + float(b)))
            assert weights[-1] == u / (64 * ch)
    products = len(re.findall(r"^(mul|fma)\.rn\.f16x2 c0, a\d", asm, re.M))      # per fp16 lane
    assert products == 4 * ch and products * max(weights) * 65504 < 65504
    assert max(int(i) for i in re.findall(r"\$(\d+)", asm)) == 5 * ch
    assert asm.count("mul.rn.f16x2") == 1 and asm.count("cvt.f32.f16") == 2


@pytest.mark.parametrize("ch", [1, 2, 4])
def test_gv_int_zero_constants(ch):
    """gv's asm for integer zero points: the bias words _int_z_bias builds from each zero point z in [0, 16] (two
    integer multiply-adds on the bits of z + 2**23), with the asm's paired-fma factors, turn every nibble's
    magic-number fp16 into (u - z) / (128 ch) exactly; no lane of 4 ch products can pass half of |x|'s largest
    value; the asm takes ch code words, the two bias words, then four x pairs per word."""
    from qkernels.kernels.weight_only.gv import _dot_asm, _int_z_consts, _unit
    asm = _dot_asm(ch, True)
    half = {n: np.uint16(int(v, 16) & 0xFFFF).view(np.float16) for n, v in re.findall(r"mov.b32 (\w+), (0x\w+);", asm)}
    assert set(half) == {"sl", "sh"} and _unit(ch, True) == 128 * ch
    zl, zh = _int_z_consts(ch)
    weights = []
    for z in range(17):
        b = int(np.float32(z + 2**23).view(np.uint32))
        bl, bh = (np.array([(b * f + c) % 2**32], np.uint32).view(np.float16) for f, c in ((0x10001, zl),
                                                                                           (0x100010, zh)))
        assert bl[0] == bl[1] and bh[0] == bh[1]
        for u in range(16):
            lo = np.uint16(0x6400 | u).view(np.float16)
            hi = np.uint16(0x6400 | u << 4).view(np.float16)
            for a, m, c in ((lo, half["sl"], bl[0]), (hi, half["sh"], bh[0])):
                weights.append(abs(np.float16(float(a) * float(m) + float(c))))
                assert np.float16(float(a) * float(m) + float(c)) == (u - z) / (128 * ch)
    products = len(re.findall(r"^(mul|fma)\.rn\.f16x2 c0, a\d", asm, re.M))
    assert products == 4 * ch and products * max(weights) <= 0.5
    assert re.search(rf"fma.rn.f16x2 a0, a0, sl, \${1 + ch};", asm) and re.search(rf"a3, sh, \${2 + ch};", asm)
    assert max(int(i) for i in re.findall(r"\$(\d+)", asm)) == 5 * ch + 2


def test_gv_persistent_plan():
    """gv's PERSISTENT: PERSISTENT programs per SM (no more than there are (row block, step) units), an fp32 slot
    of BLOCK_N per unit and a counter per row block for each x row; with split-K, a ring or a count below 1 it is
    refused with the config named; codes of 2**31 bytes or more (its int32 offsets) take gv's own grid."""
    cfg = dict(path="gv", BLOCK_N=8, BLOCK_K=1024, WPT=4, num_warps=1, PERSISTENT=16)
    kernel, grid, split, cx, scratch = WO.launch._plan(cfg, 2, 28672, 4096, 4, 128, False, True, False, 132)
    assert kernel.fn.__name__ == "_wo_gvp_kernel" and grid == (132 * 16, 1, 2) and split == 1
    assert scratch == (2 * 3584 * 4 * 8, 2 * 3584, 0) and "PERSISTENT" not in cx and "SPLIT_K" not in cx
    _, grid, _, _, _ = WO.launch._plan(cfg, 1, 200, 1024, 4, 128, False, True, False, 132)
    assert grid == (25, 1, 1)                                   # 25 units: one each
    _, _, _, cx, _ = WO.launch._plan(dict(cfg, BLOCK_N=16), 1, 200, 4160, 4, 64, True, True, True, 132)
    assert cx["SWIGLU"] and not cx["EVEN_K"] and cx["HAS_BIAS"]
    kernel, grid, _, _, _ = WO.launch._plan(cfg, 1, 1 << 20, 4096, 4, 128, False, True, False, 132)
    assert kernel.fn.__name__ == "_wo_gv_kernel" and grid == ((1 << 20) // 8, 1, 1)
    for bad in (dict(PERSISTENT=0), dict(SPLIT_K=2), dict(STAGES=3), dict(MIN_PROGRAMS=1024)):
        with pytest.raises(RuntimeError, match=r"gv PERSISTENT takes .*'PERSISTENT'"):
            WO.launch._plan(dict(cfg, **bad), 1, 64, 4096, 4, 128, False, True, False, 132)
    with pytest.raises(RuntimeError, match=r"PERSISTENT .* is a gv config key"):
        WO.launch._plan(dict(path="gvt", TILES=1, WPT=8, num_warps=1, PERSISTENT=4), 1, 64, 4096, 4, 128, False, True)


@gpu
@pytest.mark.parametrize("bits,N,K,group_size,wpt", [(8, 3, 64, 64, 8), (4, 40, 4224, 128, 8), (4, 17, 384, 128, 16)])
def test_gvt_reads_no_scale_past_k(bits, N, K, group_size, wpt):
    """A step reaching past K (K not a multiple of the step) must not read the (scale, zero) words of the groups
    past the row's last: here NaN words lie right after the tensor, and a NaN scale times the masked (zero) sum
    would be NaN."""
    pw = _weight(N, K, bits, group_size, bits == 8)
    assert WO.gvt_supported(bits, K, group_size, pw.qweight, torch.float16, pw.int_zeros)
    sz = pw.scale_zero
    buf = torch.full((sz.numel() + 4096,), float("nan"), device=DEVICE, dtype=sz.dtype)
    buf[:sz.numel()] = sz.flatten()
    sz_nan_after = buf[:sz.numel()].view(sz.shape)
    x = torch.randn(3, K, device=DEVICE, dtype=torch.float16)
    cfg = dict(path="gvt", TILES=1, WPT=wpt, num_warps=1)
    with qk.poison_outputs():
        got = WO.launch.run_config(x, pw.qweight, sz_nan_after, None, bits, group_size, pw.int_zeros, cfg)
    _check(got, _ref(x, pw), torch.float16)


def test_gvt_config_checked():
    """A tensor-core GEMV config with a WPT other than 4, 8, 16 or tiles its warps cannot share is refused with the
    config named; a plan takes one x tile per program up to M = 8 and two above."""
    for bad in (dict(TILES=2, WPT=2, num_warps=1), dict(TILES=1, WPT=4, num_warps=2)):
        with pytest.raises(RuntimeError, match=r"gvt config needs WPT in \(4, 8, 16\).*'TILES': " + str(bad["TILES"])):
            WO.launch._plan(dict(path="gvt", **bad), 1, 64, 4096, 4, 128, False, True)
    for bad in (dict(TILES=1, WPT=8, num_warps=1, STAGES=0), dict(TILES=2, WPT=4, num_warps=1, STAGES=3, PAIRS=True)):
        with pytest.raises(RuntimeError, match=r"gvt config needs STAGES >= 1, and 1 with PAIRS"):
            WO.launch._plan(dict(path="gvt", **bad), 1, 64, 4096, 4, 128, False, True)
    kernel, grid, split, cx, _ = WO.launch._plan(dict(path="gvt", TILES=2, WPT=4, num_warps=1), 3, 100, 4160, 4, 128,
                                              True, True)
    assert grid == (4, 1, 1) and split == 1 and cx["MT"] == 1 and not cx["EVEN_K"] and cx["HAS_BIAS"]
    kernel, grid, split, cx, _ = WO.launch._plan(dict(path="gvt", TILES=2, WPT=8, num_warps=1, SPLIT_K=4,
                                                   MIN_PROGRAMS=1 << 30), 12, 4096, 4096, 4, -1, False, True)
    assert grid == (128, 4, 1) and split == 4 and cx["MT"] == 2 and cx["EVEN_K"] and cx["GROUP"] == -1
    kernel, grid, split, cx, _ = WO.launch._plan(dict(path="gvt", TILES=2, WPT=4, num_warps=1), 3, 144, 2048, 4, 128,
                                              False, True, True)     # SwiGLU: 8 gate rows and their up rows per tile
    assert grid == (5, 1, 1) and cx["SWIGLU"] and WO.launch.fused_swiglu(dict(path="gvt"))
    kernel, grid, split, cx, _ = WO.launch._plan(dict(path="gvt", TILES=2, WPT=8, num_warps=1), 1, 4096, 4160, 8, -1,
                                              False, True)     # 8-bit: blocks of 64 k, so two per step here
    assert grid == (128, 1, 1) and cx["BITS"] == 8 and not cx["EVEN_K"]
    _, _, _, cx, _ = WO.launch._plan(dict(path="gvt", TILES=2, WPT=4, num_warps=1), 1, 4096, 4160, 8, -1, False, True)
    assert cx["EVEN_K"] and cx["BITS"] == 8


def test_config_pdl_false_is_a_launch_option():
    """A config's "PDL": false launches its kernel without programmatic dependent launch: no kernel constexpr of
    the config's own, the same result as the config without it (against the reference)."""
    base = WO.dispatch.path_config(None, "gemv", 4, 96, 512, DEVICE)
    cfg = dict(base, PDL=False)
    assert "PDL" not in WO.launch._plan(cfg, 2, 96, 512, 4, 128, False, True)[3]
    pw = _weight(96, 512, 4, 128, False)
    x = torch.randn(2, 512, device=DEVICE, dtype=torch.float16)
    with qk.poison_outputs():
        got = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, cfg)
        want = WO.launch.run_config(x, pw.qweight, pw.scale_zero, None, 4, pw.group_size, pw.int_zeros, base)
    assert_bit_exact(got, want)
    _check(got, _ref(x, pw), torch.float16)


def test_force_path_is_scoped_and_checked():
    assert WO.dispatch.forced_path() is None
    with WO.force_path("mm-splitk"):
        assert WO.dispatch.forced_path() == "mm-splitk"
        cfg = WO.dispatch.path_config(None, "mm-splitk", 4, 64, 256, DEVICE)
        assert cfg["path"] == "mm" and cfg["SPLIT_K"] == WO.dispatch.FORCED_SPLIT_K
        with WO.force_path("gemv"):
            assert WO.dispatch.forced_path() == "gemv"
        assert WO.dispatch.forced_path() == "mm-splitk"
    assert WO.dispatch.forced_path() is None
    with pytest.raises(ValueError, match=r"path must be one of \('gemv', 'mm'.*got 'gemm'"):
        WO.force_path("gemm")
    tc = WO.dispatch.path_config(None, "tc", 4, 64, 256, DEVICE)     # a Gluon path carries its fallback
    assert tc["path"] == "tc" and tc["fallback"]["path"] == "gemv"


@pytest.mark.parametrize("path", PATHS + [None])
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, -1), (8, -1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_swiglu_equals_product_then_silu_and_mul(path, bits, group_size, dtype):
    """swiglu=True on a merged [gate; up] weight: the bits of the product followed by silu_and_mul, on every path
    (the GEMV applies it in its epilogue, split-K included; the others run silu_and_mul after the product); an
    odd intermediate size leaves a tail program with one valid column pair."""
    I, K = 37, 128
    pw = _weight(2 * I, K, bits, group_size, False, dtype)
    for M in (1, 3, 17):
        x = torch.randn(M, K, device=DEVICE, dtype=dtype)
        with qk.poison_outputs(), WO.force_path(path) if path else contextlib.nullcontext():
            got = WO._weight_only(x, pw, None, bits, "test", swiglu=True)
            want = qk.silu_and_mul(WO._weight_only(x, pw, None, bits, "test"))
        assert got.shape == (M, I) and not torch.isnan(got).any()
        assert_bit_exact(got, want, f"M={M}")
    with pytest.raises(ValueError, match="even number of rows, got N=37"):
        qk.w4a16_linear(torch.randn(2, K, device=DEVICE, dtype=torch.float16), _weight(37, K, 4, 32), swiglu=True)

"""Fused norms / SwiGLU / softmax vs qkernels.reference: fp64 references with per-dtype tolerances;
the fused quantized outputs bit-exact against quantize() of the op's own float output."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qkernels as qk
from qkernels import reference as ref
from qkernels.ops import fused as F
from qkernels.ops.fused import tiles

from ..conftest import DEVICE, ON_GPU
from ..helpers import as_bits, assert_bit_exact, graph_replay

gpu = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# |got - fp64 reference| <= atol + rtol * |ref|: one rounding to the dtype plus fp32 arithmetic
TOL = {torch.float32: (2e-5, 1e-6), torch.float16: (1.5e-3, 1e-5), torch.bfloat16: (1e-2, 1e-5)}
# [rows..., hidden]: odd and non-power-of-two hidden sizes, M = 0 and 1; gpu: real sizes, rows
# longer than one block (16384) take the chunked path
SHAPES = [
    (7, 96), (3, 5, 100), (0, 64), (2, 1), (4, 1000),
    pytest.param((512, 4096), marks=gpu), pytest.param((33, 16384), marks=gpu),
    pytest.param((5, 40000), marks=gpu), pytest.param((300, 5120), marks=gpu),
]
QUANT = ["int8", "fp8_e4m3"]
# small tiles force the chunked (rows longer than one block) path on the small CPU shapes
LOOP = dict(max_block=64, loop_block=32)
LOOP_MAX_N = 100      # (the interpreter walks a chunk per step: keep forced-chunked rows short)


def _close(got, want64, dtype, what=""):
    rtol, atol = TOL[dtype]
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}"
    torch.testing.assert_close(got.double(), want64.double().to(dtype).double(), rtol=rtol, atol=atol,
                               equal_nan=True, msg=lambda m: f"{what} {dtype}: {m}")


def _x(shape, dtype, scale=2.0):
    return (torch.randn(shape, device=DEVICE) * scale + 0.3).to(dtype)


def _norm_args(shape, dtype, rms):
    N = shape[-1]
    w = (torch.randn(N, device=DEVICE) * 0.5 + 1).to(dtype)
    b = None if rms else (torch.randn(N, device=DEVICE) * 0.1).to(dtype)
    return _x(shape, dtype), w, b


def _norm_case(shape, dtype, rms, loop):
    """x, weight, bias (layer norm), residual; the chunked path is forced only on short rows."""
    if loop and shape[-1] > LOOP_MAX_N:
        pytest.skip("chunked path forced only on short rows")
    return (*_norm_args(shape, dtype, rms), _x(shape, dtype))


def _call_norm(rms, x, w, b, **kw):
    return qk.rms_norm(x, w, 1e-6, **kw) if rms else qk.layer_norm(x, w, b, 1e-5, **kw)


def _ref_norm(rms, x, w, b, compute_dtype=torch.float64, **kw):
    if rms:
        return ref.rms_norm(x, w, 1e-6, compute_dtype=compute_dtype, **kw)
    return ref.layer_norm(x, w, b, 1e-5, compute_dtype=compute_dtype, **kw)


def _assert_quant_of(q, s, y, fmt):
    """(q, s) is exactly quantize(y, fmt, "row"), by the reference and by the quantize kernel."""
    rq, rs, _ = ref.quantize(y, fmt, "row")
    assert_bit_exact(as_bits(q), as_bits(rq), "codes")
    assert_bit_exact(s, rs, "scales")
    if y.numel():
        qt = qk.quantize(y, fmt, "row")
        assert_bit_exact(as_bits(q), as_bits(qt.data), "codes vs quantize kernel")


# ---------------------------------------------------------------------------------------------
# norms


@pytest.mark.parametrize("loop", [False, True], ids=["one_block", "chunked"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
def test_norm_matches_reference(rms, dtype, shape, loop):
    x, w, b, r = _norm_case(shape, dtype, rms, loop)
    with tiles(**(LOOP if loop else {})), qk.poison_outputs():
        y = _call_norm(rms, x, w, b)
        y2, h = _call_norm(rms, x, w, b, residual=r)
    _close(y, _ref_norm(rms, x, w, b)[0], dtype, "y")
    assert_bit_exact(h, x + r, "residual out")          # the eager add, bit for bit
    _close(y2, _ref_norm(rms, x, w, b, residual=r)[0], dtype, "y with residual")


@pytest.mark.parametrize("loop", [False, True], ids=["one_block", "chunked"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [True, False], ids=["rms", "layer"])
def test_norm_quantize_bit_exact(rms, dtype, shape, loop):
    x, w, b, r = _norm_case(shape, dtype, rms, loop)
    with tiles(**(LOOP if loop else {})), qk.poison_outputs():
        y = _call_norm(rms, x, w, b)
        y2, _ = _call_norm(rms, x, w, b, residual=r)
        outs = {fmt: (_call_norm(rms, x, w, b, quantize=fmt), _call_norm(rms, x, w, b, residual=r, quantize=fmt))
                for fmt in QUANT}
    for fmt, ((q, s), (q2, s2, h2)) in outs.items():
        assert q.shape == x.shape and s.shape == (*x.shape[:-1], 1) and s.dtype == torch.float32
        _assert_quant_of(q, s, y, fmt)
        _assert_quant_of(q2, s2, y2, fmt)
        assert_bit_exact(h2, x + r, "residual out")
        # and close to quantizing the fp64 reference output (codes may differ by one step where y does)
        rq, rs = _ref_norm(rms, x, w, b, quantize_to=fmt)
        torch.testing.assert_close(s, rs, rtol=TOL[dtype][0], atol=0)


def test_norm_weight_and_bias_optional():
    x = _x((3, 40), torch.float16)
    _close(qk.rms_norm(x, None), ref.rms_norm(x, None, 1e-6, compute_dtype=torch.float64)[0], torch.float16)
    _close(qk.layer_norm(x, None, None), ref.layer_norm(x, None, None, 1e-5, compute_dtype=torch.float64)[0],
           torch.float16)
    # the fp32-weight / fp16-activation mix that HF models use: output stays in x's dtype
    w = torch.rand(40, device=DEVICE) + 0.5
    _close(qk.rms_norm(x, w), ref.rms_norm(x, w, 1e-6, compute_dtype=torch.float64)[0], torch.float16)


def test_norm_views_equal_contiguous():
    base = _x((6, 2 * 96), torch.float16)
    x = base[:, 10:106]                       # row stride 192, storage offset 10
    w = _x((96,), torch.float16)
    r = _x((96, 6), torch.float16).t()        # transposed: non-unit column stride
    assert_bit_exact(qk.rms_norm(x, w, residual=r)[0], qk.rms_norm(x.contiguous(), w, residual=r.contiguous())[0])
    q, s = qk.layer_norm(x, w, None, quantize="int8")
    q2, s2 = qk.layer_norm(x.contiguous(), w, None, quantize="int8")
    assert_bit_exact(q, q2)
    assert_bit_exact(s, s2)


def test_norm_nonfinite_and_zero_rows():
    x = _x((4, 64), torch.float32)
    x[0] = 0.0                                 # all-zero row: zeros out, scale 1.0
    x[1, 3] = float("nan")                     # NaN row: NaN out, quantized NaN -> 0 code, scale finite
    x[2, 5] = float("inf")
    y = qk.rms_norm(x, None)
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).any()
    assert torch.isfinite(y[3]).all()
    q, s = qk.rms_norm(x, None, quantize="int8")
    assert torch.isfinite(s).all() and s[0].item() == 1.0
    _assert_quant_of(q, s, y, "int8")
    # huge but finite: fp32 statistics must not overflow for fp16 inputs at the format limit
    big = torch.full((2, 4096), 60000.0, device=DEVICE, dtype=torch.float16)
    torch.testing.assert_close(qk.rms_norm(big, None).float(), torch.ones(2, 4096, device=DEVICE), rtol=1e-3, atol=0)


# ---------------------------------------------------------------------------------------------
# silu_and_mul


SILU_SHAPES = [(1, 128), (7, 2 * 96), (3, 5, 2 * 50), (0, 64), (2, 2),
               pytest.param((512, 2 * 14336), marks=gpu), pytest.param((3, 2 * 40000), marks=gpu)]


@pytest.mark.parametrize("loop", [False, True], ids=["one_block", "chunked"])
@pytest.mark.parametrize("shape", SILU_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul(dtype, shape, loop):
    if loop and shape[-1] > 2 * LOOP_MAX_N:
        pytest.skip("chunked path forced only on short rows")
    x = _x(shape, dtype, 3.0)
    with tiles(**(LOOP if loop else {}), silu_block=32 if loop else 1024), qk.poison_outputs():
        y = qk.silu_and_mul(x)
        outs = {fmt: qk.silu_and_mul(x, quantize=fmt) for fmt in QUANT}
    assert y.shape == (*shape[:-1], shape[-1] // 2)
    _close(y, ref.silu_and_mul(x, compute_dtype=torch.float64)[0], dtype, "silu_and_mul")
    for fmt, (q, s) in outs.items():
        _assert_quant_of(q, s, y, fmt)


def test_silu_and_mul_extremes():
    x = torch.tensor([[-1e4, 1e4, 0.0, float("-inf"), 2.0, 3.0, 4.0, 5.0]], device=DEVICE)
    y = qk.silu_and_mul(x)
    want = ref.silu_and_mul(x, compute_dtype=torch.float64)[0]
    assert torch.equal(y[0, :3].isfinite(), want[0, :3].isfinite())
    torch.testing.assert_close(y[0, :3], want[0, :3])


# ---------------------------------------------------------------------------------------------
# softmax


SOFTMAX_SHAPES = [(1, 64), (7, 96), (3, 5, 100), (0, 8), (4, 1), (2, 3, 2000),
                  pytest.param((512, 4096), marks=gpu), pytest.param((4, 32, 128, 128), marks=gpu),
                  pytest.param((3, 200000), marks=gpu)]


@pytest.mark.parametrize("loop", [False, True], ids=["one_block", "online"])
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax(dtype, shape, loop):
    if loop and shape[-1] > LOOP_MAX_N:
        pytest.skip("online path forced only on short rows")
    x = _x(shape, dtype, 4.0)
    with tiles(**(LOOP if loop else {})), qk.poison_outputs():
        got = {(sc, c): qk.softmax(x, scale=sc, causal=c) for sc in (1.0, 0.125) for c in (False, True)
               if not (c and x.dim() < 2)}
    for (sc, c), y in got.items():
        _close(y, ref.softmax(x, scale=sc, causal=c, compute_dtype=torch.float64), dtype, f"scale={sc} causal={c}")


@pytest.mark.parametrize("loop", [False, True], ids=["one_block", "online"])
def test_softmax_special_values(loop):
    x = torch.randn(6, 40, device=DEVICE) * 3
    x[0] = float("-inf")                        # all -inf: zeros, not NaN
    x[1, :20] = float("-inf")                   # partly -inf: those get 0
    x[2, 7] = float("nan")                      # NaN: NaN row (as torch)
    x[3, 9] = float("inf")                      # +inf: NaN row (as torch)
    x[4] = 3e38                                 # huge equal values: uniform, no overflow
    x[5, 0] = -3e38
    with tiles(**(LOOP if loop else {})):
        y = qk.softmax(x)
    want = ref.softmax(x, compute_dtype=torch.float64)
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    assert torch.equal(y[1, :20], torch.zeros(20, device=DEVICE))
    assert torch.isnan(y[2]).all() and torch.isnan(y[3]).all()
    assert torch.isnan(torch.softmax(x[2:4], -1)).all()        # the documented torch behaviour
    _close(y[[1, 4, 5]], want[[1, 4, 5]], torch.float32)
    torch.testing.assert_close(y[4], torch.full((40,), 1 / 40, device=DEVICE))
    fp16 = torch.tensor([[65504.0, -65504.0, 65504.0, 0.0]], device=DEVICE, dtype=torch.float16)
    assert torch.equal(qk.softmax(fp16), torch.tensor([[0.5, 0.0, 0.5, 0.0]], device=DEVICE, dtype=torch.float16))


def test_softmax_causal_masking():
    # Lq > Lk: the first Lq - Lk query rows see no key at all -> zeros
    x = torch.randn(2, 6, 4, device=DEVICE)
    y = qk.softmax(x, causal=True)
    assert torch.equal(y[:, :2], torch.zeros_like(y[:, :2]))
    _close(y, ref.softmax(x, causal=True, compute_dtype=torch.float64), torch.float32)
    # Lq < Lk (decode with a cache): query i sees keys j <= i + Lk - Lq
    x = torch.randn(3, 8, device=DEVICE)
    y = qk.softmax(x, causal=True)
    assert torch.equal(y[0, 6:], torch.zeros(2, device=DEVICE)) and y[2].gt(0).all()


def test_softmax_other_dim():
    x = _x((5, 7, 9), torch.float32)
    for d in (0, 1, -2):
        _close(qk.softmax(x, dim=d), ref.softmax(x, dim=d, compute_dtype=torch.float64), torch.float32, f"dim={d}")


# ---------------------------------------------------------------------------------------------
# property tests


@given(m=st.integers(0, 9), n=st.integers(1, 300), dtype=st.sampled_from(DTYPES), fmt=st.sampled_from(QUANT),
       mag=st.sampled_from([1e-3, 1.0, 300.0]), rms=st.booleans())
def test_property_norm_quantize(m, n, dtype, fmt, mag, rms):
    x = (torch.randn(m, n, device=DEVICE) * mag).to(dtype)
    w = torch.rand(n, device=DEVICE).to(dtype) + 0.5
    y = _call_norm(rms, x, w, w)
    q, s = _call_norm(rms, x, w, w, quantize=fmt)
    _assert_quant_of(q, s, y, fmt)
    _close(y, _ref_norm(rms, x, w, w)[0], dtype)


@given(m=st.integers(0, 6), n=st.integers(1, 200), dtype=st.sampled_from(DTYPES),
       scale=st.floats(-4, 4).filter(lambda v: abs(v) > 1e-3))
def test_property_softmax_rows_sum_to_one(m, n, dtype, scale):
    x = (torch.randn(m, n, device=DEVICE) * 5).to(dtype)
    y = qk.softmax(x, scale=scale).double()
    if m:
        torch.testing.assert_close(y.sum(-1), torch.ones(m, dtype=torch.float64, device=DEVICE),
                                   rtol=0, atol=n * TOL[dtype][0])
    _close(y.to(dtype), ref.softmax(x, scale=scale, compute_dtype=torch.float64), dtype)


# ---------------------------------------------------------------------------------------------
# errors, custom ops, compile, graphs


def test_bad_inputs():
    x = _x((4, 64), torch.float16)
    w = _x((64,), torch.float16)
    with pytest.raises(TypeError, match="x must have dtype"):
        qk.rms_norm(x.to(torch.int32), w)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        qk.rms_norm(x, w[:32])
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        qk.layer_norm(x, w, w[:10])
    with pytest.raises(ValueError, match="residual must have x's shape"):
        qk.rms_norm(x, w, residual=x[:2])
    with pytest.raises(TypeError, match="residual must have dtype"):
        qk.rms_norm(x, w, residual=x.float())
    with pytest.raises(ValueError, match="quantize must be None, 'int8' or 'fp8_e4m3', got 'int4'"):
        qk.rms_norm(x, w, quantize="int4")
    with pytest.raises(ValueError, match="eps must be a non-negative float"):
        qk.rms_norm(x, w, -1.0)
    with pytest.raises(RuntimeError, match="weight must be on the same device"):
        qk.rms_norm(x, w.to("meta"))
    with pytest.raises(ValueError, match="gate_up's last dim must be even"):
        qk.silu_and_mul(x[:, :63])
    with pytest.raises(ValueError, match="causal=True needs x of at least 2 dims"):
        qk.softmax(x[0], causal=True)
    with pytest.raises(ValueError, match="dim must be an int in"):
        qk.softmax(x, dim=2)
    with pytest.raises(ValueError, match="scale must be a finite float"):
        qk.softmax(x, scale=float("inf"))
    with pytest.raises(KeyError, match="unknown tile keys"):
        with tiles(block=3):
            pass


def test_opcheck():
    x = _x((5, 64), torch.float16)
    w = _x((64,), torch.float16)
    torch.library.opcheck(F._norm_op, (x, None, w, None, 1e-6, True, ""))
    torch.library.opcheck(F._norm_op, (x, x.clone(), w, w, 1e-5, False, "int8"))
    torch.library.opcheck(F._silu_and_mul_op, (x, "fp8_e4m3"))
    torch.library.opcheck(F._silu_and_mul_op, (x, ""))
    torch.library.opcheck(F._softmax_op, (x, 0.5, True, 5))


@gpu
def test_compile_fullgraph_and_graph_replay():
    x = _x((33, 4096), torch.bfloat16)
    w = _x((4096,), torch.bfloat16)
    r = _x((33, 4096), torch.bfloat16)

    def block(x, r):
        q, s, h = qk.rms_norm(x, w, residual=r, quantize="int8")
        return q, s, h, qk.silu_and_mul(h, quantize="fp8_e4m3")[0], qk.softmax(h, scale=0.1, causal=True)

    eager = block(x, r)
    compiled = torch.compile(block, fullgraph=True)(x, r)
    replayed = graph_replay(lambda: block(x, r))
    for a, b, c in zip(eager, compiled, replayed):
        assert_bit_exact(as_bits(b), as_bits(a), "compiled")
        assert_bit_exact(as_bits(c), as_bits(a), "graph replay")


def test_deterministic():
    x = _x((9, 300), torch.float16)
    a = qk.rms_norm(x, None, quantize="int8")
    b = qk.rms_norm(x, None, quantize="int8")
    assert_bit_exact(a[0], b[0])
    assert_bit_exact(qk.softmax(x), qk.softmax(x))


@pytest.mark.skipif(ON_GPU, reason="CPU-only: the interpreter runs the same kernels on the CPU")
def test_cpu_tensor_needs_interpreter_message():
    # under the interpreter CPU tensors are accepted; the message for a plain CPU is tested in
    # tests/ops/test_quant.py (check_kernel_device)
    assert qk.rms_norm(_x((2, 8), torch.float32), None).shape == (2, 8)

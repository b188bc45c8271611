"""quantize / dequantize / pack kernels vs qkernels.reference, bit for bit."""
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qkernels as qk
from qkernels import reference as ref

from ..conftest import DEVICE
from ..helpers import as_bits, assert_bit_exact

gpu = pytest.mark.gpu

DTYPES = ["int8", "int4", "fp8_e4m3", "fp8_e5m2"]
IN_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SCHEMES = [(d, g, s) for d in DTYPES for g in qk.GRANULARITIES for s in (True, False)
           if not (d.startswith("fp8") and not s)]
# (shape, group_size): small on the interpreter; the gpu-marked ones are real sizes.
SHAPES = [
    ((1, 64), 32),
    ((7, 96), 32),
    ((3, 5, 64), 16),
    pytest.param((512, 4096), 128, marks=gpu),
    pytest.param((300, 14336), 128, marks=gpu),
    pytest.param((33, 40000), 64, marks=gpu),      # rows longer than one block: two-pass path
]


def _x(shape, dtype, scale=3.0):
    return (torch.randn(shape, device=DEVICE) * scale).to(dtype)


def _check(x, dtype, gran, gs, sym, scale=None, zp=None):
    with qk.poison_outputs():
        qt = qk.quantize(x, dtype, gran, group_size=gs, symmetric=sym, scale=scale, zero_point=zp)
    r_data, r_scale, r_zp = ref.quantize(x, dtype, gran, gs, sym, scale, zp)
    assert_bit_exact(as_bits(qt.data), as_bits(r_data), "data")
    assert_bit_exact(qt.scale, r_scale, "scale")
    if sym:
        assert qt.zero_point is None
    else:
        assert_bit_exact(qt.zero_point, r_zp, "zero_point")
    assert qt.shape == x.shape
    return qt


@pytest.mark.parametrize("shape,gs", SHAPES)
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_dynamic_matches_reference(dtype, gran, sym, in_dtype, shape, gs):
    _check(_x(shape, in_dtype), dtype, gran, gs, sym)


@pytest.mark.parametrize("shape,gs", SHAPES)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_static_matches_reference(dtype, gran, sym, in_dtype, shape, gs):
    x = _x(shape, in_dtype)
    # scales from another tensor, halved: some values saturate
    _, s, zp = ref.quantize(_x(shape, torch.float32, 2.0), dtype, gran, gs, sym)
    _check(x, dtype, gran, gs, sym, scale=s * 0.5, zp=zp)


def test_round_half_to_even_goldens():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, -127.5, -128.5, 300.0, 3.4999998],
                     device=DEVICE)
    qt = qk.quantize(x, "int8", scale=1.0)
    assert qt.data.tolist() == [0, 2, 2, 0, -2, -2, 126, 127, -128, -128, 127, 3]
    # x * inv lands exactly on k + 0.5 with a non-unit scale: 2.5 * (1/0.5) = 5 exactly; 1.25 / 0.5 = 2.5 -> 2
    x = torch.tensor([1.25, 1.75, -1.25, 0.25], device=DEVICE)
    assert qk.quantize(x, "int8", scale=0.5).data.tolist() == [2, 4, -2, 0]
    # asymmetric: rounding happens before the zero point is added
    qt = qk.quantize(x, "int8", scale=0.5, symmetric=False, zero_point=torch.tensor(3, device=DEVICE))
    assert qt.data.tolist() == [5, 7, 1, 3]


def test_fp8_rounding_goldens():
    # e4m3 near 1: spacing 1/8. 1 + 1/16 is a tie -> even (1.0); 1 + 3/16 -> 1.25; 449 saturates to 448
    x = torch.tensor([1.0625, 1.1875, -1.0625, 449.0, 1e6, -1e6, 0.0], device=DEVICE)
    got = qk.quantize(x, "fp8_e4m3", scale=1.0).data.float().tolist()
    assert got == [1.0, 1.25, -1.0, 448.0, 448.0, -448.0, 0.0]
    # subnormals: smallest e4m3 subnormal is 2**-9; 1.5 * 2**-9 ties to 2 * 2**-9
    x = torch.tensor([2.0 ** -9, 1.5 * 2.0 ** -9, 2.0 ** -11], device=DEVICE)
    assert qk.quantize(x, "fp8_e4m3", scale=1.0).data.float().tolist() == [2.0 ** -9, 2.0 ** -8, 0.0]
    x = torch.tensor([60000.0, 1.125, 1.375], device=DEVICE)   # e5m2 spacing 0.25 near 1
    assert qk.quantize(x, "fp8_e5m2", scale=1.0).data.float().tolist() == [57344.0, 1.0, 1.5]


def test_fp8_every_code_round_trips():
    """Every finite fp8 value quantizes to itself with scale 1 (exercises every exponent)."""
    for dt, name in ((torch.float8_e4m3fn, "fp8_e4m3"), (torch.float8_e5m2, "fp8_e5m2")):
        vals = torch.arange(256, dtype=torch.uint8).view(dt).float()
        vals = vals[torch.isfinite(vals)].to(DEVICE)
        got = qk.quantize(vals, name, scale=1.0).data.float()
        assert torch.equal(got, vals), name
        back = qk.dequantize(qk.quantize(vals, name, scale=1.0))
        assert torch.equal(back, vals)


@pytest.mark.parametrize("dtype", DTYPES)
def test_saturation_and_infinities(dtype):
    fmt = qk.FORMATS[dtype]
    top = fmt.fp_max if fmt.is_float else fmt.qrange(True)[1]
    bottom = -fmt.fp_max if fmt.is_float else fmt.qrange(True)[0]
    # dynamic: infinities are left out of the statistics and saturate
    x = torch.tensor([[float("inf"), float("-inf"), 2.0, -1.0, 0.0, 0.5]], device=DEVICE)
    qt = _check(x, dtype, "row", 0, True)
    assert qt.scale.item() == pytest.approx(2.0 / fmt.q_sym)
    codes = qt.data if dtype != "int4" else qk.unpack_int4(qt.data)
    assert codes[0, :2].float().tolist() == [top, bottom]
    # static: finite values past the range saturate too
    x = torch.tensor([1e30, -1e30, 1e5, -1e5, float("inf"), float("-inf")], device=DEVICE)
    qt = _check(x, dtype, "tensor", 0, True, scale=torch.tensor(1.0, device=DEVICE))
    codes = qt.data if dtype != "int4" else qk.unpack_int4(qt.data)
    assert codes.float().tolist() == [top, bottom] * 3


@pytest.mark.parametrize("dtype,sym", [("int8", True), ("int8", False), ("int4", False), ("fp8_e4m3", True)])
def test_nan_inputs(dtype, sym):
    x = torch.tensor([[float("nan"), 2.0, -1.0, 0.5]], device=DEVICE)
    qt = _check(x, dtype, "row", 0, sym)
    deq = qt.dequantize()
    if qk.FORMATS[dtype].is_float:
        assert torch.isnan(deq[0, 0])
    else:
        assert deq[0, 0].item() == 0.0      # NaN -> zero point -> 0
    assert torch.isfinite(qt.scale).all()


@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_all_zero_rows(dtype, gran, sym):
    x = _x((4, 64), torch.float32)
    x[1] = 0.0
    qt = _check(x, dtype, gran, 16, sym)
    assert torch.isfinite(qt.scale).all() and (qt.scale > 0).all()
    if gran in ("row", "group"):
        assert (qt.scale[1] == 1.0).all()
    assert (qt.dequantize()[1] == 0).all()


@pytest.mark.parametrize("shape", [(0, 64), (0,), (3, 0), (2, 0, 8)])
@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_empty(dtype, gran, sym, shape):
    x = torch.randn(shape, device=DEVICE)
    qt = _check(x, dtype, gran, 8 if shape[-1] else 2, sym)
    assert qt.dequantize().shape == x.shape


@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_views_match_contiguous(dtype, gran, sym):
    base = _x((32, 256), torch.float16)
    views = [base[:, ::2], base[2:9, 64:192], base.t()[:64, :], base.view(4, 8, 256)[:, 1:3, :128]]
    for v in views:
        qt = _check(v, dtype, gran, 32, sym)
        qc = qk.quantize(v.contiguous(), dtype, gran, group_size=32, symmetric=sym)
        assert_bit_exact(as_bits(qt.data), as_bits(qc.data), "view vs contiguous")


@pytest.mark.parametrize("out_dtype", IN_DTYPES, ids=str)
@pytest.mark.parametrize("dtype,gran,sym", SCHEMES)
def test_dequantize_matches_reference(dtype, gran, sym, out_dtype):
    x = _x((6, 3, 64), torch.float32)
    qt = qk.quantize(x, dtype, gran, group_size=16, symmetric=sym)
    with qk.poison_outputs():
        got = qk.dequantize(qt, out_dtype)
    want = ref.dequantize(qt.data, qt.scale, qt.zero_point, x.shape, dtype, gran, 16, out_dtype)
    assert_bit_exact(got, want, "dequantized")


def test_seed_helpers():
    x = _x((16, 48), torch.float32)
    q, s = qk.quantize_tensor(x)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.dim() == 0 and s.dtype == torch.float32
    assert s.item() == pytest.approx(x.abs().max().item() / 127)
    back = qk.dequantize_tensor(q, s)
    assert back.dtype == torch.float32
    assert torch.equal(back, q.float() * s)
    assert (back - x).abs().max() <= s / 2 * (1 + 1e-6)


@pytest.mark.parametrize("shape", [(10,), (3, 64), (2, 5, 6), (0, 8), pytest.param((4096, 4096), marks=gpu)])
@pytest.mark.parametrize("signed", [True, False])
def test_pack_unpack(shape, signed):
    lo, hi = (-8, 8) if signed else (0, 16)
    q = torch.randint(lo, hi, shape, dtype=torch.int8 if signed else torch.uint8, device=DEVICE)
    with qk.poison_outputs():
        p = qk.pack_int4(q)
    assert_bit_exact(p, ref.pack_int4(q), "packed")
    with qk.poison_outputs():
        u = qk.unpack_int4(p, signed=signed)
    assert_bit_exact(u, q, "round trip")
    assert_bit_exact(u, ref.unpack_int4(p, signed), "unpacked vs reference")


def test_pack_layout_golden():
    q = torch.tensor([[1, -2, 7, -8]], dtype=torch.int8, device=DEVICE)
    assert qk.pack_int4(q).tolist() == [[0xE1, 0x87]]   # element 0 in the low nibble


def test_int4_quantize_is_packed_layout():
    x = _x((5, 32), torch.float32)
    qt = qk.quantize(x, "int4", "group", group_size=8)
    assert qt.data.shape == (5, 16) and qt.data.dtype == torch.uint8
    codes = qk.unpack_int4(qt.data, signed=True).float()
    assert torch.equal(codes.view(5, 4, 8) * qt.scale.view(5, 4, 1), qt.dequantize().view(5, 4, 8))


# ---------------------------------------------------------------------------------------------
# bad inputs: every message names the argument and says expected vs got


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(x="int"), TypeError, r"x must have dtype in .*got int32"),
    (dict(dtype="int3"), ValueError, r"dtype must be one of .*got 'int3'"),
    (dict(granularity="block"), ValueError, r"granularity must be one of .*got 'block'"),
    (dict(granularity="group", group_size=48), ValueError, r"divisible by group_size=48, got K=64"),
    (dict(granularity="group", group_size=0), ValueError, r"group_size must be a positive int, got 0"),
    (dict(dtype="fp8_e4m3", symmetric=False), ValueError, r"symmetric quantization only"),
    (dict(granularity="row", scale="bad_numel"), ValueError, r"scale for granularity='row' must have 4 element"),
    (dict(symmetric=False, scale=1.0), ValueError, r"needs zero_point"),
    (dict(zero_point=3), ValueError, r"zero_point was given without scale"),
    (dict(x="scalar"), ValueError, r"x must have at least 1 dimension"),
    (dict(x="odd", dtype="int4"), ValueError, r"must be even, got K=7"),
])
def test_quantize_bad_inputs(kwargs, exc, match):
    x = torch.randn(4, 64, device=DEVICE)
    args = dict(dtype="int8", granularity="tensor", group_size=128, symmetric=True, scale=None, zero_point=None)
    special = kwargs.pop("x", None)
    if special == "int":
        x = x.to(torch.int32)
    elif special == "scalar":
        x = x[0, 0]
    elif special == "odd":
        x = x[:, :7]
    args.update(kwargs)
    if args["scale"] == "bad_numel":
        args["scale"] = torch.ones(3, device=DEVICE)
    with pytest.raises(exc, match=match):
        qk.quantize(x, args.pop("dtype"), args.pop("granularity"), **args)


def test_pack_bad_inputs():
    with pytest.raises(ValueError, match=r"last dim must be even.*got 5"):
        qk.pack_int4(torch.zeros(2, 5, dtype=torch.int8, device=DEVICE))
    with pytest.raises(TypeError, match=r"q must have dtype in .*got float32"):
        qk.pack_int4(torch.zeros(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match=r"packed must have dtype in \(uint8\), got int8"):
        qk.unpack_int4(torch.zeros(2, 4, dtype=torch.int8, device=DEVICE))


@gpu
def test_mixed_devices():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(RuntimeError, match=r"scale must be on the same device as x"):
        qk.quantize(x, "int8", "row", scale=torch.ones(4))
    with pytest.raises(RuntimeError, match=r"x must be on a CUDA device, got cpu"):
        qk.quantize(x.cpu(), "int8")


# ---------------------------------------------------------------------------------------------
# property tests


@given(m=st.integers(0, 9), k_half=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
       gran=st.sampled_from(qk.GRANULARITIES), sym=st.booleans(), in_dtype=st.sampled_from(IN_DTYPES),
       magnitude=st.sampled_from([1e-30, 1e-3, 1.0, 1e4, 1e30]))
def test_property_matches_reference(m, k_half, dtype, gran, sym, in_dtype, magnitude):
    if dtype.startswith("fp8"):
        sym = True
    k = 2 * k_half
    gs = 2 if gran == "group" else 128
    x = (torch.randn(m, k, device=DEVICE) * magnitude).to(in_dtype)
    _check(x, dtype, gran, gs, sym)


@given(m=st.integers(1, 6), k=st.integers(1, 50), sym=st.booleans(), dtype=st.sampled_from(["int8", "int4"]),
       gran=st.sampled_from(["tensor", "row", "column"]), magnitude=st.floats(1e-6, 1e6))
def test_property_error_bound(m, k, sym, dtype, gran, magnitude):
    """In-range values come back within half a step: |x - dq(q(x))| <= scale / 2."""
    k += k % 2
    x = torch.randn(m, k, device=DEVICE) * magnitude
    qt = qk.quantize(x, dtype, gran, symmetric=sym)
    err = (qt.dequantize() - x).abs()
    scale = qt.scale if gran != "column" else qt.scale.view(1, -1)
    bound = scale / 2 * (1 + 1e-5) + x.abs() * 1e-6
    assert (err <= bound).all(), (err - bound).max()


@given(shape=st.lists(st.integers(0, 7), min_size=1, max_size=3), signed=st.booleans())
def test_property_pack_round_trip(shape, signed):
    shape[-1] *= 2
    lo, hi = (-8, 8) if signed else (0, 16)
    q = torch.randint(lo, hi, shape, dtype=torch.int8 if signed else torch.uint8, device=DEVICE)
    assert_bit_exact(qk.unpack_int4(qk.pack_int4(q), signed), q)


# ---------------------------------------------------------------------------------------------
# custom-op registration


@pytest.mark.parametrize("dtype,gran,sym", [("int8", "row", True), ("int4", "group", False),
                                            ("fp8_e4m3", "tensor", True), ("int8", "column", False)])
def test_opcheck(dtype, gran, sym):
    from qkernels.ops import quant as Q
    x = torch.randn(4, 32, device=DEVICE)
    gs = 8 if gran == "group" else 0
    # torch cannot multiply fp8 tensors (CPU or CUDA), which opcheck's schema test does
    tests = None if dtype in ("int8", "int4") else \
        ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(Q._quantize_dynamic_op, (x, dtype, gran, gs, sym), test_utils=tests or
                          torch.library._OPCHECK_DEFAULT_UTILS)
    data, s, zp = Q._quantize_dynamic_op(x, dtype, gran, gs, sym)
    torch.library.opcheck(Q._quantize_static_op, (x, dtype, gran, gs, sym, s, None if sym else zp),
                          test_utils=tests or torch.library._OPCHECK_DEFAULT_UTILS)
    torch.library.opcheck(Q._dequantize_op, (data, s, None if sym else zp, [4, 32], dtype, gran, gs, torch.float16),
                          test_utils=tests or torch.library._OPCHECK_DEFAULT_UTILS)
    q = torch.randint(-8, 8, (4, 16), dtype=torch.int8, device=DEVICE)
    torch.library.opcheck(Q._pack_int4_op, (q,))
    torch.library.opcheck(Q._unpack_int4_op, (Q._pack_int4_op(q), True))


def test_torch_compile_fullgraph():
    def f(x):
        qt = qk.quantize(x, "int8", "row")
        return qt.data, qt.scale, qk.dequantize(qt, torch.float16)

    x = _x((8, 64), torch.float16)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager" if not DEVICE.type == "cuda" else "inductor")
    for got, want in zip(compiled(x), f(x)):
        assert_bit_exact(got, want)


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_negative_zero_keeps_its_sign(dtype):
    # -0.0 and negatives that round to zero encode as 0x80, as torch's (and the GPU's) conversion does
    x = torch.tensor([[-0.0, 0.0, 1.0, -1e-9]], device=DEVICE)
    got = qk.quantize(x, dtype, "row").data.view(torch.uint8)
    want = ref.quantize(x, dtype, "row")[0].view(torch.uint8)
    assert_bit_exact(got, want)
    assert got[0, 0].item() == 0x80 and got[0, 1].item() == 0

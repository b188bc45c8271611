"""NaN / Inf and all-zero rows through every float-input op, with the behaviour RELIABILITY.md
documents (the same checks run under the CPU interpreter and on the GPU); saturation at the format
limits. The int32 accumulation limit is tested in tests/ops/test_gemm.py (K at the limit exact, one
above it refused), property bounds in tests/ops/test_quant.py and tests/ops/test_gemm.py."""
import pytest
import torch

import qkernels as qk
from qkernels.schemes import W4A8_MIN_M

from ..conftest import DEVICE
from .ops import FP8_OK

K, N = 64, 24
# row 0 clean, row 1 holds a NaN, row 2 a +inf, row 3 a -inf, row 4 all zeros
NAN, PINF, NINF, ZERO = 1, 2, 3, 4


def _x(dtype=torch.float16, k=K):
    x = (torch.randn(6, k, device=DEVICE) * 2).to(dtype)
    x[NAN, 5] = float("nan")
    x[PINF, 7] = float("inf")
    x[NINF, 9] = float("-inf")
    x[ZERO] = 0
    return x


def _finite_rows_unaffected(got, clean):
    """Rows 0 and 5 (finite inputs) equal the result computed without the bad rows."""
    assert torch.equal(got[[0, 5]].float(), clean.float())


def test_quantize_row_int8():
    x = _x()
    qt = qk.quantize(x, "int8", "row")
    assert torch.isfinite(qt.scale).all()                       # statistics ignore non-finite values
    assert qt.data[NAN, 5] == 0                                 # NaN -> the zero point
    assert qt.data[PINF, 7] == 127 and qt.data[NINF, 9] == -128  # +-inf saturate
    assert qt.scale[ZERO].item() == 1.0 and (qt.data[ZERO] == 0).all()
    _finite_rows_unaffected(qt.data, qk.quantize(x[[0, 5]], "int8", "row").data)


def test_quantize_fp8_saturates_and_keeps_nan():
    x = _x()
    qt = qk.quantize(x, "fp8_e4m3", "row")
    f = qt.data.float()
    assert torch.isnan(f[NAN, 5]) and f[PINF, 7] == 448 and f[NINF, 9] == -448
    assert torch.isfinite(qt.scale).all() and (f[ZERO] == 0).all()


def test_static_saturation_at_format_limits():
    x = torch.tensor([[1e6, -1e6, 3.0, -3.0]], device=DEVICE)
    assert qk.quantize(x, "int8", scale=1.0).data.tolist() == [[127, -128, 3, -3]]
    assert qk.quantize(x, "int4", scale=1.0).dequantize().tolist() == [[7.0, -8.0, 3.0, -3.0]]
    assert qk.quantize(x, "fp8_e4m3", scale=1.0).data.float().tolist() == [[448.0, -448.0, 3.0, -3.0]]
    zp = torch.tensor(128, dtype=torch.int32, device=DEVICE)
    assert qk.quantize(x, "int8", scale=1.0, symmetric=False, zero_point=zp).data.tolist() == [[255, 0, 131, 125]]


@pytest.mark.parametrize("scheme", ["w8a8", pytest.param("w8a8-fp8", marks=pytest.mark.skipif(not FP8_OK,
                                                                                             reason="fp8")),
                                    pytest.param("w4a8-fp8-g64", marks=pytest.mark.skipif(not FP8_OK, reason="fp8"))])
def test_w8a8_linear_quantizes_non_finite_activations(scheme):
    """Activation quantization maps NaN to 0 and +-inf to the format's limits, so the output row is
    finite for int8 (NaN stays NaN in fp8 and makes its row NaN). W4A8-FP8 quantizes its activations the same
    way."""
    x = _x()
    lin = torch.nn.Linear(K, N, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin, scheme)
    if scheme.startswith("w4a8"):
        few = ql(x)            # fewer than W4A8_MIN_M rows: W4A16's kernels, which propagate +-inf as w4a16 does
        assert torch.isnan(few[NAN]).all() and not torch.isfinite(few[[PINF, NINF]]).all(dim=1).any()
        x = torch.cat([x, (torch.randn(W4A8_MIN_M, K, device=DEVICE) * 2).half()])
        clean = x.clone()
        clean[[NAN, PINF, NINF]] = 1.0
        y = ql(x)
        _finite_rows_unaffected(y, ql(clean)[[0, 5]])        # the same call size: the same kernel
    else:
        y = ql(x)
        _finite_rows_unaffected(y, ql(x[[0, 5]]))
    assert torch.equal(y[ZERO], ql.bias)                         # all-zero row: exactly the bias
    if scheme == "w8a8":
        assert torch.isfinite(y).all()
    else:
        assert torch.isnan(y[NAN]).all() and torch.isfinite(y[[PINF, NINF]]).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_weight_only_propagates_non_finite(bits):
    x = _x()
    w = qk.PackedWeight.from_float(torch.randn(N, K, device=DEVICE, dtype=torch.float16) * 0.1, bits,
                                   32 if bits == 4 else -1, bits == 8)
    y = (qk.w4a16_linear if bits == 4 else qk.w8a16_linear)(x, w)
    _finite_rows_unaffected(y, (qk.w4a16_linear if bits == 4 else qk.w8a16_linear)(x[[0, 5]], w))
    assert not torch.isfinite(y[[NAN, PINF, NINF]]).all(dim=1).any()   # every bad row is non-finite
    assert (y[ZERO] == 0).all()


def test_norms_and_swiglu():
    x = _x()
    w = torch.rand(K, device=DEVICE, dtype=torch.float16) + 0.5
    for op in (lambda t: qk.rms_norm(t, w), lambda t: qk.layer_norm(t, w, None)):
        y = op(x)
        _finite_rows_unaffected(y, op(x[[0, 5]]))
        assert torch.isnan(y[NAN]).all()                 # a NaN makes the row's statistics NaN
        assert not torch.isfinite(y[PINF]).all() and not torch.isfinite(y[NINF]).all()
        assert (y[ZERO] == 0).all()                      # all-zero row: zeros (rstd finite through eps)
    q, s = qk.rms_norm(x, w, quantize="int8")
    assert torch.isfinite(s).all() and s[ZERO].item() == 1.0 and (q[ZERO] == 0).all()
    gu = _x(k=2 * K)                                     # bad values sit in the gate half
    g = qk.silu_and_mul(gu)
    _finite_rows_unaffected(g, qk.silu_and_mul(gu[[0, 5]]))
    assert torch.isnan(g[NAN, 5]) and torch.isnan(g[NINF, 9])       # silu(-inf) = -inf * 0: NaN, as torch
    assert torch.isinf(g[PINF, 7]) == torch.isfinite(gu[PINF, K + 7]) & (gu[PINF, K + 7] != 0)
    for r, c in ((NAN, 5), (PINF, 7), (NINF, 9)):
        others = torch.ones(K, dtype=torch.bool, device=DEVICE)
        others[c] = False
        assert torch.isfinite(g[r][others]).all()       # one bad gate value spoils one output only
    assert (g[ZERO] == 0).all()
    assert torch.isnan(torch.nn.functional.silu(torch.tensor(float("-inf"))))   # the torch behaviour we match

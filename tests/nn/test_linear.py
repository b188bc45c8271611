"""QuantizedLinear (nn/linear.py) with the w4a8-fp8 scheme: W4A16's storage, FP8 activations from W4A8_MIN_M rows."""
import pytest
import torch

from qkernels import reference as ref
from qkernels.nn.linear import QuantizedLinear
from qkernels.ops import w4a8
from qkernels.schemes import W4A8_MIN_M, WeightOnly

from ..conftest import DEVICE, ON_GPU


def _layer(N=96, K=256, bias=True, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias).to(DEVICE, torch.float16)
    return lin, QuantizedLinear.from_linear(lin, "w4a8-fp8")


def test_w4a8_layer_runs_w4a8_from_min_rows_and_w4a16_below():
    lin, q = _layer()
    assert q.scheme == WeightOnly(4, 128, False, fp8_act=True)
    w4 = QuantizedLinear.from_linear(lin, "w4a16")
    assert torch.equal(q.qweight, w4.qweight) and torch.equal(q.scale_zero, w4.scale_zero)    # the same weights
    x = torch.randn(3, 5, 256, device=DEVICE, dtype=torch.float16)
    y = q(x)
    want = w4a8.w4a8_linear(x, q.packed_weight(), q.bias)
    assert torch.equal(y, want)
    one = x[:1, :1]
    assert one.numel() < W4A8_MIN_M * 256
    assert torch.equal(q(one), w4(one))                     # a single token: W4A16's kernel
    r = ref.w4a8_linear(x, q.qweight, q.scales, q.zeros, q.group_size, q.perm, q.bias)
    assert ((y.float() - r.float()).norm() / r.float().norm()).item() < 2e-3


def test_w4a8_swiglu_and_state_dict():
    _, q = _layer(N=128, bias=False, seed=1)
    x = torch.randn(W4A8_MIN_M + 3, 256, device=DEVICE, dtype=torch.float16)
    g, u = q(x).float().chunk(2, dim=-1)
    want = (torch.nn.functional.silu(g.half().float()) * u.half().float()).half()
    assert ((q.forward_swiglu(x).float() - want.float()).norm() / want.float().norm()).item() < 2e-3
    fresh = QuantizedLinear(256, 128, bias=False, scheme="w4a8-fp8", device=DEVICE)
    fresh.load_state_dict(q.state_dict())
    assert fresh.scheme.name == "w4a8-fp8" and torch.equal(fresh(x), q(x))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="the GPU's table decides W4A8 or W4A16 per shape")
@pytest.mark.parametrize("N, K, M", [(4096, 4096, 16), (12288, 2048, 32), (1000, 512, 11)])
def test_w4a8_layer_compiles_in_one_graph(N, K, M):
    """torch.compile(fullgraph=True) over the layer: one graph, running W4A8 (the per-shape table, which may send an
    eager call to W4A16's kernels, is not read in a trace)."""
    torch.manual_seed(2)
    lin = torch.nn.Linear(K, N, bias=True).to(DEVICE, torch.float16)
    q = QuantizedLinear.from_linear(lin, "w4a8-fp8")
    x = torch.randn(M, K, device=DEVICE, dtype=torch.float16)
    want = w4a8.w4a8_linear(x, q.packed_weight(), q.bias)
    assert torch.equal(torch.compile(q, fullgraph=True)(x), want)

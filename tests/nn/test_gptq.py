"""GPTQ: one matrix against round-to-nearest, the model walk, act-order through the kernels."""
import pytest
import torch

from qkernels import reference as ref
from qkernels.nn import QuantizedLinear
from qkernels.nn.convert import quantize_
from qkernels.nn.gptq import Hessian, gptq_weight
from qkernels.packed_weight import PackedWeight

from ..conftest import DEVICE


def _inputs(T, K, seed):
    """Correlated inputs with a few loud channels, as a linear in a transformer sees."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g) @ (torch.eye(K) + 0.3 * torch.randn(K, K, generator=g))
    x[:, torch.randperm(K, generator=g)[:4]] *= 6
    return x


def _err(x, w, wq):
    return ((x @ (w - wq).t()) ** 2).mean().item()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (4, 64, True), (4, 128, False), (4, -1, False),
                                                       (8, -1, True), (8, 64, False)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_error_below_round_to_nearest(seed, bits, group_size, symmetric, act_order):
    N, K = 48, 256
    x = _inputs(512, K, seed)
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed + 100))
    h = Hessian(K, "cpu")
    for part in x.split(100):                     # the running average over uneven batches
        h.add(part)
    torch.testing.assert_close(h.H, 2 * x.t() @ x / x.shape[0], rtol=1e-4, atol=1e-3)
    pw, dq = gptq_weight(w, h.H, bits, group_size, symmetric, act_order=act_order, scale_dtype=torch.float16)
    rtn = PackedWeight.from_float(w, bits, group_size, symmetric, scale_dtype=torch.float16).dequantize()
    assert _err(x, w, dq) < 0.9 * _err(x, w, rtn)
    assert torch.equal(pw.dequantize(), dq)       # the packed weight is what the calibration saw
    assert (pw.perm is not None) == (act_order and group_size not in (-1,))


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (4, 128, True), (8, -1, True)])
def test_diagonal_hessian_gives_round_to_nearest_exactly(bits, group_size, symmetric):
    """Uncorrelated inputs: no error can be compensated; GPTQ's codes and scales are from_float's, bit for bit."""
    w = torch.randn(40, 256)
    H = torch.diag(torch.rand(256) + 0.5)
    pw, _ = gptq_weight(w, H, bits, group_size, symmetric, search_grid=False, scale_dtype=torch.float16)
    rtn = PackedWeight.from_float(w, bits, group_size, symmetric, scale_dtype=torch.float16)
    assert torch.equal(pw.qweight, rtn.qweight) and torch.equal(pw.scale_zero, rtn.scale_zero)


def test_dead_input_channels_and_singular_hessian():
    K = 128
    x = _inputs(300, K, 5)
    x[:, :10] = 0                       # channels that never fire
    x[:, 20] = x[:, 21]                 # and a duplicated one: H is singular
    h = Hessian(K, "cpu")
    h.add(x)
    w = torch.randn(32, K)
    pw, dq = gptq_weight(w, h.H, 4, 32, False)
    assert torch.isfinite(dq).all()
    assert (dq[:, :10] == 0).all()      # no information: quantized to zero
    assert _err(x, w, dq) < _err(x, w, PackedWeight.from_float(w, 4, 32, False).dequantize())


def test_static_groups_keep_input_order():
    x = _inputs(400, 128, 3)
    h = Hessian(128, "cpu")
    h.add(x)
    w = torch.randn(16, 128)
    pw, dq = gptq_weight(w, h.H, 4, 32, False, act_order=True, static_groups=True)
    assert pw.perm is None and torch.equal(pw.dequantize(), dq)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_act_order_layer_runs_through_the_kernels(dtype):
    """A GPTQ act-order weight (permuted groups) through QuantizedLinear's kernels equals the reference."""
    K, N = 256, 64
    x = _inputs(64, K, 7)
    h = Hessian(K, "cpu")
    h.add(x)
    pw, _ = gptq_weight(torch.randn(N, K), h.H, 4, 64, False, act_order=True, scale_dtype=dtype)
    assert pw.perm is not None
    q = QuantizedLinear.from_packed(pw.to(DEVICE)).to(DEVICE)
    xs = torch.randn(5, K, device=DEVICE, dtype=dtype)
    got = q(xs)
    want = ref.weight_only_linear(xs, pw.qweight.to(DEVICE), pw.scales.to(DEVICE), pw.zeros.to(DEVICE), 4, 64,
                                  pw.perm.to(DEVICE))
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < (4e-3 if dtype == torch.bfloat16 else 1e-3), err      # output rounding and summation order


transformers = pytest.importorskip("transformers")


def _tiny_llama():
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(3)
    return transformers.LlamaForCausalLM(cfg).eval().to(torch.bfloat16)


def test_quantize_gptq_model_beats_rtn_and_merges_in_the_runtime():
    import copy

    from qkernels.models import from_pretrained
    base = _tiny_llama()
    calib = [torch.randint(0, 96, (2, 48)) for _ in range(3)]
    held = torch.randint(0, 96, (2, 48))
    with torch.no_grad():
        want = base(held).logits.float()
    errs = {}
    for method in ("rtn", "gptq"):
        m = copy.deepcopy(base)
        kw = dict(method=method, calibration=calib, act_order=True) if method == "gptq" else {}
        quantize_(m, "w4a16", group_size=32, progress=False, **kw)
        assert sum(isinstance(x, QuantizedLinear) for x in m.modules()) == 8   # q|k|v, gate|up fused (nn.fused)
        with torch.no_grad():
            errs[method] = ((m(held).logits.float() - want).norm() / want.norm()).item()
        if method == "gptq":
            # q|k|v and gate|up share H, so act-order gives them one permutation: merged GEMMs in the runtime
            rt = from_pretrained(m, device="cpu", dtype=torch.bfloat16)
            assert isinstance(rt.layers[0].attention.wqkv, QuantizedLinear)
            assert isinstance(rt.layers[0].feed_forward.w_gate_up, QuantizedLinear)
            assert rt.layers[0].attention.wqkv.perm is not None
    assert errs["gptq"] < errs["rtn"], errs


def test_quantize_method_arguments_are_checked():
    m = _tiny_llama()
    ids = torch.randint(0, 96, (1, 8))
    with pytest.raises(ValueError, match="method must be one of"):
        quantize_(m, "w4a16", method="hqq", calibration=ids)
    with pytest.raises(ValueError, match="method 'gptq' needs calibration"):
        quantize_(m, "w4a16", method="gptq")
    with pytest.raises(ValueError, match="applies to the weight-only schemes"):
        quantize_(m, "w8a8", method="gptq", calibration=ids)
    with pytest.raises(ValueError, match="act_order applies to method='gptq'"):
        quantize_(m, "w4a16", act_order=True)
    with pytest.raises(ValueError, match="calibration batch 0 must be"):
        quantize_(m, "w4a16", method="gptq", calibration=[torch.randn(1, 8)])
    assert not any(isinstance(x, QuantizedLinear) for x in m.modules())     # nothing was converted

"""AWQ: folded scales keep the float model's function; the search beats round-to-nearest on outlier inputs."""
import copy

import pytest
import torch

from qkernels.nn.awq import awq_, fake_quantize, search_clip, search_scale
from qkernels.packed_weight import PackedWeight

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("bits,group_size,symmetric", [(4, 32, False), (4, 128, True), (8, -1, True)])
def test_fake_quantize_is_from_float(bits, group_size, symmetric):
    w = torch.randn(24, 256)
    want = PackedWeight.from_float(w, bits, group_size, symmetric, scale_dtype=torch.float16).dequantize()
    assert torch.equal(fake_quantize(w, bits, group_size, symmetric, torch.float16), want)


def _outlier_inputs(T, K, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g)
    x[:, torch.randperm(K, generator=g)[:K // 32]] *= 30      # a few salient channels
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group_size", [32, 128])
def test_scale_and_clip_search_beat_round_to_nearest(seed, group_size):
    K, N = 256, 64
    x = _outlier_inputs(1024, K, seed)
    lin = torch.nn.Linear(K, N, bias=False)
    w = lin.weight.detach().clone()
    err = lambda wq: ((x @ (w - wq).t()) ** 2).mean().item()  # noqa: E731
    rtn = err(fake_quantize(w, 4, group_size, False, torch.float16))
    s = search_scale(x, [lin], 4, group_size, False, torch.float16)
    scaled = fake_quantize(w * s, 4, group_size, False, torch.float16) / s
    assert err(scaled) < 0.8 * rtn
    bound = search_clip(x, w, 4, group_size, False, torch.float16)
    assert (bound <= w.reshape(N, -1, group_size).abs().amax(-1)).all()
    clipped = torch.maximum(torch.minimum(w.reshape(N, -1, group_size), bound[..., None]), -bound[..., None])
    assert err(fake_quantize(clipped.reshape(N, K), 4, group_size, False, torch.float16)) <= rtn


def _tiny(kind="llama", **over):
    kw = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=128, **over)
    cfg = transformers.LlamaConfig(**kw) if kind == "llama" else transformers.Qwen2Config(**kw)
    torch.manual_seed(4)
    m = (transformers.LlamaForCausalLM if kind == "llama" else transformers.Qwen2ForCausalLM)(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("kind,over", [("llama", {"num_key_value_heads": 4}), ("llama", {"num_key_value_heads": 2}),
                                       ("qwen2", {"num_key_value_heads": 4})])
def test_folded_scales_keep_the_float_function(kind, over):
    """Scales only (no clipping): every producer / consumer pair is rescaled (v_proj -> o_proj only without
    grouped-query attention), and the fp32 model computes the same logits up to rounding."""
    m = _tiny(kind, **over)
    calib = [torch.randint(0, 96, (2, 32)) for _ in range(2)]
    ids = torch.randint(0, 96, (2, 20))
    with torch.no_grad():
        want = m(ids).logits
    before = {n: p.clone() for n, p in m.named_parameters()}
    mm = copy.deepcopy(m)
    n = awq_(mm, calib, 4, 32, False, clip=False)
    assert n == (7 if over["num_key_value_heads"] == 4 else 6) * 2
    with torch.no_grad():
        got = mm(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    changed = [k for k, p in mm.named_parameters() if not torch.equal(p, before[k])]
    assert any("input_layernorm" in k for k in changed) and any("down_proj" in k for k in changed)


def test_quantize_awq_model_beats_rtn():
    from qkernels.nn.convert import quantize_
    base = _tiny(num_key_value_heads=2).to(torch.bfloat16)
    with torch.no_grad():      # salient input channels, as trained models have
        for layer in base.model.layers:
            layer.input_layernorm.weight[:4] *= 20
            layer.post_attention_layernorm.weight[:4] *= 20
    calib = [torch.randint(0, 96, (2, 48)) for _ in range(3)]
    held = torch.randint(0, 96, (2, 48))
    with torch.no_grad():
        want = base(held).logits.float()
    errs = {}
    for method in ("rtn", "awq"):
        m = copy.deepcopy(base)
        kw = dict(method=method, calibration=calib) if method != "rtn" else {}
        quantize_(m, "w4a16", group_size=32, progress=False, **kw)
        with torch.no_grad():
            errs[method] = ((m(held).logits.float() - want).norm() / want.norm()).item()
    assert errs["awq"] < errs["rtn"], errs

"""Fused decoder-block modules (src/qkernels/nn/fused.py) and their wiring by quantize_."""
import json

import pytest
import torch
from torch import nn

import qkernels as qk
from qkernels import reference as ref
from qkernels.nn import QuantizedLinear
from qkernels.nn.convert import CONFIG_NAME, load_quantized, quantize_, save_quantized
from qkernels.nn.fused import QKVPart, QuantizedMLP, RMSNorm, fusable, fuse_qkv_, linear_count
from tests.conftest import DEVICE, ON_GPU
from tests.helpers import assert_bit_exact, rel_err

FP8_OK = not ON_GPU or torch.cuda.get_device_capability() >= (8, 9)
W8A8 = ["w8a8", pytest.param("w8a8-fp8", marks=pytest.mark.skipif(not FP8_OK, reason="fp8 needs sm_89+"))]


def _tiny(arch: str):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    else:
        cfg, cls = transformers.Qwen3Config(head_dim=16, **common), transformers.Qwen3ForCausalLM
    model = cls(cfg).to(DEVICE, torch.float16).eval()
    with torch.no_grad():          # norm weights are ones at init: make them matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(torch.rand_like(p) + 0.5)
    return model, cfg


def _copy(model, cfg):
    other = type(model)(cfg).to(DEVICE, torch.float16).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("scheme", W8A8)
def test_fused_model_matches_unfused(arch, scheme):
    model, cfg = _tiny(arch)
    plain = _copy(model, cfg)
    ids = torch.randint(0, 128, (2, 7), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits
        quantize_(model, scheme, progress=False)               # fuse=True is the default
        quantize_(plain, scheme, progress=False, fuse=False)
        got, unfused = model(ids).logits, plain(ids).logits
    for layer in model.model.layers:
        assert isinstance(layer.mlp, QuantizedMLP) and isinstance(layer.post_attention_layernorm, nn.Identity)
        assert isinstance(layer.input_layernorm, RMSNorm)
    assert isinstance(model.model.norm, RMSNorm)
    assert not any(isinstance(m, (RMSNorm, QuantizedMLP)) for m in plain.modules())
    assert sum(isinstance(m, QuantizedLinear) for m in model.modules()) == 2 * 4      # q|k|v, o, gate|up, down
    assert linear_count(model) == linear_count(plain) == 2 * 7
    # same quantization points, different rounding of the SwiGLU (one rounding instead of two)
    assert rel_err(got, unfused) < (0.02 if scheme == "w8a8" else 0.05)
    assert rel_err(got, want) < (0.03 if scheme == "w8a8" else 0.08)


@pytest.mark.parametrize("scheme", W8A8)
def test_quantized_mlp_is_the_fused_ops(scheme):
    model, _ = _tiny("llama")
    layer = model.model.layers[0]
    norm, mlp = layer.post_attention_layernorm, layer.mlp
    assert fusable(layer)
    qm = QuantizedMLP.from_modules(norm, mlp, scheme)
    h = torch.randn(3, 5, 64, device=DEVICE, dtype=torch.float16)
    fmt = "int8" if scheme == "w8a8" else "fp8_e4m3"
    dt = "int8" if scheme == "w8a8" else "fp8"
    with qk.poison_outputs():
        got = qm(h)
    assert_bit_exact(got, _chain(qm, h, fmt, dt, qk.rms_norm, qk.silu_and_mul, qk.w8a8_linear, "quantize"))
    # the gate|up GEMM is the two GEMMs stacked: per-channel weight scales are per row either way
    gq = QuantizedLinear.from_linear(mlp.gate_proj, scheme)
    assert_bit_exact(qm.gate_up_proj.weight[:96], gq.weight)
    # the float model's MLP, within quantization error
    with torch.no_grad():
        flt = mlp(norm(h))
    assert rel_err(got, flt) < (0.03 if scheme == "w8a8" else 0.1)
    # and the pure-torch twin chain the module runs on a plain CPU
    twin = _chain(qm, h, fmt, dt, ref.rms_norm, ref.silu_and_mul, ref.w8a8_linear, "quantize_to")
    assert rel_err(got, twin) < 0.01


def _chain(qm, h, fmt, dt, rms_norm, silu_and_mul, w8a8_linear, qkw):
    """norm + quantize -> gate|up GEMM -> silu*up + quantize -> down GEMM, with the given ops."""
    q, s = rms_norm(h, qm.norm.weight, qm.norm.variance_epsilon, **{qkw: fmt})[:2]
    gu = w8a8_linear(q, qm.gate_up_proj.weight, qm.gate_up_proj.weight_scale, dtype=dt, x_scale=s, out_dtype=h.dtype)
    q2, s2 = silu_and_mul(gu, **{qkw: fmt})[:2]
    return w8a8_linear(q2, qm.down_proj.weight, qm.down_proj.weight_scale, dtype=dt, x_scale=s2, out_dtype=h.dtype)


def test_rms_norm_module_matches_hf():
    model, _ = _tiny("qwen3")
    hf = model.model.layers[0].self_attn.q_norm        # head_dim 16
    ours = RMSNorm.from_module(hf)
    x = torch.randn(2, 3, 4, 16, device=DEVICE, dtype=torch.float16) * 3
    with torch.no_grad():
        assert rel_err(ours(x), hf(x)) < 2e-3           # HF rounds twice (before and after the weight)


def test_fused_save_load_round_trip(tmp_path):
    model, cfg = _tiny("qwen3")
    quantize_(model, "w8a8", progress=False)
    ids = torch.randint(0, 128, (1, 6), device=DEVICE)
    save_quantized(model, tmp_path)
    loaded = load_quantized(cfg, tmp_path, device=DEVICE).eval()
    assert isinstance(loaded.model.layers[1].mlp, QuantizedMLP)
    assert isinstance(loaded.model.layers[1].self_attn.k_norm, RMSNorm)
    with torch.no_grad():
        assert_bit_exact(loaded(ids).logits, model(ids).logits)


def test_fuse_respects_skip_and_non_swiglu():
    model, _ = _tiny("llama")
    quantize_(model, "w8a8", skip=("lm_head", "layers.1.mlp.down_proj"), progress=False)
    assert isinstance(model.model.layers[0].mlp, QuantizedMLP)
    assert not isinstance(model.model.layers[1].mlp, QuantizedMLP)          # one of its linears is skipped
    assert type(model.model.layers[1].mlp.down_proj) is nn.Linear
    assert isinstance(model.model.layers[1].mlp.gate_proj, QuantizedLinear)
    model, _ = _tiny("llama")
    model.model.layers[0].mlp.act_fn = nn.GELU()
    assert not fusable(model.model.layers[0])
    # weight-only schemes fuse too (gate|up with SwiGLU in one call); a skipped projection keeps its layer's MLP
    model, _ = _tiny("llama")
    quantize_(model, "w4a16", group_size=32, skip=("lm_head", "layers.1.mlp.up_proj"), progress=False)
    assert isinstance(model.model.layers[0].input_layernorm, RMSNorm)
    assert isinstance(model.model.layers[0].mlp, QuantizedMLP)
    assert type(model.model.layers[1].mlp.up_proj) is nn.Linear


WEIGHT_ONLY = [("w4a16", dict(group_size=32)), ("w8a16", {}),
               ("w4a16", dict(group_size=32, method="gptq", act_order=True))]


@pytest.mark.parametrize("scheme,kw", WEIGHT_ONLY, ids=["w4a16", "w8a16", "w4a16-gptq-act"])
def test_weight_only_fused_model_matches_unfused(scheme, kw):
    """The fused MLP holds the unfused layers' codes (gate|up concatenated, whatever method made them) and
    computes the same function: norm kernel, gate|up with SwiGLU, down."""
    model, cfg = _tiny("qwen3")
    plain = _copy(model, cfg)
    ids = torch.randint(0, 128, (2, 7), device=DEVICE)
    if kw.get("method"):
        kw = dict(kw, calibration=torch.randint(0, 128, (2, 16), device=DEVICE))
    with torch.no_grad():
        want = model(ids).logits
        quantize_(model, scheme, progress=False, **kw)
        quantize_(plain, scheme, progress=False, fuse=False, **kw)
        got, unfused = model(ids).logits, plain(ids).logits
    for layer, ref_layer in zip(model.model.layers, plain.model.layers):
        assert isinstance(layer.mlp, QuantizedMLP) and isinstance(layer.post_attention_layernorm, nn.Identity)
        g, u = ref_layer.mlp.gate_proj, ref_layer.mlp.up_proj
        assert_bit_exact(layer.mlp.gate_up_proj.qweight, torch.cat([g.qweight, u.qweight]))
        assert_bit_exact(layer.mlp.gate_up_proj.scale_zero, torch.cat([g.scale_zero, u.scale_zero]))
        assert_bit_exact(layer.mlp.down_proj.qweight, ref_layer.mlp.down_proj.qweight)
    # the same weights; the norm's and SwiGLU's roundings differ from the model's eager ops, and the fused model is
    # as close to the float one as the unfused
    assert rel_err(got, unfused) < 0.02
    assert rel_err(got, want) < 1.1 * rel_err(unfused, want) + 0.005


def test_weight_only_quantized_mlp_is_its_ops():
    model, _ = _tiny("llama")
    quantize_(model, "w4a16", group_size=32, progress=False)
    qm = model.model.layers[0].mlp
    h = torch.randn(3, 5, 64, device=DEVICE, dtype=torch.float16)
    with qk.poison_outputs(), torch.no_grad():
        got = qm(h)
        y = qk.rms_norm(h, qm.norm.weight, qm.norm.variance_epsilon)
        gu = qk.w4a16_linear(y, qm.gate_up_proj.packed_weight())
        want = qk.w4a16_linear(qk.silu_and_mul(gu), qm.down_proj.packed_weight())
    assert rel_err(got, want) < 1e-3        # SwiGLU in the GEMV's epilogue or after the product: same roundings


def test_weight_only_fused_save_load_and_gptq_round_trip(tmp_path):
    model, cfg = _tiny("llama")
    quantize_(model, "w4a16", group_size=32, symmetric=True, progress=False)
    ids = torch.randint(0, 128, (1, 6), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits
    save_quantized(model, tmp_path / "qk")
    loaded = load_quantized(cfg, tmp_path / "qk", device=DEVICE).eval()
    assert isinstance(loaded.model.layers[1].mlp, QuantizedMLP)
    with torch.no_grad():
        assert_bit_exact(loaded(ids).logits, want)
    # the GPTQ format writes the model's own modules (gate / up / down, post_attention_layernorm)
    save_quantized(model, tmp_path / "gptq", format="gptq")
    back = qk.load_pretrained(tmp_path / "gptq", device=DEVICE)
    assert isinstance(back.model.layers[0].mlp.gate_proj, QuantizedLinear)
    assert isinstance(back.model.layers[0].self_attn.k_proj, QuantizedLinear)       # q|k|v written separately
    for a, b in zip(back.model.layers, model.model.layers):
        assert_bit_exact(torch.cat([getattr(a.self_attn, p + "_proj").qweight for p in "qkv"]),
                         b.self_attn.qkv_proj.qweight)
    for a, b in zip(back.model.layers, model.model.layers):
        assert_bit_exact(a.post_attention_layernorm.weight, b.mlp.norm.weight)
        assert_bit_exact(torch.cat([a.mlp.gate_proj.qweight, a.mlp.up_proj.qweight]), b.mlp.gate_up_proj.qweight)
    with torch.no_grad():
        assert rel_err(back(ids).logits.float(), want.float()) < 0.02


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("scheme,kw", [("w8a8", {}), ("w4a16", dict(group_size=32))], ids=["w8a8", "w4a16"])
def test_fused_qkv_is_the_merged_product(arch, scheme, kw):
    """quantize_ runs an attention's q / k / v as one layer holding the three layers' codes; each projection is its
    slice of that product, bit for bit, whatever order the parts are called in; nothing is held once all three are
    taken; a part called with another input computes that input's product."""
    model, cfg = _tiny(arch)
    plain = _copy(model, cfg)
    quantize_(model, scheme, progress=False, **kw)
    quantize_(plain, scheme, progress=False, fuse=False, **kw)
    names = ["qweight", "scale_zero"] if scheme == "w4a16" else ["weight", "weight_scale"]
    for layer, other in zip(model.model.layers, plain.model.layers):
        attn, sep = layer.self_attn, other.self_attn
        assert all(isinstance(getattr(attn, n), QKVPart) for n in ("q_proj", "k_proj", "v_proj"))
        for n in names:
            parts = [getattr(getattr(sep, p + "_proj"), n) for p in "qkv"]
            assert_bit_exact(getattr(attn.qkv_proj, n), torch.cat(parts))
    assert not any(k.endswith(("q_proj.weight", "q_proj.qweight")) for k in model.state_dict())
    attn = model.model.layers[1].self_attn
    shared = attn.q_proj.shared
    x = torch.randn(3, 5, 64, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        full = attn.qkv_proj(x)
        q, k, v = full.split(list(shared.sizes), dim=-1)
        got_v, got_q, got_k = attn.v_proj(x), attn.q_proj(x), attn.k_proj(x)
        assert shared._cache is None          # all three taken
        for got, want in ((got_q, q), (got_k, k), (got_v, v)):
            assert_bit_exact(got, want)
        sep = plain.model.layers[1].self_attn
        assert rel_err(got_k, sep.k_proj(x)) < 2e-3           # the separate layer: same codes, its own GEMM
        y = torch.randn_like(x)
        assert_bit_exact(attn.q_proj(x), q)
        assert_bit_exact(attn.k_proj(y), attn.qkv_proj(y).split(list(shared.sizes), dim=-1)[1])   # not x's slice
    assert attn.k_proj.layer().out_features == shared.sizes[1]
    assert_bit_exact(getattr(attn.k_proj.layer(), names[0]), getattr(sep.k_proj, names[0]))


def test_fused_qkv_traces_whole_and_holds_nothing():
    """torch.compile (fullgraph) traces the three parts as one product with no break, as the Hugging Face compiled
    path runs them, and leaves no tensor behind."""
    model, _ = _tiny("llama")
    quantize_(model, "w4a16", group_size=32, progress=False)
    ids = torch.randint(0, 128, (2, 7), device=DEVICE)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        want = model(ids).logits
        got = compiled(ids).logits
    assert_bit_exact(got, want)
    for layer in model.model.layers:
        shared = layer.self_attn.q_proj.shared
        assert shared._cache is None


def test_fused_qkv_save_load(tmp_path):
    """save_quantized / load_quantized keep q|k|v fused (bit-identical logits); a checkpoint whose fused entry does
    not fit the model is refused before the model changes."""
    model, cfg = _tiny("qwen3")
    quantize_(model, "w8a8", progress=False)
    ids = torch.randint(0, 128, (1, 6), device=DEVICE)
    save_quantized(model, tmp_path)
    loaded = load_quantized(cfg, tmp_path, device=DEVICE).eval()
    assert isinstance(loaded.model.layers[0].self_attn.v_proj, QKVPart)
    with torch.no_grad():
        assert_bit_exact(loaded(ids).logits, model(ids).logits)
    conf = tmp_path / CONFIG_NAME
    doc = json.loads(conf.read_text())
    attn = next(iter(doc["fused"]["qkv"]))
    doc["fused"]["qkv"][attn]["sizes"] = [64, 32, 31]
    conf.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="fused q|k|v entry"):
        load_quantized(cfg, tmp_path, device=DEVICE)


def test_fuse_qkv_takes_self_attention_only():
    """A cross-attention module (k and v on the encoder's states) keeps three projections; a self-attention one with
    projections that do not concatenate (here: another scheme for v) too."""
    lin = lambda n, scheme="w8a8": QuantizedLinear.from_linear(nn.Linear(64, n, bias=False), scheme)  # noqa: E731
    block = nn.Module()
    for name in ("self_attn", "encoder_attn"):
        attn = nn.Module()
        attn.q_proj, attn.k_proj, attn.v_proj = lin(64), lin(32), lin(32)
        setattr(block, name, attn)
    assert fuse_qkv_(block) == 1
    assert isinstance(block.self_attn.k_proj, QKVPart) and isinstance(block.encoder_attn.k_proj, QuantizedLinear)
    other = nn.Module()
    other.self_attn = nn.Module()
    other.self_attn.q_proj, other.self_attn.k_proj = lin(64), lin(32)
    other.self_attn.v_proj = lin(32, "w4a16-g32")
    assert fuse_qkv_(other) == 0 and isinstance(other.self_attn.q_proj, QuantizedLinear)

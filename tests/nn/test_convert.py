"""quantize_(model), save_quantized / load_quantized (src/qkernels/nn/convert.py)."""
import copy
import json
import warnings

import pytest
import torch
from torch import nn

import qkernels
from qkernels.nn import QuantizedLinear
from qkernels.nn.convert import CONFIG_NAME, _scheme_error, load_quantized, quantize_, save_quantized
from qkernels.schemes import W8A8, WeightOnly
from tests.conftest import DEVICE, ON_GPU
from tests.helpers import assert_bit_exact, rel_err

SCHEMES = ["w8a8", "w8a8-fp8", "w4a16", "w8a16", "w4a8-fp8"]


class Block(nn.Module):
    """A toy decoder MLP block with a tied head and a non-persistent buffer."""

    def __init__(self, d=128, hidden=256, vocab=96):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d, bias=False)
        self.odd = nn.Linear(d, 72)            # K = 128: fine; N odd-ish
        self.tail = nn.Linear(72, d)           # K = 72: not divisible by group 128 / 64
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.embed.weight
        self.register_buffer("freq", torch.linspace(0.5, 1.5, d), persistent=False)

    def forward(self, ids):
        h = self.embed(ids) * self.freq
        h = h + self.down(torch.relu(self.up(h)))
        h = h + self.tail(torch.relu(self.odd(h)))
        return self.lm_head(h)


def _model(dtype=torch.float16):
    return Block().to(DEVICE, dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantize_model_close_to_float(scheme):
    m = _model()
    ids = torch.randint(0, 96, (2, 5), device=DEVICE)
    want = m(ids).float()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        quantize_(m, scheme, progress=False)
    kinds = {n: type(mod).__name__ for n, mod in m.named_modules() if isinstance(mod, (nn.Linear, QuantizedLinear))}
    assert kinds["lm_head"] == "Linear"                  # skipped by default
    assert kinds["up"] == kinds["down"] == kinds["odd"] == "QuantizedLinear"
    if scheme in ("w4a16", "w4a8-fp8"):                  # K = 72 cannot take group 128: left in fp16, warned once
        assert kinds["tail"] == "Linear"
        msgs = [str(x.message) for x in w if "high precision" in str(x.message)]
        assert len(msgs) == 1 and "tail" in msgs[0] and "group_size=128" in msgs[0]
    else:
        assert kinds["tail"] == "QuantizedLinear"
    assert m.up.weight.dtype != torch.float16 if scheme.startswith("w8a8") else m.up.qweight.dtype == torch.uint8
    got = m(ids)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    tol = {"w8a8": 0.03, "w8a8-fp8": 0.08, "w4a16": 0.15, "w8a16": 0.03, "w4a8-fp8": 0.2}[scheme]
    assert rel_err(got, want) < tol


@pytest.mark.parametrize("scheme", SCHEMES)
def test_kernels_match_reference_forward(scheme):
    """Every converted layer: the kernel forward equals the reference forward (what CPU eval uses)."""
    m = _model(torch.bfloat16)
    quantize_(m, scheme, group_size=64 if scheme in ("w4a16", "w4a8-fp8") else None, progress=False)
    x = torch.randn(7, 128, device=DEVICE, dtype=torch.bfloat16)
    for mod in (m.up, m.odd):
        got, want = mod(x), mod._reference_forward(x)
        assert rel_err(got, want) < 1e-2, scheme


def test_filter_fn_skip_and_dtype():
    m = Block().to(DEVICE)                               # float32
    with pytest.raises(TypeError, match=r"layer 'up' has weight dtype float32"):
        quantize_(m, "w8a8", progress=False)
    quantize_(m, "w8a16", skip=("lm_head", "down"), filter_fn=lambda mod, name: name != "odd",
              dtype=torch.bfloat16, progress=False)
    assert isinstance(m.up, QuantizedLinear) and isinstance(m.tail, QuantizedLinear)
    assert type(m.down) is nn.Linear and type(m.odd) is nn.Linear and type(m.lm_head) is nn.Linear
    assert m.down.weight.dtype == torch.bfloat16 and m.up.scales.dtype == torch.bfloat16
    assert m(torch.randint(0, 96, (1, 3), device=DEVICE)).dtype == torch.bfloat16


def test_cast_keeps_codes_and_scales():
    m = _model()
    quantize_(m, "w8a8-fp8", progress=False)
    w = m.up.weight.clone()
    m.to(torch.bfloat16)
    assert m.up.weight.dtype == torch.float8_e4m3fn and m.up.weight_scale.dtype == torch.float32
    assert_bit_exact(m.up.weight, w, "fp8 codes after .to(bf16)")
    assert m.up.bias.dtype == torch.bfloat16


def test_bad_arguments():
    m = _model()
    with pytest.raises(ValueError, match="scheme must be w8a8, w8a8-fp8, or w4a16 / w8a16.*got 'int3'"):
        quantize_(m, "int3")
    with pytest.raises(ValueError, match="group_size"):
        quantize_(m, "w4a16", group_size=48)
    with pytest.raises(ValueError, match="'w8a8' quantizes weights per output channel"):
        quantize_(m, "w8a8", group_size=128)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        quantize_("model", "w8a8")
    with pytest.raises(FileNotFoundError, match=CONFIG_NAME):
        load_quantized(m, "/nonexistent/dir")


def test_fp8_scheme_needs_fp8_gpu(monkeypatch):
    import qkernels._runtime as rt
    monkeypatch.setattr(rt, "capability", lambda d: (8, 0))
    monkeypatch.setattr(rt, "device_name", lambda d=None: "NVIDIA A100")
    msg = _scheme_error(W8A8(fp8=True), torch.device("cuda"))
    assert "compute capability >= 8.9" in msg and "8.0" in msg and "A100" in msg
    assert _scheme_error(W8A8(), torch.device("cuda")) is None
    msg = _scheme_error(WeightOnly(4, fp8_act=True), torch.device("cuda"))
    assert "'w4a8-fp8' needs FP8 tensor cores" in msg and "w4a16, w8a16 and w8a8 run there" in msg
    assert _scheme_error(WeightOnly(4), torch.device("cuda")) is None


def _act_order_layer():
    K, N = 128, 48
    w = torch.randn(N, K, device=DEVICE)
    g_idx = torch.randperm(K, device=DEVICE) % 2      # two groups of 64, scattered: act-order
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, device=DEVICE)
    s = torch.rand(N, 2, device=DEVICE, dtype=torch.float16) * 0.1 + 0.01
    z = torch.randint(0, 16, (N, 2), device=DEVICE).to(torch.float16)
    pw = qkernels.PackedWeight.from_int(q, s, z, bits=4, group_size=64, g_idx=g_idx)
    assert pw.perm is not None
    del w
    return QuantizedLinear.from_packed(pw, torch.randn(N, device=DEVICE, dtype=torch.float16))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_save_load_round_trip(tmp_path, scheme):
    m = _model()
    quantize_(m, scheme, progress=False)
    m.act = _act_order_layer()
    ids = torch.randint(0, 96, (2, 6), device=DEVICE)
    want = m(ids)
    x = torch.randn(3, 128, device=DEVICE, dtype=torch.float16)
    want_act = m.act(x)
    save_quantized(m, tmp_path)
    assert (tmp_path / CONFIG_NAME).exists()

    with torch.device("meta"):                           # no full-precision copy to load into
        fresh = Block().half()
    loaded = load_quantized(fresh, tmp_path, device=DEVICE)
    sd_a, sd_b = m.state_dict(), loaded.state_dict()
    assert sd_a.keys() == sd_b.keys()
    for k in sd_a:
        assert_bit_exact(sd_b[k], sd_a[k], k)
    assert_bit_exact(loaded.freq, m.freq, "non-persistent buffer")
    assert loaded.lm_head.weight.data_ptr() == loaded.embed.weight.data_ptr()   # tie restored, stored once
    assert_bit_exact(loaded(ids), want, "model output after load")
    assert_bit_exact(loaded.act(x), want_act, "act-order layer after load")
    assert not any(t.is_meta for t in loaded.state_dict().values())



def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).to(DEVICE, torch.float16).eval(), cfg


@pytest.mark.parametrize("scheme", ["w8a8", "w4a16"])
def test_hf_llama_quantize_save_load_generate(tmp_path, scheme):
    model, cfg = _tiny_llama()
    ids = torch.randint(0, 128, (1, 6), device=DEVICE)
    with torch.no_grad():
        want = model(ids).logits.float()
        quantize_(model, scheme, group_size=64 if scheme == "w4a16" else None, progress=False)
        got = model(ids).logits
    assert rel_err(got, want) < 0.2
    n_q = sum(isinstance(m, QuantizedLinear) for m in model.modules())
    # q|k|v, o, gate|up (fused: qkernels.nn.fused), down per layer, lm_head kept
    assert n_q == 2 * 4
    save_quantized(model, tmp_path)
    loaded = load_quantized(cfg, tmp_path, device=DEVICE).eval()      # built on meta from the config
    with torch.no_grad():
        assert_bit_exact(loaded(ids).logits, got, "logits after load")
        out = loaded.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
        ref = model.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    assert out.shape == (1, 9)
    assert torch.equal(out, ref)


@pytest.mark.gpu
def test_gpu_convert_from_cpu_bounded_memory():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=4096, num_hidden_layers=16,
                                   num_attention_heads=8, num_key_value_heads=8)
    model = transformers.LlamaForCausalLM(cfg).half().eval()          # on the CPU
    fp16_bytes = sum(p.numel() * 2 for p in model.parameters())
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    quantize_(model, "w4a16", device="cuda", progress=False)
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 0.5 * fp16_bytes, (peak, fp16_bytes)   # w4a16 ~0.27x + one layer's temporaries, never a full fp16 copy
    assert all(p.device.type == "cuda" for p in model.state_dict().values())


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpu_hf_generate_compiled_static_cache(scheme):
    """Hugging Face generate with a static cache: generate compiles the decode step itself
    (torch.compile fullgraph, mode reduce-overhead = CUDA graphs) through our custom ops."""
    transformers = pytest.importorskip("transformers")
    model, _ = _tiny_llama()
    quantize_(model, scheme, group_size=64 if scheme == "w4a16" else None, progress=False)
    ids = torch.randint(0, 128, (2, 8), device="cuda")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static",
                               disable_compile=True)
        cc = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
        compiled = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static",
                                  compile_config=cc)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1     # the decode step was compiled
    assert compiled.shape == eager.shape
    assert torch.equal(compiled[:, :9], eager[:, :9])   # greedy: the first new token is identical


def _saved_tiny_llama(tmp_path, scheme="w4a16"):
    model, cfg = _tiny_llama()
    quantize_(model, scheme, group_size=64 if scheme == "w4a16" else None, progress=False)
    save_quantized(model, tmp_path)
    return cfg


def test_load_refuses_a_checkpoint_of_another_configuration(tmp_path):
    """Saved with intermediate_size 128, loaded into a config that says 256: refused, naming the layer and both
    shapes (the saved shapes used to win silently)."""
    cfg = _saved_tiny_llama(tmp_path)
    cfg2 = copy.deepcopy(cfg)
    cfg2.intermediate_size = 256
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\.mlp\.gate_proj' was saved as 128x64 .* makes it "
                                         r"256x64"):
        load_quantized(cfg2, tmp_path)


@pytest.mark.parametrize("damage,match", [
    (lambda j: j["layers"][next(iter(j["layers"]))].pop("dtype"), r"layer '.*': the entry has no 'dtype'"),
    (lambda j: j["layers"][next(iter(j["layers"]))].update(in_features=-3), r"'in_features' must be a positive int"),
    (lambda j: j["layers"][next(iter(j["layers"]))].update(scheme="w3a5"), r"scheme must be one of \('w8a8'"),
    (lambda j: j.update(version=99), r"format version 99"),
    (lambda j: j.update(weights="../elsewhere.safetensors"), r"'weights' must name a \.safetensors file"),
])
def test_load_names_what_is_wrong_in_the_config(tmp_path, damage, match):
    cfg = _saved_tiny_llama(tmp_path)
    f = tmp_path / CONFIG_NAME
    j = json.loads(f.read_text())
    damage(j)
    f.write_text(json.dumps(j))
    with pytest.raises(ValueError, match=match):
        load_quantized(cfg, tmp_path)


def test_load_refuses_damaged_files_and_leaves_the_model_alone(tmp_path):
    """A non-finite scale, a truncated weights file (its checksum), unparsable JSON: each a ValueError naming the
    file; a model passed in keeps its own layers (nothing is swapped in before every check has passed)."""
    cfg = _saved_tiny_llama(tmp_path)
    from safetensors.torch import load_file, save_file
    weights = tmp_path / json.loads((tmp_path / CONFIG_NAME).read_text())["weights"]
    good = weights.read_bytes()
    state = load_file(str(weights))
    key = next(k for k in state if k.endswith(".scale_zero"))
    state[key][0, 0, 0] = float("inf")
    save_file(state, str(weights))
    from qkernels._files import file_digest     # as a writer with a bug would: the checksum matches the bad file
    j = json.loads((tmp_path / CONFIG_NAME).read_text())
    good_cfg = json.dumps(j)
    j["weights_blake2b"] = file_digest(weights)
    (tmp_path / CONFIG_NAME).write_text(json.dumps(j))
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        target = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(ValueError, match=r"model-\w+\.safetensors: layer '.*' has a scale that is not finite"):
        load_quantized(target, tmp_path)
    assert not any(isinstance(m, QuantizedLinear) for m in target.modules())
    assert isinstance(target.model.layers[0].mlp.gate_proj, nn.Linear)
    (tmp_path / CONFIG_NAME).write_text(good_cfg)
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"model-\w+\.safetensors does not match the checksum"):
        load_quantized(cfg, tmp_path)
    weights.write_bytes(good)
    (tmp_path / CONFIG_NAME).write_text("{not json")
    with pytest.raises(ValueError, match=r"qkernels_config\.json is not valid JSON"):
        load_quantized(cfg, tmp_path)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiled_forward_traces_no_cache_and_matches_eager(scheme):
    """QuantizedLinear under torch.compile(fullgraph=True): the same bits as its eager call, and Dynamo meets none
    of the library's functools caches on the way (it warns of each one it traces through: the device queries and
    the lazy ops import are constants to it), nor a tensor's __dict__ (the eager plans' store, which it cannot
    trace)."""
    torch.manual_seed(0)
    lin = nn.Linear(128, 64, bias=False).to(DEVICE, torch.float16)
    q = QuantizedLinear.from_linear(lin, scheme, **({"group_size": 64} if scheme == "w4a16" else {}))
    x = torch.randn(3, 128, device=DEVICE, dtype=torch.float16)
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = torch.compile(q, backend="eager", fullgraph=True)(x)
    assert not [str(w.message) for w in seen if "lru_cache" in str(w.message)]
    assert_bit_exact(y, q(x))

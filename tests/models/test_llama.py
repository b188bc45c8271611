"""The decoder runtime against Hugging Face transformers' own models on the same (tiny, random) weights."""
import importlib
import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import qkernels as qk  # noqa: E402
from qkernels.models import ModelArgs, from_pretrained, sample  # noqa: E402
from qkernels.models.loading import merge_linears  # noqa: E402

from ..conftest import DEVICE  # noqa: E402

G = importlib.import_module("qkernels.models.generate")     # the module (the package exports the function)
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


def hf_model(kind: str, dtype=torch.float32, **over):
    kw = dict(TINY, **over)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**kw)
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=32, **kw)
        cls = transformers.Qwen3ForCausalLM
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**kw)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(1)
    m = cls(cfg).eval()
    with torch.no_grad():       # non-trivial norm weights and biases
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return m.to(DEVICE, dtype)


CASES = [("llama", {}), ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
         ("qwen3", {"tie_word_embeddings": True}), ("qwen2", {"num_key_value_heads": 4})]


@pytest.mark.parametrize("kind,over", CASES)
def test_logits_match_transformers_fp32(kind, over):
    hf = hf_model(kind, **over)
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    ids = torch.randint(0, 96, (2, 13), device=DEVICE)
    with torch.no_grad():
        want = hf(ids).logits
    got = m(ids)
    # fp32 throughout; the only differences are summation orders (tolerance: 1e-4 of the logit scale)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("kind,over", CASES[:3])
def test_greedy_tokens_match_transformers_32_steps(kind, over):
    hf = hf_model(kind, **over)
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    ids = torch.randint(0, 96, (2, 7), device=DEVICE)
    want = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                       pad_token_id=0, eos_token_id=None)
    got = m.generate(ids, 32)
    if DEVICE.type == "cpu":
        assert got.tolist() == want.tolist()
    # every new token is transformers' argmax given the same prefix, up to near-ties of the summation order
    with torch.no_grad():
        lg = hf(got).logits
    for b in range(got.shape[0]):
        for t in range(ids.shape[1], got.shape[1]):
            row = lg[b, t - 1]
            assert row[got[b, t]] >= row.max() - 1e-4 * row.abs().max(), (b, t)
    assert (got[:, :ids.shape[1] + 4] == want[:, :ids.shape[1] + 4]).all()


def test_ragged_batch_equals_one_by_one_and_chunked_prefill(monkeypatch):
    m = from_pretrained(hf_model("qwen3"), device=DEVICE, dtype=torch.float32)
    prompts = [[5, 9, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [42]]
    alone = [m.generate(p, 10) for p in prompts]
    assert m.generate(prompts, 10) == alone
    monkeypatch.setattr(G, "PREFILL_CHUNK", 4)          # prompts prefilled in chunks of 4 positions
    assert m.generate(prompts, 10) == alone


def test_graph_replay_equals_eager():
    m = from_pretrained(hf_model("llama"), device=DEVICE, dtype=torch.float32)
    prompts = [[5, 9, 3, 7], [1, 2]]
    assert m.generate(prompts, 12, use_graph=True) == m.generate(prompts, 12, use_graph=False)


class PaddedEagerly:
    """In place of a model's prefill graphs: every prompt takes the padded path, its forward run eagerly (the
    padding on any device, the CPU included); records the keys (batch, padded length, position)."""

    def __init__(self):
        self.keys = []

    def could_run(self, inputs) -> bool:
        return True

    usable = could_run

    def clear(self) -> None:
        pass

    def __call__(self, key, fn, *inputs):
        self.keys.append(key()[1:4])
        return fn(*inputs)


def _caches(m, upto):
    return [(layer.attention.cache.k[:, :, :upto].clone(), layer.attention.cache.v[:, :, :upto].clone())
            for layer in m.layers]


@torch.no_grad()
def test_a_prompt_padded_for_its_graph_gives_the_unpadded_logits_and_cache(monkeypatch):
    """The prefill graph's padding (a chunk's tokens up to a multiple of PREFILL_GRAPH_ROUND): the logits at
    logits_at and the cache rows of the real tokens as the unpadded forward's, for a first chunk and one after
    it; a chunk whose padded length would pass the cache runs unpadded."""
    m = from_pretrained(hf_model("qwen3"), device=DEVICE, dtype=torch.float32)
    m.setup_caches(2, 128)
    ids, more = torch.randint(0, 96, (2, 13), device=DEVICE), torch.randint(0, 96, (2, 5), device=DEVICE)
    at, at2 = torch.tensor([12, 7], device=DEVICE), torch.tensor([4, 2], device=DEVICE)
    with torch.enable_grad():                      # where no graph could run: unpadded
        want, want2 = m(ids, 0, logits_at=at), m(more, 13, logits_at=at2)
    cache = _caches(m, 18)
    stand = PaddedEagerly()
    monkeypatch.setattr(m, "prefill_graphs", stand)
    for layer in m.layers:                         # poison: every real row must be written again
        layer.attention.cache.k.fill_(float("nan"))
        layer.attention.cache.v.fill_(float("nan"))
    got, got2 = m(ids, 0, logits_at=at), m(more, 13, logits_at=at2)
    assert stand.keys == [(2, 64, 0), (2, 64, 13)]
    for g, w in ((got, want), (got2, want2)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item())
    for (k, v), (k0, v0) in zip(_caches(m, 18), cache):
        torch.testing.assert_close(k, k0, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, v0, rtol=1e-5, atol=1e-5)
    m.prefill_graphs = stand = PaddedEagerly()
    m.max_seq_len = 60                             # as if the cache held 60 positions: 13 + 64 would not fit
    torch.testing.assert_close(m(more, 13, logits_at=at2), want2, rtol=1e-5, atol=1e-5 * want2.abs().max().item())
    assert stand.keys == []


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs: GPU only")
@torch.inference_mode()
def test_prefill_graph_captured_at_a_padded_length_second_prompt_and_replayed():
    """Prompts of 13, 14 and 15 tokens share the 64-token graph: the first runs eagerly, the second captures it,
    the third replays it; each one's logits as the unpadded forward's, and bit for bit those of the padded forward
    without graphs (graphs.eager()); generate with the graphs gives the tokens of generate(use_graph=False)."""
    from qkernels.models.graphs import eager
    m = from_pretrained(hf_model("qwen3"), device=DEVICE, dtype=torch.float32)
    m.setup_caches(2, 256)
    for call, T in enumerate((13, 14, 15)):
        ids = torch.randint(0, 96, (2, T), device=DEVICE)
        at = torch.tensor([T - 1, T // 2], device=DEVICE)
        got = m(ids, 0, logits_at=at)
        assert len(m.prefill_graphs.graphs) == (call >= 1)
        with torch.enable_grad():                  # where no graph could run: unpadded
            want = m(ids, 0, logits_at=at)
        with eager():                              # no graph, the same padded computation: the same bits
            assert torch.equal(m(ids, 0, logits_at=at), got)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    prompts = [[5, 9, 3, 7, 1, 1, 2], [1, 2]]
    assert m.generate(prompts, 12) == m.generate(prompts, 12) == m.generate(prompts, 12, use_graph=False)


def test_stop_tokens_end_a_sequence():
    m = from_pretrained(hf_model("llama"), device=DEVICE, dtype=torch.float32)
    full = m.generate([3, 4, 5], 12)
    stop = full[5]                                       # the third new token
    out = m.generate([3, 4, 5], 12, stop=stop)
    assert out == full[:full.index(stop, 3) + 1]


def test_sampling_rules():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]], device=DEVICE)
    assert sample(logits).tolist() == [1, 0]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for _ in range(20):     # top_k=1 and a tiny top_p leave only the argmax
        assert sample(logits, 1.0, top_k=1, generator=g).tolist() == [1, 0]
        assert sample(logits, 1.0, top_p=1e-3, generator=g).tolist() == [1, 0]
        assert sample(logits, 0.7, top_k=2, generator=g)[0].item() in (1, 3)
    counts = torch.bincount(torch.stack([sample(logits, 1.0, generator=g)[0] for _ in range(400)]), minlength=4)
    p = torch.softmax(logits[0], -1)
    assert (counts.cpu().float() / 400 - p.cpu()).abs().max() < 0.08


@pytest.mark.parametrize("scheme", ["w4a16", "w8a16", "w8a8"])
def test_merged_quantized_projections_equal_separate(scheme):
    torch.manual_seed(0)
    dt = torch.float16
    lins = [torch.nn.Linear(128, n, bias=True).to(DEVICE, dt) for n in (64, 32, 32)]
    sep = [qk.QuantizedLinear.from_linear(lin, scheme, group_size=64 if scheme == "w4a16" else None) for lin in lins]
    merged_q = merge_linears(sep, DEVICE, dt)                      # codes concatenated
    merged_f = qk.QuantizedLinear.from_linear(merge_linears(lins, DEVICE, dt), scheme,
                                              group_size=64 if scheme == "w4a16" else None)  # float, then quantized
    for name, buf in merged_q.named_buffers():
        assert torch.equal(buf, dict(merged_f.named_buffers())[name]), name
    x = torch.randn(3, 128, device=DEVICE, dtype=dt)
    assert torch.equal(merged_q(x), torch.cat([s(x) for s in sep], dim=-1))


@pytest.mark.parametrize("scheme", ["w4a16", "w8a8"])
def test_quantized_runtime_matches_quantized_transformers(scheme):
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_model("llama", dtype=dt)
    m = from_pretrained(hf, scheme, device=DEVICE, dtype=dt, group_size=64 if scheme == "w4a16" else None)
    qk.quantize_(hf, scheme, group_size=64 if scheme == "w4a16" else None, fuse=False, progress=False)
    ids = torch.randint(0, 96, (1, 9), device=DEVICE)
    with torch.no_grad():
        want = hf(ids).logits.float()
    got = m(ids).float()
    # the same quantized weights; differences come from activation rounding orders (RoPE, norms in fp32)
    err = ((got - want).norm() / want.norm()).item()
    assert err < 2e-2, err


def test_from_directory_and_save_quantized_checkpoint(tmp_path):
    hf = hf_model("qwen3", tie_word_embeddings=True)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    m = from_pretrained(tmp_path / "hf", device=DEVICE, dtype=torch.float32)
    ids = torch.randint(0, 96, (1, 6), device=DEVICE)
    with torch.no_grad():
        want = hf(ids).logits
    torch.testing.assert_close(m(ids), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    # a save_quantized checkpoint loads to the same model as quantizing at load
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hq = hf_model("qwen3", dtype=dt, tie_word_embeddings=True)
    direct = from_pretrained(hq, "w4a16", device=DEVICE, dtype=dt, group_size=32)
    qk.quantize_(hq, "w4a16", group_size=32, progress=False)
    qk.save_quantized(hq, tmp_path / "q")
    loaded = from_pretrained(tmp_path / "q", device=DEVICE, dtype=dt)
    assert torch.equal(direct(ids), loaded(ids))


def test_w4a8_fp8_at_load_and_on_a_w4a16_checkpoint(tmp_path):
    """from_pretrained(..., "w4a8-fp8"): every projection W4A16's codes with FP8 activations, quantized at load or
    taken from a W4A16 checkpoint as stored (the same codes, so the same logits); its logits' error against the
    float model within the sum of W4A16's and W8A8-FP8's."""
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hq = hf_model("qwen3", dtype=dt, tie_word_embeddings=True)
    ids = torch.randint(0, 96, (2, 9), device=DEVICE)
    ref_logits = from_pretrained(hq, device=DEVICE, dtype=dt)(ids).float()
    err = {}
    for scheme in ("w4a8-fp8", "w4a16", "w8a8-fp8"):
        m = from_pretrained(hq, scheme, device=DEVICE, dtype=dt, **({} if scheme == "w8a8-fp8" else {"group_size": 64}))
        got = m(ids).float()
        err[scheme] = ((got - ref_logits).norm() / ref_logits.norm()).item()
        if scheme == "w4a8-fp8":
            direct = got
            qs = [mod for mod in m.modules() if isinstance(mod, qk.QuantizedLinear)]
            assert qs and all(q.scheme.name == "w4a8-fp8" for q in qs)
    assert err["w4a8-fp8"] <= err["w4a16"] + err["w8a8-fp8"], err
    qk.quantize_(hq, "w4a16", group_size=64, progress=False)
    qk.save_quantized(hq, tmp_path / "q")
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # every layer takes the scheme
        loaded = from_pretrained(tmp_path / "q", "w4a8-fp8", device=DEVICE, dtype=dt)
    assert all(q.scheme.name == "w4a8-fp8" for q in loaded.modules() if isinstance(q, qk.QuantizedLinear))
    assert torch.equal(loaded(ids).float(), direct)


def test_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="llama")))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model_type must be one of"):
        ModelArgs.from_hf(dict(TINY, model_type="gpt2"))
    with pytest.raises(ValueError, match="scheme must be w8a8, w8a8-fp8.*got 'w3a16'"):
        from_pretrained(tmp_path, "w3a16")
    m = from_pretrained(hf_model("llama"), device=DEVICE, dtype=torch.float32)
    with pytest.raises(ValueError, match="exceeds the model's context of 256"):
        m.generate([1] * 250, 10)
    with pytest.raises(ValueError, match="token ids must be in"):
        m.generate([1, 500], 3)
    # a missing tensor: nothing is returned half-loaded
    hf = hf_model("llama")
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    from safetensors.torch import load_file, save_file
    f = tmp_path / "hf" / "model.safetensors"
    sd = load_file(str(f))
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight.*missing"):
        from_pretrained(tmp_path / "hf", device=DEVICE)


def hf_qwen3_vl(dtype=torch.float32):
    """A tiny Qwen3-VL (vision tower + Qwen3 language model with interleaved multimodal RoPE)."""
    text = dict(TINY, head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": [8, 4, 4], "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  deepstack_visual_indexes=[0])
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    torch.manual_seed(1)
    m = transformers.Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return m.to(DEVICE, dtype)


needs_qwen3_vl = pytest.mark.skipif(not hasattr(transformers, "Qwen3VLConfig"), reason="transformers without Qwen3-VL")


@needs_qwen3_vl
def test_qwen3_vl_language_model_matches_transformers(tmp_path):
    """The runtime runs Qwen3-VL's language model on text prompts (its multimodal rotary positions are then
    plain RoPE), from the loaded model or its directory (weights under model.language_model.)."""
    hf = hf_qwen3_vl()
    ids = torch.randint(0, 96, (2, 11), device=DEVICE)
    with torch.no_grad():
        want = hf(ids).logits
    hf.save_pretrained(tmp_path, safe_serialization=True)
    for src in (hf, tmp_path):
        m = from_pretrained(src, device=DEVICE, dtype=torch.float32)
        assert m.args.model_type == "qwen3_vl" and m.args.tie_word_embeddings
        torch.testing.assert_close(m(ids), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    got = m.generate(ids[:1, :5], 8)
    with torch.no_grad():
        lg = hf(got).logits[0]
    for t in range(5, got.shape[1]):      # each new token is transformers' argmax given the same prefix
        assert lg[t - 1, got[0, t]] >= lg[t - 1].max() - 1e-4 * lg[t - 1].abs().max()


@needs_qwen3_vl
def test_qwen3_vl_quantized_text_and_vision_linears():
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_qwen3_vl(dt)
    qk.quantize_(hf, "w4a16", group_size=32, fuse=False, progress=False)
    names = [n for n, mod in hf.named_modules() if isinstance(mod, qk.QuantizedLinear)]
    assert any(".visual." in n for n in names) and any(".language_model." in n for n in names)
    m = from_pretrained(hf, device=DEVICE, dtype=dt)          # the quantized language model, codes as they are
    ids = torch.randint(0, 96, (1, 7), device=DEVICE)
    with torch.no_grad():
        want = hf(ids).logits.float()
    got = m(ids).float()
    assert ((got - want).norm() / want.norm()).item() < 2e-2

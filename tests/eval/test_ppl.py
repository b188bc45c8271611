"""Perplexity evaluation helpers (src/qkernels/eval/ppl.py); the real model run is `qkernels eval ppl`."""
import math

import pytest
import torch

from qkernels.eval.ppl import parse_spec, perplexity
from qkernels.schemes import W8A8, WeightOnly

transformers = pytest.importorskip("transformers")


def test_parse_spec():
    assert parse_spec("w8a8") == (W8A8(), {})
    assert parse_spec("w8a8-fp8-sq") == (W8A8(fp8=True), {"smooth": True})
    assert parse_spec("w4a16-g64-sym") == (WeightOnly(4, 64, True), {})
    assert parse_spec("w8a16-g-1") == (WeightOnly(8, -1), {})
    assert parse_spec("w4a16-g64-gptq-act") == (WeightOnly(4, 64), {"method": "gptq", "act_order": True})
    assert parse_spec("w4a16-g32-awq+gptq") == (WeightOnly(4, 32), {"method": "awq+gptq"})
    assert parse_spec("w4a16-awq") == (WeightOnly(4), {"method": "awq"})
    assert parse_spec("w4a16-rtn") == (WeightOnly(4), {})
    assert parse_spec("w4a8-fp8-g64-gptq-act") == (WeightOnly(4, 64, fp8_act=True),
                                                   {"method": "gptq", "act_order": True})
    assert parse_spec("w4a8-fp8-g64-sq") == (WeightOnly(4, 64, fp8_act=True), {"smooth": True})
    for bad, why in (("w4a16-sq", "-sq applies to the schemes that quantize"),
                     ("w4a16-g64-awq-act", "-act .* applies to -gptq"),
                     ("w8a8-gptq", "a method to the weight-only"), ("w5a16", "scheme must be w8a8")):
        with pytest.raises(ValueError, match=why):
            parse_spec(bad)


def _model():
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def test_perplexity_one_window_equals_the_mean_loss():
    m = _model()
    ids = torch.randint(0, 64, (1, 40))
    want = math.exp(m(ids, labels=ids).loss.item())
    got, n = perplexity(m, ids, ctx=64, stride=64)
    assert n == 39 and got == pytest.approx(want, rel=1e-5)


@torch.no_grad()
def test_sliding_windows_score_every_token_once():
    m = _model()
    ids = torch.randint(0, 64, (1, 50))
    _, n = perplexity(m, ids, ctx=16, stride=8)
    assert n == 49
    # windows with full context reproduce the single-window value when ctx covers everything
    assert perplexity(m, ids, ctx=64, stride=8)[0] == pytest.approx(perplexity(m, ids, ctx=64, stride=64)[0],
                                                                    rel=1e-4)


@torch.no_grad()
def test_runtime_perplexity_equals_the_hf_models():
    """The eval's runtime column: the decoder runtime built from the model scores the same text alike (fp32)."""
    from qkernels.eval.ppl import _RuntimeLM
    from qkernels.models import from_pretrained
    m = _model()
    ids = torch.randint(0, 64, (1, 60))
    want, n = perplexity(m, ids, ctx=32, stride=16)
    got, n2 = perplexity(_RuntimeLM(from_pretrained(m, device="cpu", dtype=torch.float32)), ids, ctx=32, stride=16)
    assert n == n2 and math.isclose(got, want, rel_tol=1e-4)


def test_text_from_a_file_or_a_clear_error(tmp_path, monkeypatch):
    """The eval text is a file the user passes or gensim's data file; without either, an error that says how to
    get it (no download inside the library)."""
    from qkernels.eval import ppl
    f = tmp_path / "t.txt"
    f.write_text("one two three\n", "utf-8")
    assert ppl.load_text(str(f)) == "one two three\n"
    with pytest.raises(FileNotFoundError, match="text must be a readable UTF-8 text file"):
        ppl.load_text(str(tmp_path / "missing.txt"))
    monkeypatch.setattr(ppl, "CORPUS_PACKAGE", "qkernels_no_such_package")
    with pytest.raises(RuntimeError, match=r"pip install 'qkernels\[eval\]'"):
        ppl.load_text()

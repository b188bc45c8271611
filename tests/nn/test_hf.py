"""transformers integration: quantize while loading with QKernelsConfig, generate, save_pretrained, load back."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import qkernels as qk  # noqa: E402
from qkernels.nn import QuantizedLinear  # noqa: E402

from ..conftest import DEVICE  # noqa: E402


@pytest.fixture
def float_dir(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(tmp_path / "float")
    return tmp_path / "float"


@pytest.mark.parametrize("kw", [dict(scheme="w4a16", group_size=32), dict(scheme="w8a8")])
def test_quantize_on_load_generate_save_and_load_back(float_dir, tmp_path, kw):
    from transformers import AutoModelForCausalLM
    dt = torch.float16
    m = AutoModelForCausalLM.from_pretrained(float_dir, quantization_config=qk.QKernelsConfig(**kw), dtype=dt)
    m = m.to(DEVICE)
    quantized = {n for n, x in m.named_modules() if isinstance(x, QuantizedLinear)}
    assert len(quantized) == 14 and all(x.scheme.name == kw["scheme"] for x in m.modules()
                                        if isinstance(x, QuantizedLinear))
    # the same weights through quantize_ directly
    ref = AutoModelForCausalLM.from_pretrained(float_dir, dtype=dt).to(DEVICE)
    qk.quantize_(ref, kw["scheme"], group_size=kw.get("group_size"), fuse=False, progress=False)
    ids = torch.randint(0, 96, (1, 8), device=DEVICE)
    with torch.no_grad():
        logits = m(ids).logits
        assert torch.equal(logits, ref(ids).logits)
    out = m.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 11)
    m.save_pretrained(tmp_path / "q")
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "qkernels" and set(qc["layers"]) == quantized
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "q").to(DEVICE)
    for n in quantized:
        a, b = m.get_submodule(n), back.get_submodule(n)
        assert isinstance(b, QuantizedLinear)
        for key, t in a.state_dict().items():
            assert t.dtype == b.state_dict()[key].dtype and torch.equal(t, b.state_dict()[key]), (n, key)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, logits)
    assert torch.equal(back.generate(ids, max_new_tokens=3, do_sample=False), out)


def test_config_is_checked():
    with pytest.raises(ValueError, match="scheme must be w8a8, w8a8-fp8.*got 'int3'"):
        qk.QKernelsConfig(scheme="int3")
    with pytest.raises(ValueError, match="w8a8. quantizes weights per output channel"):
        qk.QKernelsConfig(scheme="w8a8", group_size=64)
    cfg = qk.QKernelsConfig(scheme="w4a16-g64")        # stored resolved: plain JSON values, defaults filled in
    assert (cfg.scheme, cfg.group_size, cfg.symmetric) == ("w4a16", 64, False)

"""`qkernels quantize` on a tiny model directory: calibrated GPTQ from a text file, both output formats, and
`qkernels generate` on the result."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from qkernels import cli  # noqa: E402
from qkernels.nn import QuantizedLinear  # noqa: E402

WORDS = ["hello", "world", "quantized", "kernels", "run", "fast", "on", "gpus", "and", "cpus", "the", "model"]


@pytest.fixture
def model_dir(tmp_path):
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]"] + WORDS)},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    cfg = transformers.LlamaConfig(vocab_size=13, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   eos_token_id=None)
    torch.manual_seed(0)
    d = tmp_path / "model"
    transformers.LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
    tok.save(str(d / "tokenizer.json"))
    g = torch.Generator().manual_seed(1)
    (tmp_path / "calib.txt").write_text(" ".join(WORDS[i] for i in torch.randint(0, 12, (200,), generator=g)))
    return d


def test_quantize_gptq_then_generate(model_dir, tmp_path, capsys):
    out = tmp_path / "q"
    assert cli.main(["quantize", str(model_dir), str(out), "--method", "gptq", "--act-order", "--group-size", "32",
                     "--calib-text", str(tmp_path / "calib.txt"), "--calib-len", "16", "--calib-tokens", "64",
                     "--dtype", "bfloat16"]) == 0
    err = capsys.readouterr().err
    assert "4 sequences of 16 tokens" in err and "wrote" in err
    assert (out / "tokenizer.json").exists() and (out / "qkernels_config.json").exists()
    layers = json.loads((out / "qkernels_config.json").read_text())["layers"]
    # one decoder layer: q|k|v, o, gate|up (fused by quantize_), down
    assert len(layers) == 4 and all(e["scheme"] == "w4a16" and e["act_order"] for e in layers.values())
    assert cli.main(["generate", str(out), "--prompt", "hello world", "--max-new-tokens", "3",
                     "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.startswith("hello world")


def test_quantize_to_gptq_format(model_dir, tmp_path, capsys):
    import qkernels as qk
    out = tmp_path / "gptq"
    assert cli.main(["quantize", str(model_dir), str(out), "--group-size", "32", "--format", "gptq"]) == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["group_size"] == 32
    m = qk.load_pretrained(out)
    assert sum(isinstance(x, QuantizedLinear) for x in m.modules()) == 7


@pytest.mark.parametrize("scheme", ["w4a16", "w8a8"])
def test_quantize_to_compressed_tensors_format(model_dir, tmp_path, capsys, scheme):
    import qkernels as qk
    out = tmp_path / "ct"
    groups = ["--group-size", "32"] if scheme == "w4a16" else []
    assert cli.main(["quantize", str(model_dir), str(out), "--scheme", scheme, *groups,
                     "--format", "compressed-tensors"]) == 0
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == ("pack-quantized" if scheme == "w4a16" else "int-quantized")
    m = qk.load_pretrained(out)
    assert sum(isinstance(x, QuantizedLinear) for x in m.modules()) == 7


def test_quantize_refuses_bad_arguments(model_dir, tmp_path, capsys):
    assert cli.main(["quantize", str(model_dir), str(tmp_path / "x"), "--method", "gptq"]) == 2
    assert "--calib-text" in capsys.readouterr().err
    assert cli.main(["quantize", str(tmp_path / "nothing"), str(tmp_path / "x")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert cli.main(["quantize", str(model_dir), str(model_dir)]) == 2
    assert cli.main(["quantize", str(model_dir), str(tmp_path / "x"), "--scheme", "w8a8", "--group-size", "32"]) == 2
    assert "--scheme w8a8" in capsys.readouterr().err
    assert cli.main(["quantize", str(model_dir), str(tmp_path / "x"), "--scheme", "w8a8", "--format", "gptq"]) == 2
    assert "weight-only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

"""`qkernels generate` on a tiny model directory with its own tokenizer.json (CPU: reference twins or interpreter)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from qkernels import cli  # noqa: E402


def test_generate_streams_and_reports(tmp_path, capsys):
    words = ["hello", "world", "quantized", "kernels", "run", "fast", "on", "gpus", "and", "cpus"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]"] + words)},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   eos_token_id=None)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    tok.save(str(tmp_path / "tokenizer.json"))
    assert cli.main(["generate", str(tmp_path), "--prompt", "hello world", "--max-new-tokens", "5",
                     "--dtype", "float32"]) == 0
    out = capsys.readouterr()
    text = out.out.strip()
    assert text.startswith("hello world") and len(text.split()) >= 3          # prompt, then new words
    assert "5 new" in out.err and "tok/s" in out.err and "TTFT" in out.err


def test_generate_needs_a_tokenizer(tmp_path, capsys):
    assert cli.main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err

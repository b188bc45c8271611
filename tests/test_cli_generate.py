"""`qkernels generate` on a tiny model directory with its own tokenizer.json (CPU: reference twins or interpreter)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from qkernels import cli  # noqa: E402


def _model_dir(path):
    words = ["hello", "world", "quantized", "kernels", "run", "fast", "on", "gpus", "and", "cpus"]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]"] + words)},
                                                           unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    cfg = transformers.LlamaConfig(vocab_size=11, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   eos_token_id=None)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def test_generate_streams_and_reports(tmp_path, capsys):
    _model_dir(tmp_path)
    assert cli.main(["generate", str(tmp_path), "--prompt", "hello world", "--max-new-tokens", "5",
                     "--dtype", "float32"]) == 0
    out = capsys.readouterr()
    text = out.out.strip()
    assert text.startswith("hello world") and len(text.split()) >= 3          # prompt, then new words
    assert "5 new" in out.err and "tok/s" in out.err and "TTFT" in out.err


def test_generate_needs_a_tokenizer(tmp_path, capsys):
    assert cli.main(["generate", str(tmp_path), "--prompt", "x"]) == 2
    assert "tokenizer.json" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="--tp 2 needs 2 GPUs")
def test_generate_tensor_parallel_under_torchrun(tmp_path, capsys):
    import os
    import subprocess
    import sys
    _model_dir(tmp_path)
    args = ["generate", str(tmp_path), "--prompt", "hello world", "--max-new-tokens", "6", "--dtype", "float32"]
    assert cli.main(args) == 0
    alone = capsys.readouterr().out
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                          "qkernels.cli", *args, "--tp", "2"], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone                      # the same greedy text, printed once (by rank 0)
    assert "tensor parallel over 2" in run.stderr and run.stderr.count("tok/s") == 1


def test_generate_tp_needs_torchrun(tmp_path):
    with pytest.raises(SystemExit, match="torchrun --nproc-per-node 2"):
        cli.main(["generate", str(_model_dir(tmp_path)), "--prompt", "x", "--tp", "2"])

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


def _torchrun_tp2(args: list):
    """`qkernels <args> --tp 2` in two processes under torchrun."""
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "qkernels.cli",
                           *args, "--tp", "2"], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="--tp 2 needs 2 GPUs")
def test_generate_tensor_parallel_under_torchrun(tmp_path, capsys):
    _model_dir(tmp_path)
    args = ["generate", str(tmp_path), "--prompt", "hello world", "--max-new-tokens", "6", "--dtype", "float32"]
    assert cli.main(args) == 0
    alone = capsys.readouterr().out
    run = _torchrun_tp2(args)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone                      # the same greedy text, printed once (by rank 0)
    assert "tensor parallel over 2" in run.stderr and run.stderr.count("tok/s") == 1


def test_generate_tp_needs_torchrun(tmp_path):
    with pytest.raises(SystemExit, match="torchrun --nproc-per-node 2"):
        cli.main(["generate", str(_model_dir(tmp_path)), "--prompt", "x", "--tp", "2"])


VL_WORDS = ["describe", "the", "image", "a", "cat", "on", "mat"]
VL_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
VL_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {% for c in m['content'] %}{% if c['type'] == "
               "'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
               "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def _vl_model_dir(path):
    """A tiny Qwen3-VL directory as people ship one: weights, config, tokenizer.json, chat template and image
    processor (patches of 4 pixels, merged 2 x 2)."""
    if not hasattr(transformers, "Qwen3VLConfig"):
        pytest.skip("transformers without Qwen3-VL")
    words = ["[UNK]", "user", "assistant"] + VL_WORDS + VL_SPECIAL
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True) for s in VL_SPECIAL])
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    ids = {w: i for i, w in enumerate(words)}
    text = dict(vocab_size=len(words), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4],
                                 "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0])
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                                     vision_start_token_id=ids["<|vision_start|>"],
                                     vision_end_token_id=ids["<|vision_end|>"], video_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3VLForConditionalGeneration(cfg).save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "chat_template.jinja").write_text(VL_TEMPLATE)
    proc = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    proc(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=64, max_pixels=1024).save_pretrained(path)
    return path


def _png(path, h, w):
    import numpy as np
    from PIL import Image
    Image.fromarray((np.random.default_rng(0).random((h, w, 3)) * 255).astype("uint8")).save(path)
    return str(path)


def test_generate_with_images_streams_what_the_runtime_generates(tmp_path, capsys):
    """--image (twice): the prompt built from the directory's chat template and image processor, streamed; the
    same ids as the runtime's generate on those inputs built by hand."""
    from tokenizers import Tokenizer

    from qkernels.models import from_pretrained
    from qkernels.models.processing import image_prompt, load_images
    d = _vl_model_dir(tmp_path / "m")
    a, b = _png(tmp_path / "a.png", 16, 24), _png(tmp_path / "b.png", 8, 8)
    args = ["generate", str(d), "--image", a, "--image", b, "--prompt", "describe the image", "--max-new-tokens",
            "6", "--dtype", "float32"]
    assert cli.main(args) == 0
    out = capsys.readouterr()
    assert out.out.startswith("describe the image") and "6 new" in out.err and "TTFT" in out.err
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids, pv, grid = image_prompt(d, tok, "describe the image", load_images([a, b]))
    assert grid.tolist() == [[1, 4, 6], [1, 2, 2]] and ids.count(tok.token_to_id("<|image_pad|>")) == 6 + 1
    m = from_pretrained(d, dtype=torch.float32)
    new = m.generate(ids, 6, pixel_values=pv, image_grid_thw=grid)[len(ids):]
    assert out.out.strip() == ("describe the image" + tok.decode(new)).strip()


@pytest.mark.parametrize("flag, want", [([], None), (["--quantize-vision"], True)])
def test_generate_passes_quantize_vision(tmp_path, monkeypatch, flag, want):
    """--quantize-vision reaches from_pretrained (absent: None, the scheme's default)."""
    import qkernels.models as models
    got = {}

    class Loaded(Exception):
        pass

    def fake(*a, **kw):
        got.update(kw)
        raise Loaded
    monkeypatch.setattr(models, "from_pretrained", fake)
    import tokenizers
    d = tmp_path / "m"
    d.mkdir()
    tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "x": 1}, unk_token="[UNK]")).save(
        str(d / "tokenizer.json"))
    with pytest.raises(Loaded):
        cli.main(["generate", str(d), "--prompt", "x", "--scheme", "w4a16"] + flag)
    assert got["quantize_vision"] is want


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="--tp 2 needs 2 GPUs")
def test_generate_with_an_image_tensor_parallel(tmp_path, capsys):
    """--image with --tp 2 under torchrun: the vision encoder whole on each rank, the language model split; the
    same text as one process, printed once."""
    d = _vl_model_dir(tmp_path / "m")
    args = ["generate", str(d), "--image", _png(tmp_path / "a.png", 16, 24), "--prompt", "describe the image",
            "--max-new-tokens", "6", "--dtype", "float32"]
    assert cli.main(args) == 0
    alone = capsys.readouterr().out
    run = _torchrun_tp2(args)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone and alone.startswith("describe the image")


def test_generate_image_errors_name_the_file(tmp_path, capsys):
    d = _vl_model_dir(tmp_path / "m")
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    assert cli.main(["generate", str(d), "--image", str(bad), "--prompt", "x", "--dtype", "float32"]) == 2
    assert f"--image {bad}: cannot be decoded as an image" in capsys.readouterr().err
    big = _png(tmp_path / "big.png", 32, 32)         # 16 image tokens + the prompt, 250 new: past 256 positions
    assert cli.main(["generate", str(d), "--image", big, "--prompt", "x", "--max-new-tokens", "250",
                     "--dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "the prompt with its image tokens" in err and "big.png" in err and "context of 256" in err
    text_dir = _model_dir(tmp_path / "t")
    assert cli.main(["generate", str(text_dir), "--image", big, "--prompt", "x", "--dtype", "float32"]) == 2
    assert "is not a vision-language model" in capsys.readouterr().err
    # image placeholders in the prompt (a template pasted in by hand) and no --image: refused, no tokens streamed
    assert cli.main(["generate", str(d), "--prompt", "describe <|image_pad|> <|image_pad|>", "--dtype",
                     "float32"]) == 2
    out = capsys.readouterr()
    assert "--prompt holds 2 image placeholder token(s) (<|image_pad|>, id" in out.err and "pass --image" in out.err
    assert "tok/s" not in out.err and out.out == ""

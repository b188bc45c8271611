"""A vision-language prompt from a model directory's own files, as its Hugging Face processor builds it: the chat
template (chat_template.jinja / chat_template.json / tokenizer_config.json) renders the user's images and text, the
image processor (preprocessor_config.json, through transformers' AutoImageProcessor, no network) makes pixel_values and
image_grid_thw, and each image's placeholder token is repeated once per token the image becomes (its grid's patches
over spatial_merge_size^2), then the text is tokenized with tokenizer.json. (transformers' full Qwen3-VL processor also
loads a video processor, which needs torchvision; the image path needs none of it.)"""
from __future__ import annotations

import json
from pathlib import Path


def chat_template(model_dir: Path) -> str | None:
    """The directory's chat template, where its processor or tokenizer keeps one."""
    d = Path(model_dir)
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "tokenizer_config.json"):
        f = d / name
        if f.is_file():
            t = json.loads(f.read_text()).get("chat_template")
            if isinstance(t, str):
                return t
    return None


def load_images(paths: list) -> list:
    """PIL images (RGB) of `paths`; a file that cannot be read or decoded is named in the error."""
    from PIL import Image
    out = []
    for p in paths:
        try:
            with Image.open(p) as im:
                out.append(im.convert("RGB"))
        except (OSError, ValueError) as e:
            raise ValueError(f"--image {p}: cannot be decoded as an image ({type(e).__name__}: {e})") from None
    return out


def image_prompt(model_dir, tokenizer, prompt: str, images: list):
    """(input ids, pixel_values, image_grid_thw) of one user turn holding `images` (PIL) then `prompt`, ready for
    the assistant's reply. tokenizer: the directory's tokenizers.Tokenizer."""
    from transformers import AutoImageProcessor, PreTrainedTokenizerFast
    d = Path(model_dir)
    template = chat_template(d)
    if template is None:
        raise ValueError(f"{d} has no chat template (chat_template.jinja, chat_template.json or "
                         f"tokenizer_config.json's chat_template)")
    cfg = json.loads((d / "config.json").read_text())
    image_token = tokenizer.id_to_token(int(cfg["image_token_id"]))
    merge = int(cfg.get("vision_config", {}).get("spatial_merge_size", 2))
    messages = [{"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": prompt}]}]
    # transformers' own template renderer (its sandbox and the helpers checkpoints' templates call)
    renderer = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    text = renderer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    processor = AutoImageProcessor.from_pretrained(d, local_files_only=True)
    px = processor(images=images, return_tensors="pt")
    grid = px["image_grid_thw"]
    pieces = text.split(image_token)
    if len(pieces) - 1 != len(images):
        raise ValueError(f"the chat template placed {len(pieces) - 1} image token(s) for {len(images)} image(s)")
    counts = [int(t * h * w) // merge ** 2 for t, h, w in grid.tolist()]
    text = pieces[0] + "".join(image_token * n + piece for n, piece in zip(counts, pieces[1:]))
    return tokenizer.encode(text, add_special_tokens=False).ids, px["pixel_values"], grid

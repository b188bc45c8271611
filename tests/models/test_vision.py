"""Qwen3-VL's vision encoder in the runtime (models/vision.py) against transformers' Qwen3VLVisionModel on the same
tiny random weights: image embeddings and deepstack features, one image and several of different grids."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import qkernels as qk  # noqa: E402
from qkernels.models import from_pretrained  # noqa: E402
from qkernels.models.vision import VisionArgs  # noqa: E402

from ..conftest import DEVICE  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(transformers, "Qwen3VLConfig"), reason="transformers without Qwen3-VL")

TEXT = dict(vocab_size=160, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 4, 4],
                             "mrope_interleaved": True})
VISION = dict(depth=3, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16, deepstack_visual_indexes=[0, 2])
PATCH = 3 * 2 * 4 * 4


def hf_vl(dtype=torch.float32, **vision):
    cfg = transformers.Qwen3VLConfig(text_config=TEXT, vision_config=dict(VISION, **vision), image_token_id=150,
                                     video_token_id=151, vision_start_token_id=152, vision_end_token_id=153)
    torch.manual_seed(2)
    m = transformers.Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():           # norms and biases away from their trivial initial values
        for n, p in m.named_parameters():
            if "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return m.to(DEVICE, dtype)


def images(grids):
    grid = torch.tensor(grids, device=DEVICE)
    return torch.randn(int(grid.prod(-1).sum()), PATCH, device=DEVICE), grid


@pytest.mark.parametrize("grids", [[[1, 4, 6]], [[1, 4, 6], [1, 6, 4], [1, 2, 2]], [[2, 4, 4]]],
                         ids=["one image", "three images", "two frames"])
def test_vision_tower_matches_transformers_fp32(grids):
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    pv, grid = images(grids)
    with torch.no_grad():
        want = hf.model.visual(pv, grid_thw=grid)
    got, deep = m.visual(pv, grid)
    scale = want.pooler_output.abs().max().item()
    torch.testing.assert_close(got, want.pooler_output, rtol=1e-5, atol=1e-5 * scale)
    assert len(deep) == len(want.deepstack_features) == 2
    for g, w in zip(deep, want.deepstack_features):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item())


@pytest.mark.parametrize("scheme", ["w4a16", "w8a16", "w8a8"])
def test_quantized_vision_tower_close_to_float(scheme):
    """With a scheme the blocks' linears are quantized (mergers and patch embedding stay float): within the
    quantization error of the float tower."""
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_vl(dt)
    m = from_pretrained(hf, scheme, device=DEVICE, dtype=dt, group_size=64 if scheme == "w4a16" else None)
    blk = m.visual.blocks[0]
    assert all(isinstance(lin, qk.QuantizedLinear) for lin in (blk.qkv, blk.proj, blk.fc1, blk.fc2))
    assert not isinstance(m.visual.merger.fc1, qk.QuantizedLinear)
    pv, grid = images([[1, 4, 6], [1, 2, 4]])
    with torch.no_grad():
        want = hf.model.visual(pv.to(dt), grid_thw=grid).pooler_output.float()
    got = m.visual(pv, grid)[0].float()
    assert ((got - want).norm() / want.norm()).item() < 5e-2


def test_bad_image_inputs_name_the_argument():
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    pv, grid = images([[1, 4, 6]])
    with pytest.raises(ValueError, match=r"pixel_values must be \[24, 96\] \(the patches image_grid_thw counts"):
        m.visual(pv[:-1], grid)
    with pytest.raises(ValueError, match=r"image_grid_thw\[0\] must be positive with h and w multiples of "
                                         r"spatial_merge_size=2, got \(1, 3, 8\)"):
        m.visual(pv, torch.tensor([[1, 3, 8]], device=DEVICE))
    with pytest.raises(ValueError, match=r"image_grid_thw must be an \[images, 3\] tensor"):
        m.visual(pv, torch.tensor([4, 6], device=DEVICE))
    with pytest.raises(ValueError, match="vision_config.hidden_act must be one of"):
        VisionArgs.from_hf({"vision_config": dict(VISION, hidden_act="swish", out_hidden_size=64)})


def test_a_text_model_has_no_vision_tower():
    cfg = transformers.Qwen3Config(**{k: v for k, v in TEXT.items() if k != "rope_parameters"})
    hf = transformers.Qwen3ForCausalLM(cfg).eval().to(DEVICE)
    assert from_pretrained(hf, device=DEVICE, dtype=torch.float32).visual is None

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


@pytest.fixture(autouse=True)
def fp32_reference():
    """transformers' model as the fp32 reference: its patch embedding is a Conv3d, which cuDNN runs in TF32 by default
    on a GPU (1e-4 of the output's scale from the same model on the CPU); ours is an fp32 linear. TF32 off here."""
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield

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
    """With a scheme and quantize_vision the blocks' linears are quantized (mergers and patch embedding stay
    float): within the quantization error of the float tower."""
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_vl(dt)
    m = from_pretrained(hf, scheme, device=DEVICE, dtype=dt, group_size=64 if scheme == "w4a16" else None,
                        quantize_vision=True)
    blk = m.visual.blocks[0]
    assert all(isinstance(lin, qk.QuantizedLinear) for lin in (blk.qkv, blk.proj, blk.fc1, blk.fc2))
    assert not isinstance(m.visual.merger.fc1, qk.QuantizedLinear)
    pv, grid = images([[1, 4, 6], [1, 2, 4]])
    with torch.no_grad():
        want = hf.model.visual(pv.to(dt), grid_thw=grid).pooler_output.float()
    got = m.visual(pv, grid)[0].float()
    assert ((got - want).norm() / want.norm()).item() < 5e-2


@pytest.mark.parametrize("scheme, quantize_vision, quantized", [
    ("w4a16", None, False), ("w8a16", None, False), ("w8a8", None, True), ("w8a8", False, False),
    ("w4a16", True, True)])
def test_which_schemes_quantize_the_vision_tower(scheme, quantize_vision, quantized):
    """By default the weight-only schemes leave the vision tower's linears in float (it runs at an image's patch
    count, where fp16 measured faster) and the W8A8 ones quantize them; quantize_vision says otherwise. The
    language model is quantized either way; a float tower gives transformers' image embeddings (to half-precision
    rounding), a quantized one stays within its quantization error."""
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_vl(dt)
    m = from_pretrained(hf, scheme, device=DEVICE, dtype=dt, quantize_vision=quantize_vision,
                        group_size=32 if scheme == "w4a16" else None)
    blk = m.visual.blocks[0]
    assert all(isinstance(lin, qk.QuantizedLinear) == quantized for lin in (blk.qkv, blk.proj, blk.fc1, blk.fc2))
    assert isinstance(m.layers[0].attention.wqkv, qk.QuantizedLinear)
    pv, grid = images([[1, 4, 6]])
    with torch.no_grad():
        want = hf.model.visual(pv.to(dt), grid_thw=grid).pooler_output.float()
    err = ((m.visual(pv, grid)[0].float() - want).norm() / want.norm()).item()
    assert err < (5e-2 if quantized else 1e-2), err


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs: GPU only")
@pytest.mark.parametrize("scheme", [None, "w4a16"])
@torch.inference_mode()
def test_an_image_size_seen_twice_runs_as_a_graph_with_the_eager_results(scheme):
    """The tower's second call at one grid captures it, later calls replay it: embeddings and deepstack features
    equal the eager computation's bit for bit on fresh pixels; another grid stays eager until it comes back; a tower
    whose weights moved since is captured anew."""
    hf = hf_vl(torch.float16)
    m = from_pretrained(hf, scheme, device=DEVICE, dtype=torch.float16, quantize_vision=scheme is not None)
    vis = m.visual
    for call in range(3):
        pv, grid = images([[1, 4, 6], [1, 2, 2]])
        got, deep = vis(pv, grid)
        want = vis._encode(pv.half(), vis.check(pv, grid))
        assert len(vis.graphs.graphs) == (call >= 1)
        assert torch.equal(got, want[0]) and len(deep) == len(want) - 1 == 2
        assert all(torch.equal(a, b) for a, b in zip(deep, want[1:]))
    pv, grid = images([[1, 2, 4]])
    vis(pv, grid)
    assert len(vis.graphs.graphs) == 1
    vis.pos_embed = torch.nn.Parameter(vis.pos_embed.clone(), requires_grad=False)   # weights elsewhere: new key
    pv, grid = images([[1, 4, 6], [1, 2, 2]])
    got, _ = vis(pv, grid)
    assert torch.equal(got, vis._encode(pv.half(), vis.check(pv, grid))[0]) and len(vis.graphs.graphs) == 1


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
    ids = torch.tensor([prompt_with([6], [[5], [7]])], device=DEVICE)
    with pytest.raises(ValueError, match="images need both pixel_values and image_grid_thw"):
        m(ids, pixel_values=pv)
    with pytest.raises(ValueError, match="images need both pixel_values and image_grid_thw"):
        m(ids, image_grid_thw=grid)
    for poison in (float("nan"), float("inf"), -float("inf")):
        bad = pv.clone()
        bad[3, 7] = poison
        with pytest.raises(ValueError, match=r"pixel_values must be finite, got 1 NaN / Inf value\(s\) of 2304"):
            m.visual(bad, grid)
        with pytest.raises(ValueError, match=r"pixel_values must be finite"):    # through the model's forward
            m(ids, pixel_values=bad, image_grid_thw=grid)
    with pytest.raises(ValueError, match="vision_config.hidden_act must be one of"):
        VisionArgs.from_hf({"vision_config": dict(VISION, hidden_act="swish", out_hidden_size=64)})


def test_a_text_model_has_no_vision_tower():
    cfg = transformers.Qwen3Config(**{k: v for k, v in TEXT.items() if k != "rope_parameters"})
    hf = transformers.Qwen3ForCausalLM(cfg).eval().to(DEVICE)
    assert from_pretrained(hf, device=DEVICE, dtype=torch.float32).visual is None


IMG, START, END = 150, 152, 153


def prompt_with(images_tokens: list, text: list) -> list:
    """Token ids: text pieces with <vision_start> <image>*n <vision_end> between them (as the processor lays them)."""
    ids = list(text[0])
    for n, piece in zip(images_tokens, text[1:]):
        ids += [START] + [IMG] * n + [END] + list(piece)
    return ids


def hf_logits(hf, ids, pv, grid):
    tt = (ids == IMG).int()         # the processor's mm_token_type_ids: 1 on image tokens
    with torch.no_grad():
        return hf(input_ids=ids, pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=tt).logits


@pytest.mark.parametrize("grids", [[[1, 4, 6]], [[1, 4, 6], [1, 2, 4]]], ids=["one image", "two images"])
def test_image_and_text_logits_match_transformers_fp32(grids):
    """Images in the prompt: embeddings in place of the image tokens, interleaved multimodal rotary positions,
    deepstack features added after the first layers; logits as transformers' within 1e-5 of their scale."""
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    pv, grid = images(grids)
    toks = [t * h * w // 4 for t, h, w in grids]
    text = [torch.randint(0, 140, (n,)).tolist() for n in (3, 4, 2)[:len(grids) + 1]]
    ids = torch.tensor([prompt_with(toks, text)], device=DEVICE)
    want = hf_logits(hf, ids, pv, grid)
    got = m(ids, pixel_values=pv, image_grid_thw=grid)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_batched_prompts_with_different_images_match_one_by_one():
    """Two prompts, each with its own image, in one forward: each sequence's logits as transformers gives them
    alone, and as the runtime's own single-prompt forward."""
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    (pa, ga), (pb, gb) = images([[1, 4, 6]]), images([[1, 6, 4]])
    a = torch.tensor([prompt_with([6], [[5, 6, 7], [8, 9]])], device=DEVICE)
    b = torch.tensor([prompt_with([6], [[10, 11, 12], [13, 14]])], device=DEVICE)
    got = m(torch.cat([a, b]), pixel_values=torch.cat([pa, pb]), image_grid_thw=torch.cat([ga, gb]))
    for i, (ids, pv, g) in enumerate(((a, pa, ga), (b, pb, gb))):
        want = hf_logits(hf, ids, pv, g)[0]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@torch.no_grad()
def test_a_prompt_with_images_padded_for_its_graph_gives_the_unpadded_logits(monkeypatch):
    """The prefill graph's padding with images (two prompts of one batch: per-token rotary rows padded, the image
    tokens' flat indices moved to the padded layout, the deepstack features added there) and for the text chunk
    after them (its rotary rows continued from the prompt's offset): the logits as the unpadded forward's."""
    from .test_llama import PaddedEagerly
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    m.setup_caches(2, 160)
    (pa, ga), (pb, gb) = images([[1, 4, 6]]), images([[1, 6, 4]])
    a = prompt_with([6], [[5, 6, 7], [8, 9]])
    b = prompt_with([6], [[10, 11, 12], [13, 14, 15]])
    ids = torch.tensor([a + [0], b], device=DEVICE)
    lengths, at = [len(a), len(b)], torch.tensor([len(a) - 1, len(b) - 1], device=DEVICE)
    kw = dict(pixel_values=torch.cat([pa, pb]), image_grid_thw=torch.cat([ga, gb]), lengths=lengths)
    more, at2 = torch.randint(0, 140, (2, 3), device=DEVICE), torch.tensor([2, 1], device=DEVICE)
    T = ids.shape[1]
    with torch.enable_grad():                      # where no graph could run: unpadded
        want, want2 = m(ids, 0, logits_at=at, **kw), m(more, T, logits_at=at2)
    stand = PaddedEagerly()
    monkeypatch.setattr(m, "prefill_graphs", stand)
    got, got2 = m(ids, 0, logits_at=at, **kw), m(more, T, logits_at=at2)
    assert stand.keys == [(2, 64, 0), (2, 64, T)]
    for g, w in ((got, want), (got2, want2)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * w.abs().max().item())


def test_generate_with_an_image_follows_transformers_greedy():
    """32 greedy tokens after a prompt with an image (prefill into the cache, then decode with the prompt's rotary
    offset): each token transformers' argmax given the same prefix."""
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    pv, grid = images([[1, 4, 6]])
    ids = torch.tensor([prompt_with([6], [[5, 6, 7], [8, 9]])], device=DEVICE)
    got = m.generate(ids, 32, pixel_values=pv, image_grid_thw=grid)
    assert got.shape == (1, ids.shape[1] + 32)
    lg = hf_logits(hf, got, pv, grid)[0]
    for t in range(ids.shape[1], got.shape[1]):
        assert lg[t - 1, got[0, t]] >= lg[t - 1].max() - 1e-4 * lg[t - 1].abs().max()


def test_image_token_count_must_match_the_grid():
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    pv, grid = images([[1, 4, 6]])
    short = torch.tensor([prompt_with([5], [[5], [6]])], device=DEVICE)
    with pytest.raises(ValueError, match=r"image 0 needs 6 consecutive image tokens"):
        m(short, pixel_values=pv, image_grid_thw=grid)
    none = torch.tensor([[5, 6, 7]], device=DEVICE)
    with pytest.raises(ValueError, match=r"image_grid_thw has 1 image\(s\) but input_ids' image tokens make 0"):
        m(none, pixel_values=pv, image_grid_thw=grid)
    text_only = from_pretrained(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **{k: v for k, v in TEXT.items() if k != "rope_parameters"})).eval().to(DEVICE), device=DEVICE,
        dtype=torch.float32)
    with pytest.raises(ValueError, match="given to a model without a vision encoder"):
        text_only(none, pixel_values=pv, image_grid_thw=grid)


def test_image_tokens_without_images_are_refused():
    """A prompt holding image placeholders but no pixel_values (a forgotten image, a template's placeholders):
    refused by the forward and by generate before any token comes back, not embedded as text."""
    hf = hf_vl()
    m = from_pretrained(hf, device=DEVICE, dtype=torch.float32)
    ids = torch.tensor([prompt_with([6], [[5], [7]])], device=DEVICE)
    msg = r"input_ids hold 6 image placeholder token\(s\) \(image_token_id 150\) but no pixel_values"
    for pos in (None, 0):
        with pytest.raises(ValueError, match=msg):
            m(ids, pos)
    with pytest.raises(ValueError, match=msg):
        m.generate(ids[0].tolist(), 3)
    text = torch.tensor([[5, 6, 7]], device=DEVICE)           # plain text still runs, and so do its decode steps
    assert m(text).shape == (1, 3, TEXT["vocab_size"])
    assert len(m.generate(text[0].tolist(), 3)) == 6


@pytest.mark.parametrize("scheme", ["w4a16", "w8a16", "w8a8", "w8a8-fp8"])
def test_quantized_image_and_text_logits_match_quantized_transformers(scheme):
    """Every scheme with an image in the prompt: transformers' model converted by quantize_ (vision and language
    linears) and the runtime built from it (the same codes) agree as the text path's quantized tests ask (2%); FP8
    activations 5%: a bf16 rounding that differs between the two flips an e4m3 code (a 6% step), and this model's
    text prompts alone differ by 3.5% there."""
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    hf = hf_vl(dt)
    qk.quantize_(hf, scheme, group_size=32 if scheme == "w4a16" else None, fuse=False, progress=False)
    m = from_pretrained(hf, device=DEVICE, dtype=dt)
    assert isinstance(m.visual.blocks[0].qkv, qk.QuantizedLinear)
    pv, grid = images([[1, 4, 6]])
    ids = torch.tensor([prompt_with([6], [[5, 6, 7], [8, 9]])], device=DEVICE)
    want = hf_logits(hf, ids, pv.to(dt), grid).float()
    got = m(ids, pixel_values=pv, image_grid_thw=grid).float()
    assert ((got - want).norm() / want.norm()).item() < (5e-2 if scheme == "w8a8-fp8" else 2e-2)

"""Qwen3-VL's vision encoder on qkernels' kernels: image patches in, the language model's image embeddings out
(with its deepstack features, the merged hidden states of a few early blocks).

The same computation as transformers' Qwen3VLVisionModel, on the inputs its image processor makes:
- pixel_values [patches, C * T * P * P]: each image's patches flattened, in spatial-merge-block order (the m x m
  patches that become one language-model token are consecutive); image_grid_thw [images, 3] its (t, h, w) patches;
- the patch embedding (a Conv3d whose stride is its kernel: one linear over a flattened patch), plus the learned
  position table resampled to each image's grid (bilinear, corners aligned) in that block order;
- blocks of LayerNorm -> attention over each image's own patches (2-D rotary positions on q and k, PyTorch's
  scaled_dot_product_attention: no mask between images is needed, each image attends alone) -> LayerNorm -> MLP;
- the merger: LayerNorm, the m x m patches of a block concatenated, fc1, GELU, fc2; the deepstack mergers the same
  with the LayerNorm after the concatenation, on the hidden states after their blocks.
The blocks' linears are quantized like the decoder's (`from_pretrained(..., scheme)`); the norms run the layer_norm
kernel; the patch embedding, the position table and the mergers stay in the model's float dtype. Without gradients on
a GPU, an image size seen before runs as a CUDA graph (models/graphs.py): at one image's patches the blocks' launches
cost more host time than GPU time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import reference as ref
from .._runtime import runs_kernels
from .graphs import ShapeGraphs, weights_key


@dataclass(frozen=True)
class VisionArgs:
    depth: int
    dim: int
    n_heads: int
    intermediate_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    merge: int                   # spatial_merge_size: m x m patches per language-model token
    out_dim: int                 # the language model's hidden size
    num_position_embeddings: int
    deepstack: tuple             # the blocks whose outputs feed the deepstack mergers, in order
    act: str                     # the blocks' MLP activation
    rope_theta: float
    image_token_id: int          # the placeholder token an image's embeddings replace in the prompt
    mrope_section: tuple         # the language model's rotary frequencies per (temporal, height, width) position

    @classmethod
    def from_hf(cls, cfg: dict) -> "VisionArgs":
        """From a Qwen3-VL config.json dict's vision_config."""
        v = cfg.get("vision_config")
        if not v:
            raise ValueError("config.json has no vision_config: not a vision-language model")
        act = v.get("hidden_act", "gelu_pytorch_tanh")
        if act not in _ACTS:
            raise ValueError(f"vision_config.hidden_act must be one of {sorted(_ACTS)}, got {act!r}")
        rope = v.get("rope_parameters") or {}
        side = int(v.get("num_position_embeddings", 0) ** 0.5)
        if side * side != v.get("num_position_embeddings"):
            raise ValueError(f"vision_config.num_position_embeddings must be a square, got "
                             f"{v.get('num_position_embeddings')!r}")
        return cls(depth=v["depth"], dim=v["hidden_size"], n_heads=v["num_heads"],
                   intermediate_size=v["intermediate_size"], in_channels=v.get("in_channels", 3),
                   patch_size=v["patch_size"], temporal_patch_size=v.get("temporal_patch_size", 2),
                   merge=v.get("spatial_merge_size", 2), out_dim=v["out_hidden_size"],
                   num_position_embeddings=v["num_position_embeddings"],
                   deepstack=tuple(v.get("deepstack_visual_indexes") or ()), act=act,
                   rope_theta=float(rope.get("rope_theta", v.get("rope_theta", 10000.0))),
                   image_token_id=int(cfg.get("image_token_id", 151655)), mrope_section=_mrope_section(cfg))

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


def _mrope_section(cfg: dict) -> tuple:
    text = cfg.get("text_config") or {}
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    section = tuple(rope.get("mrope_section") or (24, 20, 20))
    head_dim = text.get("head_dim") or text.get("hidden_size", 0) // max(text.get("num_attention_heads", 1), 1)
    if len(section) != 3 or (head_dim and sum(section) != head_dim // 2):
        raise ValueError(f"text_config's mrope_section must be three numbers adding up to head_dim / 2 = "
                         f"{head_dim // 2}, got {list(section)}")
    return section


_ACTS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu,
         "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x)}


def layer_norm(x: torch.Tensor, norm: tuple, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm with (weight, bias): the kernel where it runs, its reference twin elsewhere."""
    if runs_kernels(x):
        from ..ops.fused import layer_norm as kernel
        return kernel(x, norm[0], norm[1], eps)
    return ref.layer_norm(x, norm[0], norm[1], eps)[0]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on x [N, heads, D] with cos / sin [N, D / 2], in fp32, rounded to x's dtype."""
    return ref.rotate(x.float(), cos[:, None], sin[:, None]).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.act = _ACTS[args.act]
        self.norm1 = self.norm2 = None          # (weight, bias) pairs, set by the loader
        self.qkv = self.proj = self.fc1 = self.fc2 = None

    def forward(self, x: torch.Tensor, rope: tuple, lengths: list) -> torch.Tensor:
        N, D = x.shape
        qkv = self.qkv(layer_norm(x, self.norm1)).view(N, 3, self.n_heads, D // self.n_heads)
        q, k = rotate(qkv[:, 0], *rope), rotate(qkv[:, 1], *rope)
        v = qkv[:, 2]
        out = torch.empty(N, self.n_heads, D // self.n_heads, dtype=x.dtype, device=x.device)
        start = 0
        for n in lengths:                        # each image (frame) attends to its own patches
            sl = slice(start, start + n)
            o = F.scaled_dot_product_attention(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                                               v[sl].transpose(0, 1)[None])
            out[sl] = o[0].transpose(0, 1)
            start += n
        x = x + self.proj(out.view(N, D))
        return x + self.fc2(self.act(self.fc1(layer_norm(x, self.norm2))))


class Merger(nn.Module):
    """m x m patches -> one language-model token: LayerNorm before the concatenation (the final merger) or after it
    (the deepstack mergers), then fc1, GELU, fc2."""

    def __init__(self, args: VisionArgs, post_shuffle: bool):
        super().__init__()
        self.width = args.dim * args.merge ** 2
        self.post_shuffle = post_shuffle
        self.norm = None
        self.fc1 = self.fc2 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.post_shuffle:
            x = layer_norm(x.reshape(-1, self.width), self.norm)
        else:
            x = layer_norm(x, self.norm).reshape(-1, self.width)
        return self.fc2(F.gelu(self.fc1(x)))


class VisionTower(nn.Module):
    def __init__(self, args: VisionArgs):
        super().__init__()
        self.args = args
        self.side = int(args.num_position_embeddings ** 0.5)
        self.patch_embed = None                  # a linear over flattened patches (the Conv3d's weight)
        self.pos_embed = None                    # [side * side, dim]
        self.blocks = nn.ModuleList(VisionBlock(args) for _ in range(args.depth))
        self.merger = Merger(args, post_shuffle=False)
        self.deepstack_mergers = nn.ModuleList(Merger(args, post_shuffle=True) for _ in args.deepstack)
        hd = args.dim // args.n_heads
        half = hd // 2
        self.register_buffer("inv_freq", 1.0 / args.rope_theta ** (torch.arange(0, half, 2).float() / half),
                             persistent=False)
        # an image size seen twice runs as a CUDA graph from then on (the blocks' launches cost more host time than
        # their GPU time at one image's patches)
        self.graphs = ShapeGraphs()

    @property
    def device(self) -> torch.device:
        return self.pos_embed.device

    def check(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> list:
        """The images' (t, h, w) as ints, after checking the inputs against each other and the config."""
        a = self.args
        if not isinstance(grid_thw, torch.Tensor) or grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"image_grid_thw must be an [images, 3] tensor of (t, h, w) patches, got "
                             f"{getattr(grid_thw, 'shape', type(grid_thw).__name__)}")
        grid = [tuple(int(v) for v in row) for row in grid_thw.tolist()]
        for i, (t, h, w) in enumerate(grid):
            if t < 1 or h < 1 or w < 1 or h % a.merge or w % a.merge:
                raise ValueError(f"image_grid_thw[{i}] must be positive with h and w multiples of "
                                 f"spatial_merge_size={a.merge}, got {(t, h, w)}")
        n = sum(t * h * w for t, h, w in grid)
        if not isinstance(pixel_values, torch.Tensor) or tuple(pixel_values.shape) != (n, a.patch_dim):
            raise ValueError(f"pixel_values must be [{n}, {a.patch_dim}] (the patches image_grid_thw counts, "
                             f"C * T * P * P each), got {tuple(getattr(pixel_values, 'shape', ()))}")
        # one count on the device and one host sync per call (the grid above needs one already): a NaN or Inf
        # patch would run through every block and the decoder without a word
        bad = int((~torch.isfinite(pixel_values)).sum())
        if bad:
            raise ValueError(f"pixel_values must be finite, got {bad} NaN / Inf value(s) of {pixel_values.numel()} "
                             f"(an image decoder or preprocessing fault before the model)")
        return grid

    def positions(self, grid: list) -> tuple:
        """(the resampled position embeddings [patches, dim], the rotary (cos, sin) [patches, head_dim / 2]) of the
        images' patches in spatial-merge-block order."""
        m, side, dev = self.args.merge, self.side, self.device
        table = self.pos_embed.float().view(side, side, -1).permute(2, 0, 1)[None]
        pos, hw = [], []
        for t, h, w in grid:
            p = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0].permute(1, 2, 0)
            pos.append(_blocks(p, m).repeat(t, 1))
            ii, jj = torch.meshgrid(torch.arange(h, device=dev), torch.arange(w, device=dev), indexing="ij")
            hw.append(torch.stack([_blocks(ii[..., None], m)[:, 0], _blocks(jj[..., None], m)[:, 0]], -1).repeat(t, 1))
        hw = torch.cat(hw).float()
        freqs = torch.cat([hw[:, :1] * self.inv_freq, hw[:, 1:] * self.inv_freq], dim=-1)
        return torch.cat(pos), (freqs.cos(), freqs.sin())

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list]:
        """(image embeddings [tokens, out_dim], the deepstack features: one [tokens, out_dim] per deepstack block),
        tokens = patches / merge^2, images in order. Without gradients on a GPU, images of sizes seen before run as
        a CUDA graph (self.graphs; the same kernels, the same results)."""
        grid = self.check(pixel_values, grid_thw)
        pv = pixel_values.to(self.device, self.pos_embed.dtype)
        out = self.graphs(lambda: (tuple(grid), weights_key(self)), lambda p: self._encode(p, grid), pv)
        return out[0], list(out[1:])

    def _encode(self, pixel_values: torch.Tensor, grid: list) -> tuple:
        """(image embeddings, *deepstack features) of pixel_values (on the tower's device and dtype) on GPU work
        alone: what a graph of the tower holds."""
        pos, rope = self.positions(grid)
        x = self.patch_embed(pixel_values) + pos.to(pixel_values.dtype)
        lengths = [h * w for t, h, w in grid for _ in range(t)]
        deep = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, rope, lengths)
            if i in self.args.deepstack:
                deep.append(self.deepstack_mergers[self.args.deepstack.index(i)](x))
        return (self.merger(x), *deep)


def _blocks(grid: torch.Tensor, m: int) -> torch.Tensor:
    """[h, w, C] -> [h * w, C] in spatial-merge-block order (block row, block column, then the m x m inside)."""
    h, w, c = grid.shape
    return grid.reshape(h // m, m, w // m, m, c).permute(0, 2, 1, 3, 4).reshape(h * w, c)


class Prompt(NamedTuple):
    """What a prompt with images changes in the decoder's forward: the token embeddings with the images' in place
    ([B * T, dim]), per-token rotary tables (cos, sin [B * T, D / 2]) and each token's row of them (rope_pos [B, T]),
    the deepstack features and the flat indices of the image tokens they add to, and each sequence's rotary offset
    for the tokens after the prompt (delta [B]: a new token at cache position p is rotated as position p + delta)."""
    embeds: torch.Tensor
    rope: tuple
    rope_pos: torch.Tensor
    deep: list
    where: torch.Tensor
    delta: torch.Tensor


def image_runs(row: list, image_token_id: int, sizes: list, first: int) -> list:
    """The images of one prompt: [(start, image index)] for runs of image tokens, images taken in order from
    `first`, each filling sizes[i] consecutive tokens (a run may hold several images back to back)."""
    out, i, t = [], first, 0
    while t < len(row):
        if row[t] != image_token_id:
            t += 1
            continue
        if i >= len(sizes):
            raise ValueError(f"input_ids hold more image tokens than image_grid_thw's {len(sizes)} image(s) make")
        if row[t:t + sizes[i]] != [image_token_id] * sizes[i]:
            raise ValueError(f"image {i} needs {sizes[i]} consecutive image tokens (its grid's patches / "
                             f"spatial_merge_size^2) at token {t} of its prompt")
        out.append((t, i))
        t += sizes[i]
        i += 1
    return out


def prompt(model, input_ids: torch.Tensor, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor,
           lengths=None) -> Prompt:
    """The multimodal part of a forward over input_ids [B, T] whose image tokens stand for the images of
    pixel_values / image_grid_thw (as the model's processor makes them; images in prompt order). lengths: each
    prompt's tokens (the rest is padding), default T."""
    vis, a = model.visual, model.visual.args
    grid = vis.check(pixel_values, image_grid_thw)
    sizes = [t * h * w // a.merge ** 2 for t, h, w in grid]
    B, T = input_ids.shape
    lengths = [T] * B if lengths is None else [int(n) for n in lengths]
    rows = input_ids.tolist()
    runs, first = [], 0
    for b in range(B):
        runs.append(image_runs(rows[b][:lengths[b]], a.image_token_id, sizes, first))
        first += len(runs[-1])
    if first != len(sizes):
        raise ValueError(f"image_grid_thw has {len(sizes)} image(s) but input_ids' image tokens make {first}")
    embeds, deep = vis(pixel_values, image_grid_thw)
    # 3-D positions: text tokens advance all three by one; an image's tokens take its (t, h, w) grid offset by
    # the position it starts at, and the text after it starts past its largest spatial extent
    pos3 = torch.zeros(3, B, T, dtype=torch.long)
    delta = torch.zeros(B, dtype=torch.long)
    where = []
    for b in range(B):
        cur, t = 0, 0
        for start, i in runs[b] + [(lengths[b], None)]:
            n = start - t
            pos3[:, b, t:start] = torch.arange(cur, cur + n)
            cur += n
            if i is None:
                break
            gt, gh, gw = grid[i][0], grid[i][1] // a.merge, grid[i][2] // a.merge
            tt, hh, ww = torch.meshgrid(torch.arange(gt), torch.arange(gh), torch.arange(gw), indexing="ij")
            pos3[:, b, start:start + sizes[i]] = torch.stack([tt, hh, ww]).reshape(3, -1) + cur
            where.append(torch.arange(start, start + sizes[i]) + b * T)
            cur += max(gh, gw)
            t = start + sizes[i]
        delta[b] = cur - lengths[b]
    dev = model.device
    x = model.embed(input_ids).view(B * T, -1)
    where = torch.cat(where).to(dev)
    x = x.index_copy(0, where, embeds.to(x.dtype))
    inv = ref.rope_inv_freq(model.args.head_dim, model.args.rope_theta, model.args.rope_scaling).to(dev)
    rope = ref.mrope_tables(inv, pos3.reshape(3, B * T).to(dev), a.mrope_section)
    rope_pos = torch.arange(B * T, device=dev).view(B, T)
    return Prompt(x, rope, rope_pos, deep, where, delta.to(dev))

"""AWQ: activation-aware weight quantization (Lin et al., 2023), as a transformation of the float model
before round-to-nearest.

Input channels that carry large activations matter most to a layer's output. AWQ scales such a channel's
weights up by s_j (so rounding loses relatively less of them) and divides the producer of that input
channel by s_j (an RMSNorm weight, or the output rows of the linear before), which leaves the float model's
function unchanged. Per group of linears that share one input:

  scale search   s = mean|x|^a / sqrt(max * min) for a on a grid in [0, 1); the a whose quantized
                 linears (weights W * s quantized, then / s) reproduce the float outputs x W^T best on the
                 calibration inputs, by mean squared error, wins.
  clipping       then per linear (q and k excepted: their errors pass through the softmax) and per output
                 row and group: the clipping range max|w| * r, r on a grid in [0.5, 1], whose quantized
                 group best reproduces that group's share of the outputs.

Pairs handled in Llama / Qwen / Mistral-style decoder layers (by attribute name, as nn.smooth):
input_layernorm -> q/k/v, v_proj -> o_proj (multi-head attention only: with grouped-query attention v's
rows do not map one to one onto o's inputs), post_attention_layernorm -> gate/up, up_proj -> down_proj.
The quantization grid is PackedWeight.from_float's (min-max per group, scales rounded to their stored
dtype), so the search scores exactly what quantize_ then stores. Entry point:
quantize_(model, "w4a16", method="awq", calibration=...).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..packed_weight import _check_group
from .gptq import _grid
from .smooth import fold_scales

GRID = 20            # points of the scale-exponent grid and of the clipping grid
MAX_SHRINK = 0.5     # clipping: r in [1 - MAX_SHRINK, 1]
SEARCH_TOKENS = 4096  # calibration rows used by the scale search (evenly spaced)
CLIP_TOKENS = 512    # ... and by the clipping search
CLIP_ROWS = 1024     # output rows per step of the clipping search (bounds its memory)


def fake_quantize(w: torch.Tensor, bits: int, group_size: int, symmetric: bool,
                  scale_dtype: torch.dtype) -> torch.Tensor:
    """What PackedWeight.from_float(w, ...).dequantize() returns (fp32), without packing."""
    N, K = w.shape
    G = _check_group(group_size, K, bits)
    seg = w.float().reshape(-1, G)
    s, z = _grid(seg, bits, symmetric, scale_dtype)
    s = s[:, None]
    inv = 1.0 / s
    if z is None:
        q = torch.round(torch.clamp(seg * inv, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
    else:
        z = z[:, None]
        q = torch.round(torch.minimum(torch.maximum(seg * inv, -z), (2 ** bits - 1) - z))
    return (q * s).reshape(N, K)


def _sample(x: torch.Tensor, n: int) -> torch.Tensor:
    """At most n evenly spaced rows of x [..., K] as [rows, K], fp32."""
    x = x.reshape(-1, x.shape[-1])
    if x.shape[0] <= n:
        return x.float()
    idx = torch.linspace(0, x.shape[0] - 1, n, device=x.device).round().long()
    return x[idx].float()


@torch.no_grad()
def search_scale(x: torch.Tensor, linears: list[nn.Linear], bits: int, group_size: int, symmetric: bool,
                 scale_dtype: torch.dtype) -> torch.Tensor:
    """The per-input-channel scales s [K] (fp32) for linears sharing input x [T, K] (module docstring);
    all ones when no exponent beats plain rounding."""
    x = _sample(x, SEARCH_TOKENS)
    W = torch.cat([m.weight.float() for m in linears])
    ref_out = x @ W.t()
    x_mean = x.abs().mean(0)
    best, best_s = None, torch.ones_like(x_mean)
    for i in range(GRID):
        a = i / GRID
        s = x_mean.pow(a).clamp_min(1e-4)
        s = s / (s.max() * s.min()).sqrt()
        Wq = fake_quantize(W * s, bits, group_size, symmetric, scale_dtype) / s
        err = (x @ Wq.t() - ref_out).pow(2).mean().item()
        if best is None or err < best:
            best, best_s = err, s
    return best_s


@torch.no_grad()
def search_clip(x: torch.Tensor, w: torch.Tensor, bits: int, group_size: int, symmetric: bool,
                scale_dtype: torch.dtype) -> torch.Tensor:
    """Per output row and group, the clipping bound [N, ng] (fp32) that best preserves x [T, K] @ w.T."""
    N, K = w.shape
    G = _check_group(group_size, K, bits)
    ng = K // G
    x = _sample(x, CLIP_TOKENS).reshape(-1, ng, G)                           # [T, ng, G]
    bounds = []
    for r0 in range(0, N, CLIP_ROWS):
        wb = w[r0:r0 + CLIP_ROWS].float().reshape(-1, ng, G)                 # [n, ng, G]
        amax = wb.abs().amax(-1)                                             # [n, ng]
        ref_out = torch.einsum("tgk,ngk->tng", x, wb)
        best_err = torch.full_like(amax, float("inf"))
        best = amax.clone()
        for i in range(int(GRID * MAX_SHRINK) + 1):
            bound = amax * (1 - i / GRID)
            wc = torch.maximum(torch.minimum(wb, bound[..., None]), -bound[..., None])
            wq = fake_quantize(wc.reshape(-1, K), bits, group_size, symmetric, scale_dtype).reshape(wb.shape)
            err = (torch.einsum("tgk,ngk->tng", x, wq) - ref_out).pow(2).mean(0)
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best = torch.where(better, bound, best)
        bounds.append(best)
    return torch.cat(bounds)


def _groups(layer: nn.Module):
    """(producer, [names of the linears it feeds]) of one decoder layer, in computation order."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    ln1, ln2 = getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)
    out = []
    if attn is not None and ln1 is not None and getattr(ln1, "weight", None) is not None:
        out.append((ln1, [f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]))
    if attn is not None:
        v, o = getattr(attn, "v_proj", None), getattr(attn, "o_proj", None)
        if isinstance(v, nn.Linear) and isinstance(o, nn.Linear) and v.out_features == o.in_features:
            out.append((v, ["self_attn.o_proj"]))
    if mlp is not None and ln2 is not None and getattr(ln2, "weight", None) is not None:
        out.append((ln2, ["mlp.gate_proj", "mlp.up_proj"]))
        up = getattr(mlp, "up_proj", None)
        if isinstance(up, nn.Linear):
            out.append((up, ["mlp.down_proj"]))
    return out


@torch.no_grad()
def awq_(model: nn.Module, calibration, bits: int = 4, group_size: int = 128, symmetric: bool = False, *,
         wanted: Callable[[str, nn.Linear], bool] = lambda name, mod: True, clip: bool = True, device=None,
         scale_dtype: torch.dtype | None = None, progress: bool = False) -> int:
    """AWQ-transform the float model in place (module docstring): scales folded wherever a producer and all
    the linears it feeds are wanted(qualified name, module), then (clip) the clipping search on every wanted
    linear of the decoder layers. Walks the layers with nn.calibrate.walk_layers. Returns the number of linears
    scaled."""
    from .calibrate import batches_of, walk_layers
    calibration = batches_of(calibration)
    per_batch = max(16, -(-SEARCH_TOKENS // len(calibration)))     # rows kept per batch and linear
    done = [0]

    def visit(prefix: str, layer: nn.Module, run):
        sdt = scale_dtype or next(layer.parameters()).dtype
        sdt = sdt if sdt in (torch.float16, torch.bfloat16) else torch.float16
        lins = {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear) and wanted(f"{prefix}.{n}", m)}
        feeds = {}         # linear -> evenly spaced rows of the inputs it saw, per batch
        hooks = []
        for n, m in lins.items():
            def hook(mod, args, n=n):
                feeds.setdefault(n, []).append(_sample(args[0].detach(), per_batch))
            hooks.append(m.register_forward_pre_hook(hook))
        try:
            run()
        finally:
            for h in hooks:
                h.remove()
        inputs = {n: torch.cat(v) for n, v in feeds.items()}
        for producer, names in _groups(layer):
            if not all(n in lins for n in names):
                continue
            group = [lins[n] for n in names]
            s = search_scale(inputs[names[0]], group, bits, group_size, symmetric, sdt)
            fold_scales(producer, group, s)
            for n in names:
                inputs[n] = inputs[n] / s.to(inputs[n].dtype)
            done[0] += len(group)
        for n, m in lins.items():
            if not clip or n.endswith(("q_proj", "k_proj")) or n not in inputs:
                continue
            bound = search_clip(inputs[n], m.weight, bits, group_size, symmetric, sdt)
            G = _check_group(group_size, m.in_features, bits)
            w = m.weight.float().reshape(m.out_features, -1, G)
            m.weight.copy_(torch.maximum(torch.minimum(w, bound[..., None]), -bound[..., None]).reshape(m.weight.shape))

    walk_layers(model, calibration, visit, device, progress="awq" if progress else None)
    return done[0]

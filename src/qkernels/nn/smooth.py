"""SmoothQuant-style smoothing for W8A8: move activation outliers into the weights before quantizing.

For a linear y = x W^T fed by a per-channel-scalable producer (an RMSNorm / LayerNorm weight, or
the rows of the linear before it), choose s_j = max|x_j|^alpha / max|W_:,j|^(1 - alpha) from
calibration data, divide the producer's output channel j by s_j and multiply the weight's column j
by s_j. The float model computes the same function (up to rounding); its activations get flatter,
so per-token int8 / fp8 quantization loses less.

Pairs handled in Llama / Qwen / Mistral-style decoder layers (found by attribute names):
  input_layernorm          -> self_attn.q_proj, k_proj, v_proj
  post_attention_layernorm -> mlp.gate_proj, up_proj
  mlp.up_proj (rows)       -> mlp.down_proj        (down's input is act(gate) * up)
o_proj is left alone: with grouped-query attention its input channels are not one-to-one with
v_proj's output rows.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def _groups(model: nn.Module):
    """(producer, [linears], name of the first linear) for every smoothable pair."""
    for name, mod in model.named_modules():
        attn, mlp = getattr(mod, "self_attn", None), getattr(mod, "mlp", None)
        ln1, ln2 = getattr(mod, "input_layernorm", None), getattr(mod, "post_attention_layernorm", None)
        qkv = [getattr(attn, a, None) for a in ("q_proj", "k_proj", "v_proj")] if attn is not None else []
        if ln1 is not None and getattr(ln1, "weight", None) is not None and qkv and all(
                isinstance(x, nn.Linear) for x in qkv):
            yield ln1, qkv, f"{name}.self_attn.q_proj"
        gu = [getattr(mlp, a, None) for a in ("gate_proj", "up_proj")] if mlp is not None else []
        if ln2 is not None and getattr(ln2, "weight", None) is not None and gu and all(
                isinstance(x, nn.Linear) for x in gu):
            yield ln2, gu, f"{name}.mlp.gate_proj"
            down = getattr(mlp, "down_proj", None)
            if isinstance(down, nn.Linear):
                yield gu[1], [down], f"{name}.mlp.down_proj"


def fold_scales(producer: nn.Module, linears: list[nn.Linear], s: torch.Tensor) -> None:
    """Divide the producer's output channel j by s_j (a norm's weight, or a linear's row and bias) and multiply
    each consumer linear's input column j by s_j: the float model computes the same function. Shared by
    SmoothQuant (here) and AWQ (nn.awq)."""
    if isinstance(producer, nn.Linear):
        producer.weight.div_(s.reshape(-1, 1).to(producer.weight.dtype))
        if producer.bias is not None:
            producer.bias.div_(s.to(producer.bias.dtype))
    else:
        producer.weight.div_(s.to(producer.weight.dtype))
        if getattr(producer, "bias", None) is not None:
            producer.bias.div_(s.to(producer.bias.dtype))
    for lin in linears:
        lin.weight.mul_(s.to(lin.weight.dtype))


@torch.no_grad()
def smooth_(model: nn.Module, calibration: Iterable[torch.Tensor] | torch.Tensor, alpha: float = 0.5) -> int:
    """Smooth `model` in place (float model, before quantize_). calibration: a token-id tensor
    [batch, seq] or an iterable of such batches, run through the model to collect per-channel input
    absmax of each linear. alpha in [0, 1]: how much of the activation range moves to the weights.
    Returns the number of linears smoothed."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    groups = list(_groups(model))
    if not groups:
        return 0
    wanted = {key for _, _, key in groups}
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if name in wanted:
            def hook(mod, inp, out, name=name):
                a = inp[0].detach().abs().float().reshape(-1, inp[0].shape[-1]).amax(0)
                amax[name] = torch.maximum(amax[name], a) if name in amax else a
            hooks.append(mod.register_forward_hook(hook))
    try:
        batches = [calibration] if isinstance(calibration, torch.Tensor) else calibration
        for ids in batches:
            model(ids.to(next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    done = 0
    for producer, lins, key in groups:
        if key not in amax:
            continue
        a = amax[key].clamp_min(1e-5)
        w = torch.stack([lin.weight.abs().float().amax(0) for lin in lins]).amax(0).clamp_min(1e-5)
        s = (a.pow(alpha) / w.pow(1 - alpha)).clamp(1e-5, 1e5)
        fold_scales(producer, lins, s)
        done += len(lins)
    return done

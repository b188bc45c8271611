"""Calibration walks for the error-compensating quantizers (GPTQ, AWQ): run token batches through a
decoder model one decoder layer at a time.

`walk_layers(model, calibration, visit, device)` captures the hidden states entering the first decoder
layer (the embedding runs once per batch), then for each layer in order calls
`visit(prefix, layer, run)`, where `run()` pushes every calibration batch through this layer as it is now
and returns the outputs; after the visit the layer's outputs (with whatever the visit changed: quantized
weights) become the next layer's inputs. So each layer is calibrated on what the already-quantized layers
before it produce, and only one decoder layer need be on `device` at a time.

Decoder layers are found as the longest nn.ModuleList of modules holding nn.Linear children (the
`model.layers` of Llama / Qwen / Mistral-style models); they are called as HF decoder layers are,
`layer(hidden_states, **kwargs)`, with the keyword arguments the model itself passed (attention mask,
position embeddings).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(qualified name, the ModuleList) of the model's decoder layers."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and all(
                any(isinstance(m, nn.Linear) for m in child.modules()) for child in mod):
            if best is None or len(mod) > len(best[1]):
                best = (name, mod)
    if best is None:
        raise ValueError(f"model must hold its decoder layers in an nn.ModuleList (as HF causal LMs do), found none "
                         f"in {type(model).__name__}")
    return best


def batches_of(calibration) -> list[torch.Tensor]:
    """calibration: token ids [batch, seq] or an iterable of them -> a list of 2-D int tensors."""
    if calibration is None:
        raise ValueError("calibration must be token ids [batch, seq] or an iterable of them, got None")
    out = [calibration] if isinstance(calibration, torch.Tensor) else list(calibration)
    if not out:
        raise ValueError("calibration must hold at least one batch of token ids, got an empty iterable")
    for i, ids in enumerate(out):
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point or ids.numel() == 0:
            raise ValueError(f"calibration batch {i} must be a non-empty 2-D integer tensor of token ids, got "
                             f"{type(ids).__name__} {getattr(ids, 'shape', '')} {getattr(ids, 'dtype', '')}")
    return out


class _Captured(Exception):
    pass


def _move(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


@torch.no_grad()
def walk_layers(model: nn.Module, calibration, visit: Callable[[str, nn.Module, Callable[[], list]], None],
                device=None, progress: str | None = None) -> None:
    """Walk the decoder layers (module docstring). device: where each layer runs while visited (default: where
    the model is); a layer moved there goes back to its own device after its visit. The capture (embeddings,
    rotary tables) runs where the model is; its outputs then move to `device`, so on a GPU only one decoder
    layer and the calibration activations are ever held. progress: a tqdm bar over the layers with this label
    (when tqdm is installed)."""
    prefix, layers = decoder_layers(model)
    batches = batches_of(calibration)
    home = next(model.parameters()).device
    device = torch.device(device) if device is not None else home
    layer_homes = [next(layer.parameters()).device for layer in layers]
    inputs, kwargs = [], []

    def capture(mod, args, kw):
        h = args[0] if args else kw.pop("hidden_states")
        inputs.append(h)
        kwargs.append({k: v for k, v in kw.items() if k not in ("past_key_values", "past_key_value", "use_cache")})
        raise _Captured

    hook = layers[0].register_forward_pre_hook(capture, with_kwargs=True)
    try:
        for ids in batches:
            try:
                model(ids.to(home), use_cache=False)
            except _Captured:
                pass
    finally:
        hook.remove()
    if len(inputs) != len(batches):
        raise RuntimeError(f"the first decoder layer of {prefix!r} was not reached by every calibration batch")
    kwargs = [_move(k, device) for k in kwargs]
    inputs = [h.to(device) for h in inputs]
    it = enumerate(layers)
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(it, total=len(layers), desc=progress, unit="layer", leave=False)
        except ImportError:
            pass
    for i, layer in it:
        layer.to(device)

        def run(layer=layer):
            outs = []
            for h, kw in zip(inputs, kwargs):
                o = layer(h, **kw)
                outs.append(o[0] if isinstance(o, (tuple, list)) else o)
            return outs

        visit(f"{prefix}.{i}" if prefix else str(i), layer, run)
        inputs = run()
        layer.to(layer_homes[i])

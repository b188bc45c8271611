"""Whole-model conversion: quantize_(model, scheme), save_quantized / load_quantized (safetensors +
a small JSON config).

quantize_ swaps every accepted nn.Linear for a QuantizedLinear in place, one layer at a time: the
float weight of a layer is released as soon as its quantized twin exists, so converting never holds
a second copy of the model. With `device=` a CPU model is converted onto the GPU layer by layer
(the full-precision model never goes to the GPU).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .fused import QuantizedMLP, RMSNorm, fusable, is_rms_norm
from .linear import SCHEMES, WEIGHT_ONLY_BITS, QuantizedLinear

CONFIG_NAME = "qkernels_config.json"
WEIGHTS_NAME = "model.safetensors"
_BUFFER_PREFIX = "__buffer__."   # non-persistent buffers (e.g. rotary inv_freq) saved under this prefix
FORMAT_VERSION = 1
_FUSED_SCHEMES = ("w8a8", "w8a8-fp8")
METHODS = ("rtn", "gptq", "awq", "awq+gptq")


def _scheme_error(scheme: str, device: torch.device) -> str | None:
    """Why `scheme` cannot run on `device` (None when it can)."""
    if scheme not in SCHEMES:
        return f"scheme must be one of {SCHEMES}, got {scheme!r}"
    if scheme == "w8a8-fp8" and device.type == "cuda":
        from .._runtime import capability, device_name
        cap = capability(device)
        if cap < (8, 9):
            return (f"scheme 'w8a8-fp8' needs FP8 tensor cores (compute capability >= 8.9), got "
                    f"{cap[0]}.{cap[1]} on {device_name(device)}")
    return None


def _layer_problem(layer: nn.Linear, scheme: str, group_size: int) -> str | None:
    """Why this layer's shape cannot take the scheme (it then stays in high precision)."""
    K = layer.in_features
    if scheme == "w4a16" and group_size != -1 and K % group_size:
        return f"in_features={K} is not divisible by group_size={group_size}"
    if scheme == "w8a8":
        from ..ops.gemm import MAX_K_INT8
        if K > MAX_K_INT8:
            return f"in_features={K} exceeds the exact int32 accumulation limit {MAX_K_INT8}"
    if layer.weight.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"weight dtype {layer.weight.dtype} is not a float type"
    return None


def _skipped(name: str, skip) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def _parent(model: nn.Module, name: str) -> nn.Module:
    parent_name = name.rpartition(".")[0]
    return model.get_submodule(parent_name) if parent_name else model


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def quantize_(model: nn.Module, scheme: str, *, group_size: int | None = None, symmetric: bool | None = None,
              filter_fn: Callable[[nn.Module, str], bool] | None = None, skip=("lm_head",),
              device=None, dtype: torch.dtype | None = None, calibration=None, smooth_alpha: float = 0.5,
              method: str = "rtn", act_order: bool = False, fuse: bool = True, progress: bool = True) -> nn.Module:
    """Quantize `model` in place: every nn.Linear named `name` for which `filter_fn(module, name)` is
    true (default: all) and whose name does not end in one of `skip` becomes a QuantizedLinear.

    scheme: "w8a8" (int8 weights per channel, dynamic per-token int8 activations), "w8a8-fp8",
    "w4a16" (group_size, default 128; asymmetric unless symmetric=True) or "w8a16" (per channel
    unless group_size is given; symmetric unless symmetric=False).
    Activations are fp16 / bf16: a float32 model needs `dtype` (float16 / bfloat16), to which the
    whole model is cast. Layers the scheme cannot take (e.g. in_features not
    divisible by group_size) stay in high precision and are listed in one warning.
    device: convert onto this device layer by layer (the rest of the model follows at the end).
    calibration: token ids [batch, seq] or an iterable of them. With the w8a8 schemes the model is first
    smoothed SmoothQuant-style (qkernels.nn.smooth.smooth_, strength smooth_alpha), which moves activation
    outliers into the weights; with the weight-only schemes it feeds `method`.
    method (weight-only schemes): "rtn" (round to nearest, min-max grid; no calibration), "gptq"
    (qkernels.nn.gptq: error-compensating rounding, decoder layer by decoder layer on the calibration
    inputs; act_order=True quantizes the most active input channels first) or "awq" (qkernels.nn.awq:
    activation-aware per-channel scales folded into the preceding norm / linear and a clipping search,
    then round to nearest) or "awq+gptq" (AWQ's scales, then GPTQ's rounding and range search). All need
    `calibration`; with `device` each decoder layer is calibrated there.
    fuse (default): Llama / Qwen-style RMSNorm modules become qkernels.nn.RMSNorm (one kernel), and
    with the w8a8 schemes each decoder layer's post-attention RMSNorm + SwiGLU MLP becomes a
    qkernels.nn.QuantizedMLP: the norm and SwiGLU kernels quantize the activations they produce,
    gate and up run as one GEMM (qkernels.nn.fused).
    Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be float16 or bfloat16 (the activation dtype), got {dtype}")
    device = torch.device(device) if device is not None else None
    bits = WEIGHT_ONLY_BITS.get(scheme)
    gs = group_size if group_size is not None else (128 if bits == 4 else -1)
    if bits is not None:
        from ..packed_weight import _check_group
        _check_group(gs, max(gs, 64), bits)   # group_size itself valid (pow2 >= 32 or -1)
    elif group_size not in (None, -1):
        raise ValueError(f"scheme {scheme!r} quantizes weights per output channel; group_size must be None or -1, "
                         f"got {group_size!r}")

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "rtn":
        if bits is None:
            raise ValueError(f"method {method!r} applies to the weight-only schemes (w4a16, w8a16), got scheme "
                             f"{scheme!r}")
        if calibration is None:
            raise ValueError(f"method {method!r} needs calibration: token ids [batch, seq] or an iterable of them")
        from .calibrate import batches_of
        calibration = batches_of(calibration)       # checked before anything changes
    elif calibration is not None:
        if not scheme.startswith("w8a8"):
            raise ValueError(f"calibration feeds SmoothQuant (w8a8 schemes) or method='gptq' / 'awq' (weight-only "
                             f"schemes); got scheme {scheme!r} with method 'rtn'")
        from .smooth import smooth_
        smooth_(model, calibration, smooth_alpha)
    if act_order and "gptq" not in method:
        raise ValueError(f"act_order applies to method='gptq' / 'awq+gptq', got method {method!r}")

    mlp_layers = []
    if fuse and scheme in _FUSED_SCHEMES:
        for name, mod in model.named_modules():
            if fusable(mod):
                names = [f"{name}.mlp.{p}" if name else f"mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")]
                if not any(_skipped(n, skip) or (filter_fn is not None and not filter_fn(model.get_submodule(n), n))
                           or _layer_problem(model.get_submodule(n), scheme, gs) for n in names):
                    mlp_layers.append(name)
    in_fused = tuple(f"{n}.mlp." if n else "mlp." for n in mlp_layers)
    targets, skipped = [], []
    for name, mod in model.named_modules():
        if in_fused and name.startswith(in_fused):
            continue
        if not isinstance(mod, nn.Linear) or isinstance(mod, QuantizedLinear):
            continue
        if _skipped(name, skip) or (filter_fn is not None and not filter_fn(mod, name)):
            continue
        why = _layer_problem(mod, scheme, gs)
        if why:
            skipped.append(f"{name} ({why})")
        else:
            targets.append(name)
    if targets:
        first = model.get_submodule(targets[0]).weight
        err = _scheme_error(scheme, device or first.device)
        if err:
            raise RuntimeError(err)

    if dtype is None:
        for name in targets:
            wdt = model.get_submodule(name).weight.dtype
            if wdt not in (torch.float16, torch.bfloat16):
                raise TypeError(f"the quantized schemes take float16 / bfloat16 activations, but layer {name!r} has "
                                f"weight dtype {str(wdt).replace('torch.', '')}: pass dtype=torch.float16 or "
                                f"torch.bfloat16 (the whole model is then cast to it), or cast the model first")
    packed = {}
    if targets and method != "rtn":
        chosen = set(targets)
        sym = symmetric if symmetric is not None else bits == 8
        sdt = dtype or model.get_submodule(targets[0]).weight.dtype
        sdt = sdt if sdt in (torch.float16, torch.bfloat16) else torch.float16
        if "awq" in method:
            from .awq import awq_
            # before GPTQ, whose per-group range search replaces AWQ's clipping (both would shrink the ranges)
            awq_(model, calibration, bits, gs, sym, wanted=lambda n, m: n in chosen, clip=method == "awq",
                 device=device, scale_dtype=sdt, progress=progress)
        if "gptq" in method:
            from .gptq import gptq_
            packed = gptq_(model, calibration, bits, gs, sym, wanted=lambda n, m: n in chosen, act_order=act_order,
                           device=device, scale_dtype=sdt, progress=progress)
    if mlp_layers:
        err = _scheme_error(scheme, device or model.get_submodule(mlp_layers[0]).mlp.gate_proj.weight.device)
        if err:
            raise RuntimeError(err)
        if dtype is None:
            wdt = model.get_submodule(mlp_layers[0]).mlp.gate_proj.weight.dtype
            if wdt not in (torch.float16, torch.bfloat16):
                raise TypeError(f"the quantized schemes take float16 / bfloat16 activations, got weight dtype "
                                f"{str(wdt).replace('torch.', '')}: pass dtype=torch.float16 or torch.bfloat16")
    for name in mlp_layers:     # fused norm + SwiGLU MLPs first (their linears are not in targets)
        layer = model.get_submodule(name)
        layer.mlp = QuantizedMLP.from_modules(layer.post_attention_layernorm, layer.mlp, scheme, device, dtype)
        layer.post_attention_layernorm = nn.Identity()
    if fuse:
        for name in [n for n, m in model.named_modules() if is_rms_norm(m) and not isinstance(m, RMSNorm)]:
            _set_module(model, name, RMSNorm.from_module(model.get_submodule(name)))
    it = targets
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(targets, desc=f"quantize_ {scheme}", unit="layer", leave=False)
        except ImportError:
            pass
    for name in it:
        lin = model.get_submodule(name)
        w = lin.weight
        dev, dt = device or w.device, dtype or w.dtype
        src = nn.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta")
        src.weight = nn.Parameter(w.detach().to(dev, dt), requires_grad=False)
        if lin.bias is not None:
            src.bias = nn.Parameter(lin.bias.detach().to(dev, dt), requires_grad=False)
        if name in packed:
            q = QuantizedLinear.from_packed(packed.pop(name).to(dev), src.bias)
        else:
            q = QuantizedLinear.from_linear(src, scheme, group_size=gs if bits else None, symmetric=symmetric)
        _set_module(model, name, q)
        del src, lin, w                      # the float weight goes now, not at the end
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)   # QuantizedLinear keeps its codes' and fp32 scales' dtypes
    if skipped:
        warnings.warn(f"quantize_({scheme!r}): {len(skipped)} linear layer(s) left in high precision: "
                      + "; ".join(skipped), stacklevel=2)
    return model


# ---------------------------------------------------------------------------------------------
# save / load


def _layer_entry(q: QuantizedLinear) -> dict:
    e = {"scheme": q.scheme, "in_features": q.in_features, "out_features": q.out_features,
         "bias": q.bias is not None}
    if q.scheme in WEIGHT_ONLY_BITS:
        e.update(group_size=q.group_size, symmetric=q.zeros is None, act_order=q.perm is not None,
                 dtype=str(q.scales.dtype).replace("torch.", ""))
    else:
        e.update(dtype=str(q.bias.dtype).replace("torch.", "") if q.bias is not None else "float16")
    return e


def save_quantized(model: nn.Module, path, format: str = "qkernels") -> Path:
    """Write `path/model.safetensors` (every tensor of the model, quantized layers as their codes and
    scales; tied weights stored once) and `path/qkernels_config.json` (which layers are quantized and
    how). format="gptq": a GPTQ directory instead (config.json with quantization_config; weight-only layers
    of one configuration: qkernels.nn.checkpoints.save_gptq), which GPTQ loaders and load_pretrained read.
    Returns the directory."""
    if format == "gptq":
        from .checkpoints import save_gptq
        return save_gptq(model, path)
    if format != "qkernels":
        raise ValueError(f"format must be 'qkernels' or 'gptq', got {format!r}")
    from safetensors.torch import save_file
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    layers = {n: _layer_entry(m) for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    state = model.state_dict()
    persistent = set(state)
    for name, buf in model.named_buffers():
        if name not in persistent and buf is not None:
            state[_BUFFER_PREFIX + name] = buf
    tensors, aliases, seen = {}, {}, {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
               t.dtype) if t.device.type != "meta" else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    save_file(tensors, str(out / WEIGHTS_NAME))
    fused = {"mlps": {n: {"hidden": m.hidden_size, "intermediate": m.intermediate_size,
                          "eps": m.norm.variance_epsilon, "scheme": m.scheme, "bias": m.down_proj.bias is not None}
                      for n, m in model.named_modules() if isinstance(m, QuantizedMLP)},
             "norms": {n: {"hidden": m.weight.shape[0], "eps": m.variance_epsilon}
                       for n, m in model.named_modules()
                       if isinstance(m, RMSNorm) and not isinstance(_parent(model, n), QuantizedMLP)}}
    cfg = {"format": "qkernels", "version": FORMAT_VERSION, "layers": layers, "aliases": aliases, "fused": fused}
    hf_cfg = getattr(model, "config", None)
    if hf_cfg is not None and hasattr(hf_cfg, "to_dict"):
        cfg["model_config"] = hf_cfg.to_dict()
    (out / CONFIG_NAME).write_text(json.dumps(cfg, indent=1, default=str))
    return out


def _build_from_config(model_config):
    """A model with no storage (meta device) from a transformers config."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config)


def load_quantized(model_or_config, path, *, device="cpu") -> nn.Module:
    """Restore what save_quantized wrote. `model_or_config`: the model (possibly built on the
    `meta` device: no full-precision copy is ever made) or a transformers config, from which a
    meta model is built. Quantized layers are swapped in from the JSON config, then every tensor is
    loaded from the safetensors file onto `device` (assigned, not copied). Returns the model."""
    from safetensors.torch import load_file
    src = Path(path)
    if not (src / CONFIG_NAME).exists():
        raise FileNotFoundError(f"path must hold {CONFIG_NAME} and {WEIGHTS_NAME} (from save_quantized), "
                                f"got {src}")
    cfg = json.loads((src / CONFIG_NAME).read_text())
    if cfg.get("format") != "qkernels":
        raise ValueError(f"{src / CONFIG_NAME} is not a qkernels config (format={cfg.get('format')!r})")
    model = model_or_config if isinstance(model_or_config, nn.Module) else _build_from_config(model_or_config)
    fused = cfg.get("fused", {})
    for name, e in fused.get("mlps", {}).items():
        layer = _parent(model, name)
        layer.mlp = QuantizedMLP(e["hidden"], e["intermediate"], e["eps"], e["scheme"], e["bias"], device="meta")
        layer.post_attention_layernorm = nn.Identity()
    for name, e in fused.get("norms", {}).items():
        _set_module(model, name, RMSNorm(e["hidden"], e["eps"], device="meta"))
    for name, e in cfg["layers"].items():
        dt = getattr(torch, e["dtype"])
        wo = e["scheme"] in WEIGHT_ONLY_BITS
        q = QuantizedLinear(e["in_features"], e["out_features"], e["bias"], e["scheme"], device="meta", dtype=dt,
                            group_size=e.get("group_size") if wo else None, symmetric=e.get("symmetric", False))
        if wo and e.get("act_order"):
            q.perm = torch.empty(e["in_features"], dtype=torch.int64, device="meta")
        _set_module(model, name, q)
    state = load_file(str(src / WEIGHTS_NAME), device=str(device))
    for name, target in cfg.get("aliases", {}).items():
        state[name] = state[target]
    buffers = {k[len(_BUFFER_PREFIX):]: state.pop(k) for k in list(state) if k.startswith(_BUFFER_PREFIX)}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"{src / WEIGHTS_NAME} does not match the model: missing {missing[:8]}, "
                           f"unexpected {unexpected[:8]}")
    for name, buf in buffers.items():
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        mod.register_buffer(leaf, buf, persistent=False)
    return model

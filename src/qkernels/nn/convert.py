"""Whole-model conversion: quantize_(model, scheme), save_quantized / load_quantized (safetensors +
a small JSON config).

quantize_ swaps every accepted nn.Linear for a QuantizedLinear in place, one layer at a time: the
float weight of a layer is released as soon as its quantized twin exists, so converting never holds
a second copy of the model. With `device=` a CPU model is converted onto the GPU layer by layer
(the full-precision model never goes to the GPU).
"""
from __future__ import annotations

import json
import re
import uuid
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .fused import QKV_NAMES, QuantizedMLP, RMSNorm, fuse_qkv, fuse_qkv_, fusable_quantized, is_rms_norm, qkv_groups
from ..schemes import PER_CHANNEL, SCHEME_NAMES, W8A8, Scheme, parse_scheme
from .linear import QuantizedLinear

CONFIG_NAME = "qkernels_config.json"
WEIGHTS_NAME = "model.safetensors"   # the weights of checkpoints whose config names none (older ones)
_OUR_WEIGHTS = re.compile(r"model-[0-9a-f]{12}\.safetensors")   # what save_quantized names its weights
_BUFFER_PREFIX = "__buffer__."   # non-persistent buffers (e.g. rotary inv_freq) saved under this prefix
FORMAT_VERSION = 1
METHODS = ("rtn", "gptq", "awq", "awq+gptq")


def _scheme_error(scheme: Scheme, device: torch.device) -> str | None:
    """Why `scheme` cannot run on `device` (None when it can)."""
    fp8 = scheme.fp8_act if scheme.weight_only else scheme.fp8
    if fp8 and device.type == "cuda":
        from .._runtime import capability, device_name
        cap = capability(device)
        if cap < (8, 9):
            return (f"scheme {scheme.name!r} needs FP8 tensor cores (compute capability >= 8.9), got "
                    f"{cap[0]}.{cap[1]} on {device_name(device)}: w4a16, w8a16 and w8a8 run there")
    return None


def _layer_problem(layer: nn.Linear, scheme: Scheme) -> str | None:
    """Why this layer's shape cannot take the scheme (it then stays in high precision)."""
    K = layer.in_features
    if scheme.weight_only and scheme.group_size != PER_CHANNEL and K % scheme.group_size:
        return f"in_features={K} is not divisible by group_size={scheme.group_size}"
    if scheme.weight_only and scheme.bits == 4 and K % 2:
        return f"in_features={K} is odd (4-bit codes are stored two per byte)"
    if scheme.weight_only and scheme.fp8_act and K % 64:
        return f"in_features={K} is not a multiple of 64 (w4a8-fp8's kernels take whole 64-k chunks)"
    if scheme == W8A8():
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


def quantize_(model: nn.Module, scheme: str | Scheme, *, group_size: int | None = None, symmetric: bool | None = None,
              filter_fn: Callable[[nn.Module, str], bool] | None = None, skip=("lm_head",),
              device=None, dtype: torch.dtype | None = None, calibration=None, smooth_alpha: float = 0.5,
              method: str = "rtn", act_order: bool = False, fuse: bool = True, progress: bool = True) -> nn.Module:
    """Quantize `model` in place: every nn.Linear named `name` for which `filter_fn(module, name)` is
    true (default: all) and whose name does not end in one of `skip` becomes a QuantizedLinear.

    scheme: a qkernels.schemes object or the string it parses from: "w8a8" (int8 weights per channel,
    dynamic per-token int8 activations), "w8a8-fp8", "w4a16" (group_size, default 128; asymmetric unless
    symmetric=True) or "w8a16" (per channel unless group_size is given; symmetric unless symmetric=False);
    group and symmetry may also be written into the string ("w4a16-g64-sym", "w4a16-g-1": per channel).
    Activations are fp16 / bf16: a float32 model needs `dtype` (float16 / bfloat16), to which the
    whole model is cast. Layers the scheme cannot take (e.g. in_features not
    divisible by group_size) stay in high precision and are listed in one warning.
    device: convert onto this device layer by layer (the rest of the model follows at the end).
    calibration: token ids [batch, seq] or an iterable of them. With the schemes that quantize activations (w8a8,
    w8a8-fp8, w4a8-fp8) the model is first smoothed SmoothQuant-style (qkernels.nn.smooth.smooth_, strength
    smooth_alpha), which moves activation outliers into the weights, except under AWQ (its own activation-aware
    scales take that place); with the weight-only schemes it also feeds `method`.
    method (weight-only schemes): "rtn" (round to nearest, min-max grid; no calibration), "gptq"
    (qkernels.nn.gptq: error-compensating rounding, decoder layer by decoder layer on the calibration
    inputs; act_order=True quantizes the most active input channels first) or "awq" (qkernels.nn.awq:
    activation-aware per-channel scales folded into the preceding norm / linear and a clipping search,
    then round to nearest) or "awq+gptq" (AWQ's scales, then GPTQ's rounding and range search). All need
    `calibration`; with `device` each decoder layer is calibrated there.
    fuse (default): Llama / Qwen-style RMSNorm modules become qkernels.nn.RMSNorm (one kernel), and each
    decoder layer's post-attention RMSNorm + SwiGLU MLP whose projections were all quantized becomes a
    qkernels.nn.QuantizedMLP: gate and up run as one GEMM (their codes concatenated), the w8a8 schemes'
    norm and SwiGLU kernels quantize the activations they produce, the weight-only schemes apply SwiGLU in
    the gate|up call (qkernels.nn.fused); and each self-attention module's q / k / v projections, all quantized
    alike, run as one GEMM (`<attn>.qkv_proj`; q_proj / k_proj / v_proj become its slices:
    qkernels.nn.fused.QKVPart).
    Returns the model.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    scheme = parse_scheme(scheme, group_size=group_size, symmetric=symmetric)
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"dtype must be float16 or bfloat16 (the activation dtype), got {dtype}")
    device = torch.device(device) if device is not None else None

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "rtn":
        if not scheme.weight_only:
            raise ValueError(f"method {method!r} applies to the weight-only schemes (w4a16, w8a16), got scheme "
                             f"{scheme.name!r}")
        if calibration is None:
            raise ValueError(f"method {method!r} needs calibration: token ids [batch, seq] or an iterable of them")
        from .calibrate import batches_of
        calibration = batches_of(calibration)       # checked before anything changes
    elif calibration is not None and scheme.weight_only and not scheme.fp8_act:
        raise ValueError(f"calibration feeds SmoothQuant (the schemes that quantize activations: w8a8, w8a8-fp8, "
                         f"w4a8-fp8) or method='gptq' / 'awq' (weight-only schemes); got scheme {scheme.name!r} "
                         f"with method 'rtn'")
    if act_order and "gptq" not in method:
        raise ValueError(f"act_order applies to method='gptq' / 'awq+gptq', got method {method!r}")
    # the schemes that quantize activations are smoothed first, but not under AWQ, whose activation-aware scales
    # take the smoothing's place (docs/design/w4a8.md: SmolLM2 W4A8 g64 perplexity RTN +29.0 -> +22.4%, GPTQ
    # act-order +14.6 -> +10.6%, AWQ + GPTQ act-order +9.6 -> +11.0% with smoothing)
    if calibration is not None and (not scheme.weight_only or scheme.fp8_act) and "awq" not in method:
        from .smooth import smooth_
        smooth_(model, calibration, smooth_alpha)

    targets, skipped = [], []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or isinstance(mod, QuantizedLinear):
            continue
        if _skipped(name, skip) or (filter_fn is not None and not filter_fn(mod, name)):
            continue
        why = _layer_problem(mod, scheme)
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
        sdt = dtype or model.get_submodule(targets[0]).weight.dtype
        sdt = sdt if sdt in (torch.float16, torch.bfloat16) else torch.float16
        if "awq" in method:
            from .awq import awq_
            # before GPTQ, whose per-group range search replaces AWQ's clipping (both would shrink the ranges)
            awq_(model, calibration, scheme.bits, scheme.group_size, scheme.symmetric,
                 wanted=lambda n, m: n in chosen, clip=method == "awq", device=device, scale_dtype=sdt,
                 progress=progress)
        if "gptq" in method:
            from .gptq import gptq_
            packed = gptq_(model, calibration, scheme.bits, scheme.group_size, scheme.symmetric,
                           wanted=lambda n, m: n in chosen, act_order=act_order, device=device, scale_dtype=sdt,
                           progress=progress)
    if fuse:
        for name in [n for n, m in model.named_modules() if is_rms_norm(m) and not isinstance(m, RMSNorm)]:
            _set_module(model, name, RMSNorm.from_module(model.get_submodule(name)))
    it = targets
    if progress:
        try:
            from tqdm.auto import tqdm
            it = tqdm(targets, desc=f"quantize_ {scheme.name}", unit="layer", leave=False)
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
            q = QuantizedLinear.from_packed(packed.pop(name).to(dev), src.bias, scheme.fp8_act)
        else:
            q = QuantizedLinear.from_linear(src, scheme)
        _set_module(model, name, q)
        del src, lin, w                      # the float weight goes now, not at the end
    if fuse:      # a block's post-attention norm + SwiGLU MLP with every projection quantized: one module
        for layer in [m for m in model.modules() if fusable_quantized(m)]:
            layer.mlp = QuantizedMLP.from_quantized(layer.post_attention_layernorm, layer.mlp)
            layer.post_attention_layernorm = nn.Identity()
        fuse_qkv_(model)
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)   # QuantizedLinear keeps its codes' and fp32 scales' dtypes
    if skipped:
        warnings.warn(f"quantize_({scheme.name!r}): {len(skipped)} linear layer(s) left in high precision: "
                      + "; ".join(skipped), stacklevel=2)
    return model


# ---------------------------------------------------------------------------------------------
# save / load


def _layer_entry(q: QuantizedLinear) -> dict:
    e = {"scheme": q.scheme.name, "in_features": q.in_features, "out_features": q.out_features,
         "bias": q.bias is not None}
    if q.scheme.weight_only:
        e.update(group_size=q.group_size, symmetric=q.zeros is None, act_order=q.perm is not None,
                 dtype=str(q.scales.dtype).replace("torch.", ""))
    else:
        e.update(dtype=str(q.bias.dtype).replace("torch.", "") if q.bias is not None else "float16")
    return e


def _layer_from_entry(e: dict) -> QuantizedLinear:
    """The empty (meta) QuantizedLinear a layer entry describes (_layer_entry's inverse)."""
    scheme = parse_scheme(e["scheme"])
    if scheme.weight_only:
        scheme = parse_scheme(scheme.name, group_size=e.get("group_size"), symmetric=e.get("symmetric", False))
    q = QuantizedLinear(e["in_features"], e["out_features"], e["bias"], scheme, device="meta",
                        dtype=getattr(torch, e["dtype"]))
    if scheme.weight_only and e.get("act_order"):
        q.perm = torch.empty(e["in_features"], dtype=torch.int64, device="meta")
    return q


def save_quantized(model: nn.Module, path, format: str = "qkernels") -> Path:
    """Write `path/model-<id>.safetensors` (every tensor of the model, quantized layers as their codes and
    scales; tied weights stored once) and `path/qkernels_config.json` (which layers are quantized and how, and
    which weights file is current). Atomic: the config is replaced last, in one step, so a crash at any point
    leaves the old checkpoint or the new one (qkernels._files). format="gptq": a GPTQ directory instead
    (config.json with quantization_config; weight-only layers of one configuration:
    qkernels.nn.checkpoints.save_gptq), which GPTQ loaders and load_pretrained read; format="compressed-tensors":
    llm-compressor's format (layers of one kind, weight-only or W8A8 / FP8: save_compressed_tensors), which vLLM,
    transformers and load_pretrained read. Returns the directory."""
    if format == "gptq":
        from .checkpoints import save_gptq
        return save_gptq(model, path)
    if format == "compressed-tensors":
        from .checkpoints import save_compressed_tensors
        return save_compressed_tensors(model, path)
    if format != "qkernels":
        raise ValueError(f"format must be 'qkernels', 'gptq' or 'compressed-tensors', got {format!r}")
    from safetensors.torch import save_file

    from .._files import file_digest, replace_atomically, write_text_atomically
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    old_weights = _referenced_weights(out)
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
    # the weights under a name of their own, then the config that names them (replacing the old one in one step:
    # the commit point), then the old weights: a crash anywhere leaves the old checkpoint or the new one
    weights = f"model-{uuid.uuid4().hex[:12]}.safetensors"
    replace_atomically(out / weights, lambda tmp: save_file(tensors, str(tmp)))
    digest = file_digest(out / weights)
    fused = {"mlps": {n: {"hidden": m.hidden_size, "intermediate": m.intermediate_size,
                          "eps": m.norm.variance_epsilon, "scheme": getattr(m.scheme, "spec", m.scheme.name),
                          "bias": m.down_proj.bias is not None}
                      for n, m in model.named_modules() if isinstance(m, QuantizedMLP)},
             "norms": {n: {"hidden": m.weight.shape[0], "eps": m.variance_epsilon}
                       for n, m in model.named_modules()
                       if isinstance(m, RMSNorm) and not isinstance(_parent(model, n), QuantizedMLP)},
             "qkv": {n: {"sizes": list(g.sizes)} for n, g in qkv_groups(model).items()}}
    cfg = {"format": "qkernels", "version": FORMAT_VERSION, "weights": weights, "weights_blake2b": digest,
           "layers": layers, "aliases": aliases, "fused": fused}
    hf_cfg = getattr(model, "config", None)
    if hf_cfg is not None and hasattr(hf_cfg, "to_dict"):
        cfg["model_config"] = hf_cfg.to_dict()
    write_text_atomically(out / CONFIG_NAME, json.dumps(cfg, indent=1, default=str))
    # the weights this save replaced, and any a save that died before its commit left behind (our own names only)
    for f in out.iterdir():
        if f.name != weights and (f.name == old_weights or _OUR_WEIGHTS.fullmatch(f.name)):
            f.unlink(missing_ok=True)
    return out


def _referenced_weights(out: Path) -> str | None:
    """The weights file an existing qkernels checkpoint in `out` names (None: there is none, or its config is
    unreadable; then nothing is deleted)."""
    try:
        cfg = json.loads((out / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return None
    w = cfg.get("weights", WEIGHTS_NAME) if isinstance(cfg, dict) and cfg.get("format") == "qkernels" else None
    return w if isinstance(w, str) and Path(w).name == w and w.endswith(".safetensors") else None


def _build_from_config(model_config):
    """A model with no storage (meta device) from a transformers config."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config)


_ENTRY_KEYS = {"scheme": str, "in_features": int, "out_features": int, "bias": bool, "dtype": str}
_ENTRY_DTYPES = ("float16", "bfloat16", "float32")


def _read_config(file: Path) -> dict:
    """qkernels_config.json, checked: JSON, the format and version, and every layer entry's keys and types."""
    try:
        cfg = json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}): the checkpoint is damaged; save it again") from None
    if not isinstance(cfg, dict) or cfg.get("format") != "qkernels":
        raise ValueError(f"{file} is not a qkernels config (format="
                         f"{cfg.get('format') if isinstance(cfg, dict) else type(cfg).__name__!r})")
    version = cfg.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(f"{file} has format version {version!r}; this qkernels reads versions 1 to {FORMAT_VERSION}")
    weights = cfg.get("weights", WEIGHTS_NAME)
    if not isinstance(weights, str) or Path(weights).name != weights or not weights.endswith(".safetensors"):
        raise ValueError(f"{file}: 'weights' must name a .safetensors file next to it, got {weights!r}")
    layers = cfg.get("layers")
    if not isinstance(layers, dict):
        raise ValueError(f"{file}: 'layers' must map layer names to entries, got {type(layers).__name__}")
    for name, e in layers.items():
        where = f"{file}, layer {name!r}"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: the entry must be an object, got {type(e).__name__}")
        for key, typ in _ENTRY_KEYS.items():
            if key not in e:
                raise ValueError(f"{where}: the entry has no {key!r}")
            if not isinstance(e[key], typ) or (typ is int and (isinstance(e[key], bool) or e[key] <= 0)):
                raise ValueError(f"{where}: {key!r} must be a{' positive' if typ is int else ''} {typ.__name__}, "
                                 f"got {e[key]!r}")
        if e["scheme"] not in SCHEME_NAMES:
            raise ValueError(f"{where}: scheme must be one of {SCHEME_NAMES}, got {e['scheme']!r}")
        if e["dtype"] not in _ENTRY_DTYPES:
            raise ValueError(f"{where}: dtype must be one of {_ENTRY_DTYPES}, got {e['dtype']!r}")
    return cfg


def _check_target(model: nn.Module, name: str, e: dict, file: Path) -> None:
    """A layer the entry replaces must have the shape the entry was saved from (a layer the model lacks is
    added, under a parent it has)."""
    parent, _, _ = name.rpartition(".")
    try:
        model.get_submodule(parent)
    except AttributeError:
        raise ValueError(f"{file}: layer {name!r} has no parent {parent!r} in the model the config builds") from None
    try:
        old = model.get_submodule(name)
    except AttributeError:
        return
    shape = (getattr(old, "out_features", None), getattr(old, "in_features", None))
    if shape != (e["out_features"], e["in_features"]):
        raise ValueError(f"{file}: layer {name!r} was saved as {e['out_features']}x{e['in_features']} "
                         f"(out x in), but the model's config makes it {shape[0]}x{shape[1]}: the checkpoint is "
                         f"for another configuration")


def _check_fused_target(model: nn.Module, name: str, e: dict, file: Path) -> None:
    """The MLP a fused entry replaces must have the sizes it was saved from (its gate projection's shape)."""
    try:
        model.get_submodule(f"{name}.gate_proj")
    except AttributeError:
        return                       # a model already fused, or without that MLP: the tensor checks decide
    _check_target(model, f"{name}.gate_proj", {"out_features": e["intermediate"], "in_features": e["hidden"]}, file)


def _check_qkv_target(model: nn.Module, name: str, e: dict, layer: dict | None, file: Path) -> None:
    """A fused q|k|v entry: its merged layer is in the file's layers, its sizes add up to that layer's rows, and
    the attention module it replaces has projections of those sizes."""
    sizes = e.get("sizes") if isinstance(e, dict) else None
    if (layer is None or not isinstance(sizes, list) or len(sizes) != len(QKV_NAMES)
            or not all(isinstance(n, int) and n > 0 for n in sizes) or sum(sizes) != layer.get("out_features")):
        raise ValueError(f"{file}: fused q|k|v entry {name!r} needs a layer of that name with out_features equal to "
                         f"the sum of {len(QKV_NAMES)} positive sizes, got sizes {sizes} and layer {layer}")
    attn = name.rpartition(".")[0]
    for proj, n in zip(QKV_NAMES, sizes):
        try:
            model.get_submodule(f"{attn}.{proj}")
        except AttributeError:
            raise ValueError(f"{file}: fused q|k|v entry {name!r}: the model has no {attn}.{proj}") from None
        _check_target(model, f"{attn}.{proj}", {"out_features": n, "in_features": layer["in_features"]}, file)


def _check_tensors(file: Path, state: dict, expected: dict, aliases: dict) -> None:
    """Every tensor the model needs is in the file, with its shape, and nothing else is."""
    have = set(state) | set(aliases)
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected))
    if missing or unexpected:
        raise ValueError(f"{file} does not match the model: missing {missing[:8]}, unexpected {unexpected[:8]}")
    for name, target in aliases.items():
        if target not in state:
            raise ValueError(f"{file}: alias {name!r} points at {target!r}, which the file does not hold")
    for name, want in expected.items():
        got = state[aliases.get(name, name)]
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"{file}: tensor {name!r} is {tuple(got.shape)}, the model needs {tuple(want.shape)}")


def _check_values(file: Path, state: dict, layers: dict) -> None:
    """Scales finite and positive, act-order permutations a permutation of range(in_features)."""
    for name, e in layers.items():
        if parse_scheme(e["scheme"]).weight_only:
            scales = state[f"{name}.scale_zero"][..., 0].float()
            what = "scale"
        else:
            scales = state[f"{name}.weight_scale"].float()
            what = "weight_scale"
        if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
            raise ValueError(f"{file}: layer {name!r} has a {what} that is not finite and positive "
                             f"(min {scales.min().item():.3g}, max {scales.max().item():.3g})")
        perm = state.get(f"{name}.perm")
        if perm is not None and not torch.equal(torch.sort(perm.long()).values,
                                                torch.arange(e["in_features"], device=perm.device)):
            raise ValueError(f"{file}: layer {name!r} has an act-order permutation that is not a permutation of "
                             f"range({e['in_features']})")


def load_quantized(model_or_config, path, *, device="cpu") -> nn.Module:
    """Restore what save_quantized wrote. `model_or_config`: the model (possibly built on the
    `meta` device: no full-precision copy is ever made) or a transformers config, from which a
    meta model is built. Everything is checked before the model is touched: the JSON config (format,
    version, every layer entry), each quantized layer against the layer it replaces (a checkpoint saved
    from another configuration is refused, naming the layer and both shapes), every tensor's name and
    shape, scales finite and positive, act-order permutations; a problem raises ValueError naming the
    file and what is wrong, and a model passed in is left as it was. Then the quantized layers are
    swapped in and every tensor is assigned from the safetensors file on `device` (no copy). Only
    safetensors and JSON are read. Returns the model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .._files import file_digest
    src = Path(path)
    if not (src / CONFIG_NAME).exists():
        raise FileNotFoundError(f"path must hold {CONFIG_NAME} and the weights it names (from save_quantized), "
                                f"got {src}")
    cfg = _read_config(src / CONFIG_NAME)
    weights = src / cfg.get("weights", WEIGHTS_NAME)
    model = model_or_config if isinstance(model_or_config, nn.Module) else _build_from_config(model_or_config)
    # stage every replacement (nothing is swapped in until all checks pass)
    staged: list[tuple[str, nn.Module]] = []
    fused = cfg.get("fused", {})
    for name, e in fused.get("mlps", {}).items():      # the MLP absorbs its layer's post-attention norm
        _check_fused_target(model, name, e, src / CONFIG_NAME)
        staged.append((name, QuantizedMLP(e["hidden"], e["intermediate"], e["eps"], e["scheme"], e["bias"],
                                          device="meta")))
        staged.append((f"{name.rpartition('.')[0]}.post_attention_layernorm", nn.Identity()))
    for name, e in fused.get("norms", {}).items():
        staged.append((name, RMSNorm(e["hidden"], e["eps"], device="meta")))
    in_mlp = {p for p, m in staged if isinstance(m, QuantizedMLP)}
    qkv = {f"{n}.qkv_proj": e for n, e in fused.get("qkv", {}).items()}
    for name, e in qkv.items():     # its projections: slices of qkv_proj (fuse_qkv, once all is checked)
        _check_qkv_target(model, name, e, cfg["layers"].get(name), src / CONFIG_NAME)
        staged += [(f"{name.rpartition('.')[0]}.{proj}", nn.Identity()) for proj in QKV_NAMES]
    for name, e in cfg["layers"].items():
        if not any(name.startswith(p + ".") for p in in_mlp):
            _check_target(model, name, e, src / CONFIG_NAME)
        try:
            q = _layer_from_entry(e)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{src / CONFIG_NAME}, layer {name!r}: {err}") from None
        mlp = next(((p, m) for p, m in staged if p in in_mlp and name.startswith(p + ".")), None)
        if mlp is None:
            staged.append((name, q))
        else:                      # a projection of a fused MLP: set inside the staged QuantizedMLP
            _set_module(mlp[1], name[len(mlp[0]) + 1:], q)
    replaced = [p for p, _ in staged]
    expected = {k: v for k, v in model.state_dict(keep_vars=True).items()
                if not any(k.startswith(p + ".") for p in replaced)}
    for p, mod in staged:
        expected.update({f"{p}.{k}": v for k, v in mod.state_dict(keep_vars=True).items()})
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}, named by {src / CONFIG_NAME}, is missing: the checkpoint is incomplete")
    digest = cfg.get("weights_blake2b")
    if digest is not None and file_digest(weights) != digest:
        raise ValueError(f"{weights} does not match the checksum {src / CONFIG_NAME} records for it: the file is "
                         f"damaged or was replaced; save the checkpoint again")
    try:
        state = load_file(str(weights), device=str(device))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{weights} is not a readable safetensors file ({err}): the checkpoint is damaged") from None
    buffers = {k[len(_BUFFER_PREFIX):]: state.pop(k) for k in list(state) if k.startswith(_BUFFER_PREFIX)}
    aliases = cfg.get("aliases", {})
    _check_tensors(weights, state, expected, aliases)
    _check_values(weights, state, {n: e for n, e in cfg["layers"].items()})
    # all checks passed: swap in, assign
    for p, mod in staged:
        _set_module(model, p, mod)
    for name, e in qkv.items():      # q_proj / k_proj / v_proj become the slices of the loaded qkv_proj
        attn = name.rpartition(".")[0]
        fuse_qkv(model.get_submodule(attn), model.get_submodule(name), e["sizes"])
    for name, target in aliases.items():
        state[name] = state[target]
    model.load_state_dict(state, strict=True, assign=True)
    for name, buf in buffers.items():
        owner, _, leaf = name.rpartition(".")
        mod = model.get_submodule(owner) if owner else model
        mod.register_buffer(leaf, buf, persistent=False)
    return model

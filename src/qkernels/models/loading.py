"""from_pretrained: a Transformer from a Hugging Face directory, an already-loaded HF model, or a
save_quantized checkpoint, with projections merged (q|k|v, gate|up) and, with a scheme, quantized.

Loading is a loading concern, not a model concern: the decoder in llama.py only sees one merged linear
per role. Tensor parallel (parallel.py): each linear is cut to the rank's Part as it is read (float and
GPTQ / AWQ / compressed-tensors weights read shard-only from safetensors; layers in memory cut on their codes),
before merging.
Weights go to the target device one decoder layer at a time (a float layer is merged, then
quantized, then released), so no second copy of the model is ever held. Everything is read and checked
into a fresh model that is returned only when complete: an error leaves nothing half-loaded.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn

from ..nn.checkpoints import SafetensorsDir
from ..nn.linear import QuantizedLinear, same_act_order
from ..schemes import Scheme, parse_scheme
from .config import ModelArgs
from .llama import Transformer
from .parallel import Part, from_group, shard_linear
from .vision import VisionArgs, VisionTower

_FLOAT = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------
# sources: where a layer's modules / tensors come from


class Source:
    """Where from_pretrained reads a model from: its config.json dict, and tensors and linears by their Hugging
    Face names, each optionally cut to a Part (tensor parallel). A directory and a loaded model are the two
    sources from_pretrained builds itself; another (e.g. random weights for a benchmark) may be passed in."""
    config: dict
    quant = None                # a quantized directory's quantization_config (nn.checkpoints.CheckpointQuant)

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def tensor(self, name: str, part: Part | None = None) -> torch.Tensor:
        raise NotImplementedError

    def linear(self, name: str, bias: bool, dtype: torch.dtype, part: Part | None = None) -> nn.Module:
        raise NotImplementedError

    def mlp(self, prefix: str):
        """A fused qkernels.nn.QuantizedMLP at prefix + "mlp", or None."""
        return None

    def act_order(self, name: str) -> torch.Tensor | None:
        """Linear `name`'s act-order permutation (its input channels sorted by group), or None."""
        return None


class _DirSource(SafetensorsDir, Source):
    """A Hugging Face model directory (float, or with GPTQ / AWQ / compressed-tensors layers)."""

    def act_order(self, name: str) -> torch.Tensor | None:
        if not (self.is_quantized(name) and self.g_idx(name)):
            return None
        g = self.tensor(self.g_idx(name)).long()
        if torch.equal(g, torch.sort(g).values):
            return None
        return torch.sort(g, stable=True).indices            # as PackedWeight.from_int orders them

    def linear(self, name: str, bias: bool, dtype: torch.dtype, part: Part | None = None) -> nn.Module:
        if self.is_quantized(name):
            sdt = dtype if dtype in (torch.float16, torch.bfloat16) else None
            q = self.quantized_linear(name, dtype=sdt, part=part) if part else None   # the part's slices only
            if q is None:
                q = self.quantized_linear(name, dtype=sdt)
                q = shard_linear(q, part, name) if part else q
            return q
        w = self.tensor(name + ".weight", part)
        b = self.tensor(name + ".bias") if bias else None
        b = part.bias(b) if part else b
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        lin.weight = nn.Parameter(w, requires_grad=False)
        if b is not None:
            lin.bias = nn.Parameter(b, requires_grad=False)
        return lin


class _ModuleSource(Source):
    """An already-built Hugging Face model (float, or converted by quantize_ / load_quantized)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config.to_dict()
        self._names = dict(model.named_parameters(remove_duplicate=False))
        self._names.update(dict(model.named_buffers(remove_duplicate=False)))

    def has(self, name: str) -> bool:
        return name in self._names or self._module(name) is not None

    def _module(self, name: str):
        try:
            return self.model.get_submodule(name)
        except AttributeError:
            return None

    def tensor(self, name: str, part: Part | None = None) -> torch.Tensor:
        t = self._names.get(name)
        if t is None:
            raise ValueError(f"the model has no tensor {name!r}")
        return part.take(t.detach()) if part else t.detach()

    def linear(self, name: str, bias: bool, dtype: torch.dtype, part: Part | None = None) -> nn.Module:
        from ..nn.fused import QKVPart
        mod = self._module(name)
        if mod is None:
            raise ValueError(f"the model has no module {name!r}")
        if isinstance(mod, QKVPart):         # fused q|k|v (quantize_'s fuse): its rows of qkv_proj
            mod = mod.layer()
        return shard_linear(mod, part, name) if part else mod

    def act_order(self, name: str) -> torch.Tensor | None:
        mod = self._module(name)
        return mod.perm if isinstance(mod, QuantizedLinear) and mod.scheme.weight_only else None

    def mlp(self, prefix: str):
        """A fused QuantizedMLP (quantize_ with fuse=True), or None."""
        from ..nn.fused import QuantizedMLP
        mod = self._module(prefix + "mlp")
        return mod if isinstance(mod, QuantizedMLP) else None


# ---------------------------------------------------------------------------------------------
# merging and quantizing linears


def _float_linear(w: torch.Tensor, b: torch.Tensor | None, device, dtype) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    lin.weight = nn.Parameter(w.to(device, dtype), requires_grad=False)
    if b is not None:
        lin.bias = nn.Parameter(b.to(device, dtype), requires_grad=False)
    return lin


def merge_linears(mods: list[nn.Module], device, dtype) -> nn.Module:
    """One linear computing the outputs of `mods` side by side (they share the input). Float linears
    concatenate their weights, QuantizedLinears their codes and scales (QuantizedLinear.concat); act-order
    layers whose permutations differ (each orders K its own way) stay side by side (Concat)."""
    if all(type(m) is nn.Linear for m in mods):
        w = torch.cat([m.weight.detach().to(device, dtype) for m in mods])
        has_b = any(m.bias is not None for m in mods)
        b = torch.cat([(m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)).to(device, dtype)
                       for m in mods]) if has_b else None
        return _float_linear(w, b, device, dtype)
    if not all(isinstance(m, QuantizedLinear) for m in mods):
        kinds = sorted({type(m).__name__ for m in mods})
        raise ValueError(f"cannot merge a mix of float and quantized projections ({kinds}): quantize every "
                         f"projection of a block with the same scheme")
    if mods[0].scheme.weight_only and not same_act_order(mods):
        return Concat([m.to(device) for m in mods])
    return QuantizedLinear.concat(mods, device)


class Concat(nn.Module):
    """Outputs of several linears side by side: the fallback for projections that cannot share one GEMM."""

    def __init__(self, linears):
        super().__init__()
        self.linears = nn.ModuleList(linears)
        self.scheme = getattr(linears[0], "scheme", None)

    def forward(self, x):
        return torch.cat([m(x) for m in self.linears], dim=-1)


def _quantize(lin: nn.Module, name: str, scheme: Scheme | None, skipped: list) -> nn.Module:
    """lin quantized to `scheme` (None: as it is). A checkpoint's own 4-bit weight-only layer under "w4a8-fp8"
    keeps its codes and scales and takes FP8 activations; one that cannot stays as loaded (listed in `skipped`)."""
    if isinstance(lin, QuantizedLinear | Concat):
        return _fp8_act(lin, name, scheme, skipped)
    if scheme is None or not isinstance(lin, nn.Linear) or isinstance(lin, QuantizedLinear):
        return lin
    from ..nn.convert import _layer_problem
    why = _layer_problem(lin, scheme)
    if why:
        skipped.append(f"{name} ({why})")
        return lin
    return QuantizedLinear.from_linear(lin, scheme)


def _fp8_act(mod: nn.Module, name: str, scheme: Scheme | None, skipped: list) -> nn.Module:
    """Under "w4a8-fp8", a checkpoint's own 4-bit weight-only layer (or each of a Concat's) takes FP8 activations,
    codes and scales as loaded; one that cannot stays as it is, listed in `skipped`. Other schemes: mod as it is."""
    if scheme is None or not scheme.weight_only or not scheme.fp8_act:
        return mod
    for lin in mod.linears if isinstance(mod, Concat) else [mod]:
        why = None if lin.scheme.weight_only and lin.scheme.fp8_act else lin.to_fp8_act()
        if why:
            skipped.append(f"{name} ({why}: kept as {lin.scheme.name})")
    if isinstance(mod, Concat):
        mod.scheme = mod.linears[0].scheme
    return mod


# ---------------------------------------------------------------------------------------------
# the vision tower of a vision-language model

VISION_PREFIX = {"qwen3_vl": "model.visual."}


def load_vision(src: Source, device, dtype, scheme: Scheme | None, skipped: list, quantize: bool = True
                ) -> VisionTower:
    """Qwen3-VL's vision encoder from `src` (tensors under VISION_PREFIX): the blocks' linears quantized with
    `scheme` where `quantize` (those it cannot take stay float and are listed in `skipped`; a checkpoint's own
    quantized layers load as they are either way), the rest in `dtype`."""
    args = VisionArgs.from_hf(src.config)
    pre = VISION_PREFIX[src.config["model_type"]]
    tower = VisionTower(args)
    get = lambda n: src.tensor(pre + n).to(device, dtype)  # noqa: E731
    norm = lambda n: (get(n + ".weight"), get(n + ".bias"))  # noqa: E731

    def linear(n: str, quantized: bool) -> nn.Module:
        lin = _to(src.linear(pre + n, True, dtype), device, dtype)
        return _quantize(lin, pre + n, scheme, skipped) if quantized else lin

    conv = get("patch_embed.proj.weight")
    if tuple(conv.shape[1:]) != (args.in_channels, args.temporal_patch_size, args.patch_size, args.patch_size):
        raise ValueError(f"{pre}patch_embed.proj.weight must be [dim, C, T, P, P] as vision_config says, got "
                         f"{tuple(conv.shape)}")
    tower.patch_embed = _float_linear(conv.reshape(conv.shape[0], -1), get("patch_embed.proj.bias"), device, dtype)
    tower.pos_embed = nn.Parameter(get("pos_embed.weight"), requires_grad=False)
    for i, blk in enumerate(tower.blocks):
        b = f"blocks.{i}."
        blk.norm1, blk.norm2 = norm(b + "norm1"), norm(b + "norm2")
        blk.qkv, blk.proj = linear(b + "attn.qkv", quantize), linear(b + "attn.proj", quantize)
        blk.fc1, blk.fc2 = linear(b + "mlp.linear_fc1", quantize), linear(b + "mlp.linear_fc2", quantize)
    mergers = [("merger.", tower.merger)] + [(f"deepstack_merger_list.{j}.", mg)
                                             for j, mg in enumerate(tower.deepstack_mergers)]
    for n, mg in mergers:
        mg.norm = norm(n + "norm")
        mg.fc1, mg.fc2 = linear(n + "linear_fc1", False), linear(n + "linear_fc2", False)
    return tower.to(device)


# ---------------------------------------------------------------------------------------------
# from_pretrained


def _source(src) -> Source:
    if isinstance(src, Source):
        return src
    if isinstance(src, nn.Module):
        if not hasattr(src, "config"):
            raise TypeError(f"a model source must be a Hugging Face model (with .config), got {type(src).__name__}")
        return _ModuleSource(src)
    if not isinstance(src, (str, Path)):
        raise TypeError(f"path_or_hf_model must be a directory path or a Hugging Face model, got {type(src).__name__}")
    path = Path(src)
    from ..nn.convert import CONFIG_NAME, load_quantized
    if (path / CONFIG_NAME).exists():              # a save_quantized checkpoint: rebuilt as the HF model first
        cfg = json.loads((path / CONFIG_NAME).read_text())
        if "model_config" not in cfg:
            raise ValueError(f"{path / CONFIG_NAME} has no model_config (saved from a model without a "
                             f"transformers config): load it with qkernels.load_quantized")
        from transformers import AutoConfig
        mc = dict(cfg["model_config"])
        hf_cfg = AutoConfig.for_model(mc.pop("model_type"), **mc)
        return _ModuleSource(load_quantized(hf_cfg, path))
    return _DirSource(path)


def from_pretrained(path_or_hf_model, scheme: str | Scheme | None = None, *, device=None,
                    dtype: torch.dtype | None = None, quantize_lm_head: bool = False, progress: bool = False,
                    tp_group=None, quantize_vision: bool | None = None, **quantize_kwargs) -> Transformer:
    """Build the decoder from a Hugging Face model directory (config.json + safetensors; transformers not
    needed), an already-loaded Hugging Face model, or a save_quantized checkpoint directory.

    scheme: None (keep the checkpoint's float weights, or its quantized layers) or a qkernels.schemes object
    or string ("w4a16", "w8a16", "w8a8", "w8a8-fp8", "w4a16-g64-sym", ...); quantize_kwargs (group_size,
    symmetric) as for quantize_. lm_head stays in float unless
    quantize_lm_head. quantize_vision (vision-language models): whether the scheme also quantizes the vision
    tower's block linears; by default the W8A8 schemes do and the weight-only ones do not: the tower runs at an
    image's patch count (784 for 448x448), where fp16 cuBLAS measured faster than the weight-only kernels (H200,
    Qwen3-VL-2B: vision 16.4 ms in fp16 against 23.5 in W4A16), and AWQ / GPTQ checkpoints of these models leave
    it in float too. device: default CUDA when there is one; dtype: default the checkpoint's torch_dtype
    (float16 / bfloat16; float32 is accepted for checking small models on the CPU).

    Tensor parallel: when torch.distributed is initialized with more than one rank, the model is split over
    the default process group, or over tp_group (every rank calls from_pretrained with the same arguments;
    device: each rank's own, default the current CUDA device). Every rank then returns the full logits and
    generates the same tokens (models.parallel)."""
    unknown = set(quantize_kwargs) - {"group_size", "symmetric"}
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)} (quantize options: group_size, symmetric)")
    if scheme is not None:
        scheme = parse_scheme(scheme, **quantize_kwargs)
    elif any(v is not None for v in quantize_kwargs.values()):
        raise ValueError(f"{sorted(quantize_kwargs)} apply with a scheme, got scheme=None")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if scheme is not None:
        from ..nn.convert import _scheme_error
        err = _scheme_error(scheme, device)
        if err:
            raise RuntimeError(err)
    tp = from_group(tp_group)
    src = _source(path_or_hf_model)
    args = ModelArgs.from_hf(src.config)
    if dtype is None:
        dtype = getattr(torch, str(src.config.get("torch_dtype") or src.config.get("dtype") or "float16")
                        .replace("torch.", ""), torch.float16)
        dtype = dtype if dtype in _FLOAT else torch.float16
    if dtype not in _FLOAT:
        raise TypeError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    quant = getattr(src, "quant", None)
    if (scheme is not None or quant is not None) and dtype == torch.float32:
        what = f"scheme {scheme.name!r}" if scheme is not None else f"the checkpoint's {quant.label} layers"
        raise TypeError(f"{what} take(s) float16 / bfloat16 activations: pass dtype=torch.float16 or torch.bfloat16")

    if tp is not None:
        groups = [(scheme.group_size, f" (scheme {scheme.name!r})")] if scheme is not None and scheme.weight_only \
            else []
        if quant is not None:
            groups.append((quant.group_size, f" (the checkpoint's {quant.label} groups)"))
        tp.check(args)
        for g, what in groups:
            tp.check(args, g, what)
    # each rank's part of every weight (None: the whole weight)
    qkv_parts = tp.qkv_parts(args) if tp else (None,) * 3
    o_part = tp.o_part(args) if tp else None
    up_part, down_part = tp.mlp_parts(args) if tp else (None, None)
    vocab_part = tp.vocab_part(args.vocab_size) if tp else None

    model = Transformer(args, tp)
    skipped: list[str] = []
    get = lambda n, part=None: src.tensor(n, part).to(device, dtype)  # noqa: E731
    param = lambda t: nn.Parameter(t, requires_grad=False)  # noqa: E731
    pre = args.prefix
    model.tok_embeddings.weight = param(get(pre + "embed_tokens.weight", vocab_part))
    layers = range(args.n_layers)
    if progress:
        try:
            from tqdm.auto import tqdm
            layers = tqdm(layers, desc="loading", unit="layer", leave=False)
        except ImportError:
            pass
    for i in layers:
        p = f"{pre}layers.{i}."
        blk = model.layers[i]
        att = blk.attention
        qkv = [src.linear(p + f"self_attn.{n}_proj", args.qkv_bias, dtype, part) for n, part in zip("qkv", qkv_parts)]
        att.wqkv = _quantize(merge_linears(qkv, device, dtype), p + "self_attn.qkv", scheme, skipped)
        att.wo = _quantize(_to(src.linear(p + "self_attn.o_proj", args.o_bias, dtype, o_part), device, dtype),
                           p + "self_attn.o_proj", scheme, skipped)
        if args.qk_norm:
            att.q_norm = param(get(p + "self_attn.q_norm.weight"))
            att.k_norm = param(get(p + "self_attn.k_norm.weight"))
        blk.attention_norm = param(get(p + "input_layernorm.weight"))
        fused = src.mlp(p)
        if fused is not None:
            gate_up, down = fused.gate_up_proj, fused.down_proj
            if tp:
                gate_up = shard_linear(gate_up, tp.gate_up_part(args), p + "mlp.gate_up_proj")
                down = shard_linear(down, down_part, p + "mlp.down_proj")
            blk.feed_forward.w_gate_up = _fp8_act(gate_up.to(device), p + "mlp.gate_up_proj", scheme, skipped)
            blk.feed_forward.w_down = _fp8_act(down.to(device), p + "mlp.down_proj", scheme, skipped)
            blk.ffn_norm = param(fused.norm.weight.detach().to(device, dtype))
        else:
            order = src.act_order(p + "mlp.down_proj") if tp else None
            # an act-order down projection: each rank takes whole groups of it, gate / up rows to match
            rows, cols = tp.mlp_parts(args, order) if order is not None else (up_part, down_part)
            gu = [src.linear(p + f"mlp.{n}_proj", False, dtype, rows) for n in ("gate", "up")]
            blk.feed_forward.w_gate_up = _quantize(merge_linears(gu, device, dtype), p + "mlp.gate_up", scheme,
                                                   skipped)
            blk.feed_forward.w_down = _quantize(_to(src.linear(p + "mlp.down_proj", False, dtype, cols), device,
                                                    dtype), p + "mlp.down_proj", scheme, skipped)
            blk.ffn_norm = param(get(p + "post_attention_layernorm.weight"))
    model.norm = param(get(pre + "norm.weight"))
    if src.has("lm_head.weight") and not args.tie_word_embeddings:
        head = _to(src.linear("lm_head", False, dtype, vocab_part), device, dtype)
    else:
        head = _float_linear(model.tok_embeddings.weight, None, device, dtype)
        head.weight = model.tok_embeddings.weight                      # tied: one tensor
    model.output = _quantize(head, "lm_head", scheme if quantize_lm_head else None, skipped)
    if src.config.get("model_type") in VISION_PREFIX and src.config.get("vision_config"):
        if quantize_vision is None:
            quantize_vision = scheme is None or not scheme.weight_only
        model.visual = load_vision(src, device, dtype, scheme, skipped,      # tensor parallel: whole on every rank
                                   quantize_vision)
    if skipped:
        warnings.warn(f"from_pretrained({scheme.name!r}): {len(skipped)} linear layer(s) not taking the scheme (left "
                      f"in high precision, or as the checkpoint stores them): " + "; ".join(skipped), stacklevel=2)
    leftover = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if leftover:
        raise RuntimeError(f"internal error: tensors not loaded: {leftover[:8]}")
    if tp is not None:
        tp.connect(model.device)
    return model.eval()


def _to(lin: nn.Module, device, dtype) -> nn.Module:
    """A float linear on device in dtype (a new module: the source model is left as it was); a quantized
    one moved to device (codes and scales keep their dtypes)."""
    if type(lin) is nn.Linear:
        return _float_linear(lin.weight.detach(), lin.bias.detach() if lin.bias is not None else None, device, dtype)
    return lin.to(device)

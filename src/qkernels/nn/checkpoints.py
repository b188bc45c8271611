"""Hugging Face checkpoint directories: reading the safetensors of one (sharded or not), the GPTQ and AWQ
quantized layers people ship, `load_pretrained` (such a directory into a transformers model whose
quantized linears are QuantizedLinear modules) and `save_gptq` (the other way).

Formats read, named by config.json's `quantization_config`:
  quant_method "gptq" (AutoGPTQ, GPTQModel, optimum): bits 4 / 8, group_size (-1: per channel), sym,
      desc_act; per linear `qweight` int32 [K * bits / 32, N] (codes packed along K, the first in the low
      bits), `qzeros` int32 [K / G, N * bits / 32] (packed along N), `scales` [K / G, N], `g_idx` int32 [K]
      (the group of each input channel; act-order). checkpoint_format "gptq" (the default) stores each zero
      point minus one, "gptq_v2" as is.
  quant_method "awq" (AutoAWQ, version "gemm"): 4-bit, zero points; `qweight` int32 [K, N / 8] and `qzeros`
      int32 [K / G, N / 8] packed along N in AWQ's interleaved nibble order, `scales` [K / G, N].
  quant_method "compressed-tensors" (llm-compressor, vLLM's format), format "pack-quantized": integer weights of
      4 / 8 bits, groups or per channel, symmetric or with zero points, no activation quantization (W4A16 / W8A16);
      per linear `weight_packed` int32 [N, K * bits / 32] packed along K, `weight_scale` [N, K / G],
      `weight_zero_point` int32 [N * bits / 32, K / G] packed along N (asymmetric), `weight_shape` [2],
      `weight_g_idx` [K] (older checkpoints' activation order "group"); formats "int-quantized" / "float-quantized":
      8-bit weights (`weight` int8 / float8_e4m3fn [N, K], `weight_scale` per channel or tensor) with activations
      quantized per token at run time (W8A8 int8 / FP8-dynamic), as QuantizedLinear's w8a8 / w8a8-fp8 layers.
Each becomes a PackedWeight (PackedWeight.from_gptq / from_awq / from_compressed_tensors) without a float copy of
the weight.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._files import file_digest, replace_atomically, write_text_atomically
from ..packed_weight import PackedWeight
from ..schemes import PER_CHANNEL, check_group_size
from .linear import QuantizedLinear

DIGEST_KEY = "qkernels_weights_blake2b"    # config.json key: {weights file: BLAKE2b} (save_gptq writes it)


class SafetensorsDir:
    """A Hugging Face model directory: config.json (parsed into .config) and model.safetensors, or shards
    named by model.safetensors.index.json. Tensors are read one at a time, on request."""

    def __init__(self, path):
        from safetensors import safe_open
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"path must be a model directory, got {path} (not a directory)")
        cfg_file = path / "config.json"
        if not cfg_file.exists():
            raise FileNotFoundError(f"{path} has no config.json (a Hugging Face model directory needs one)")
        try:
            self.config = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_file} is not valid JSON: {e}") from None
        index = path / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            absent = [f for f in files if not (path / f).exists()]
            if absent:
                raise FileNotFoundError(f"{index} names shard(s) missing from {path}: {absent}")
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise FileNotFoundError(f"{path} has no *.safetensors weights (.bin / .pth checkpoints are not read: "
                                    f"they would need unpickling)")
        digests = self.config.get(DIGEST_KEY)
        if digests is not None:          # written by save_gptq: the weights must be the ones config.json records
            if not isinstance(digests, dict) or set(digests) != set(files):
                said = sorted(digests) if isinstance(digests, dict) else digests
                raise ValueError(f"{cfg_file} records weights {said} but {path} holds {files}: a save was "
                                 f"interrupted; save the checkpoint again")
            for f, d in digests.items():
                if file_digest(path / f) != d:
                    raise ValueError(f"{path / f} does not match the checksum {cfg_file} records for it: a save was "
                                     f"interrupted or the file is damaged; save the checkpoint again")
        self.path = path
        self._files = {f: safe_open(str(path / f), framework="pt", device="cpu") for f in files}
        self._where = weight_map or {k: f for f, h in self._files.items() for k in h.keys()}
        self.quant = quant_spec(self.config, str(cfg_file))

    def has(self, name: str) -> bool:
        return name in self._where

    def keys(self):
        return self._where.keys()

    def tensor(self, name: str, part=None) -> torch.Tensor:
        """Tensor `name`; with part (an object whose take(t) indexes t, as models.parallel.Part), only that
        slice of it is read from the file."""
        f = self._where.get(name)
        if f is None:
            raise ValueError(f"{self.path}: tensor {name!r} is missing from the checkpoint")
        if part is not None:
            return part.take(self._files[f].get_slice(name))
        return self._files[f].get_tensor(name)

    def shape(self, name: str) -> list[int]:
        """Tensor `name`'s shape, from the file's header (nothing read)."""
        return self._files[self._where[name]].get_slice(name).get_shape()

    def is_quantized(self, name: str) -> bool:
        """Whether linear `name` is stored as quantized codes (GPTQ / AWQ / compressed-tensors)."""
        return self.quant is not None and self.has(f"{name}.{self.quant.marker}")

    def g_idx(self, name: str) -> str | None:
        """The name of quantized linear `name`'s act-order tensor (the group of each input channel), if stored."""
        t = f"{name}.{'weight_g_idx' if self.quant.method == COMPRESSED else 'g_idx'}"
        return t if self.has(t) else None

    def quantized_linear(self, name: str, shape: tuple[int, int] | None = None, device=None,
                         dtype: torch.dtype | None = None, part=None) -> QuantizedLinear | None:
        """Linear `name` from its quantized tensors; shape (N, K), when given, is checked. dtype: the scales'
        dtype (default: the checkpoint's, float32 scales as float16). part (models.parallel.Part: rows or columns
        of the [N, K] weight): only that part is read, as its slices of the stored tensors; None is returned
        where the part does not fall on the stored packing (words, groups, act-order), for the caller to cut
        the whole layer instead."""
        q = self.quant
        slices = _stored_parts(self, name, q, part) if part is not None else {}
        if slices is None:
            return None
        if q.scheme is not None:
            return self._w8a8_linear(name, q.scheme, slices, shape, device, dtype, part)
        t = lambda s: self.tensor(f"{name}.{s}", slices.get(s))  # noqa: E731
        gi = self.g_idx(name)
        try:
            if q.method == "gptq":
                g_idx = t("g_idx") if gi and "g_idx" not in slices else None
                pw = PackedWeight.from_gptq(t("qweight"), t("qzeros"), t("scales"), g_idx, bits=q.bits,
                                            group_size=None if q.group_size == PER_CHANNEL else q.group_size,
                                            checkpoint_format=q.checkpoint_format)
            elif q.method == COMPRESSED:
                packed = t("weight_packed")
                full = [int(v) for v in self.tensor(name + ".weight_shape").tolist()]
                # a part keeps the stored shape along the uncut dimension; along the cut one it is what was read
                if part is not None and part.dim == 0:
                    full[0] = packed.shape[0]
                elif part is not None:
                    full[1] = packed.shape[1] * (32 // q.bits)
                zp = t("weight_zero_point") if self.has(name + ".weight_zero_point") else None
                g_idx = t("weight_g_idx") if gi and "weight_g_idx" not in slices else None
                pw = PackedWeight.from_compressed_tensors(packed, t("weight_scale"), zp, g_idx, bits=q.bits,
                                                          shape=tuple(full))
            else:
                pw = PackedWeight.from_awq(t("qweight"), t("qzeros"), t("scales"),
                                           group_size=None if q.group_size == PER_CHANNEL else q.group_size)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{self.path}: the {q.label} tensors of {name!r} do not fit the format: {e}") from None
        if not bool(torch.isfinite(pw.scale_zero).all()):
            raise ValueError(f"{self.path}: the scales of {name!r} are not all finite: the checkpoint is damaged")
        if q.group_size != PER_CHANNEL and pw.group_len != q.group_size:
            raise ValueError(f"{self.path}: {name!r} has groups of {pw.group_len} input channels, quantization_config "
                             f"says group_size={q.group_size}")
        if shape is not None and tuple(pw.shape) != tuple(shape):
            raise ValueError(f"{self.path}: {name!r} holds a [{pw.shape[0]}, {pw.shape[1]}] (out, in) weight, the "
                             f"model config expects [{shape[0]}, {shape[1]}]")
        bias = self.tensor(name + ".bias") if self.has(name + ".bias") else None
        if part is not None:
            bias = part.bias(bias)
        sdt = dtype or (pw.scales.dtype if pw.scales.dtype in (torch.float16, torch.bfloat16) else torch.float16)
        if pw.scale_zero.dtype != sdt:
            pw = PackedWeight(pw.qweight, pw.scale_zero.to(sdt), pw.bits, pw.group_size, pw.shape, pw.perm,
                              pw.symmetric, pw.int_zeros)
        if device is not None:
            pw = pw.to(device)
        return QuantizedLinear.from_packed(pw, bias.to(pw.device, sdt) if bias is not None else None)

    def _w8a8_linear(self, name: str, scheme: str, slices: dict, shape, device, dtype, part) -> QuantizedLinear:
        """A compressed-tensors W8A8 linear: `weight` int8 / float8_e4m3fn [N, K], `weight_scale` [N, 1] or one
        value; activations quantized per token at run time, as the scheme's QuantizedLinear does."""
        w = self.tensor(name + ".weight", slices.get("weight"))
        s = self.tensor(name + ".weight_scale", slices.get("weight_scale"))
        want = torch.float8_e4m3fn if scheme == "w8a8-fp8" else torch.int8
        if w.dtype != want or w.dim() != 2:
            raise ValueError(f"{self.path}: {name!r}.weight must be a 2-D {want} tensor in this {scheme} checkpoint, "
                             f"got {w.dtype} {tuple(w.shape)}")
        N, K = w.shape
        if s.numel() == 1:
            s = s.reshape(1).expand(N)
        elif s.numel() != N:
            raise ValueError(f"{self.path}: {name!r}.weight_scale must hold one scale per output channel ({N}) or "
                             f"one in all, got shape {tuple(s.shape)}")
        s = s.reshape(N).float()
        if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
            raise ValueError(f"{self.path}: the scales of {name!r} are not all finite and positive: the checkpoint "
                             f"is damaged")
        if shape is not None and (N, K) != tuple(shape):
            raise ValueError(f"{self.path}: {name!r} holds a [{N}, {K}] (out, in) weight, the model config expects "
                             f"[{shape[0]}, {shape[1]}]")
        bias = self.tensor(name + ".bias") if self.has(name + ".bias") else None
        if part is not None:
            bias = part.bias(bias)
        adt = dtype or torch.float16
        mod = QuantizedLinear(K, N, bias is not None, scheme, device, adt)
        mod.weight.copy_(w.to(mod.weight.device))
        mod.weight_scale.copy_(s.to(mod.weight_scale.device))
        if bias is not None:
            mod.bias.copy_(bias.to(mod.bias.device, adt))
        return mod


def _stored_parts(src: SafetensorsDir, name: str, q, part) -> dict | None:
    """The slices of a quantized layer's tensors that hold `part` of its [N, K] weight: {tensor: a Part of it},
    or None where the part does not fall on the packing (a word of packed codes, a group, act-order columns).
    GPTQ: qweight [K / p, N] (p codes per word along K), qzeros [G, N / p], scales [G, N], g_idx [K];
    AWQ: qweight [K, N / 8], qzeros [G, N / 8], scales [G, N]."""
    from dataclasses import replace
    p = 32 // q.bits

    def cut(k: int, dim: int):                      # the part's spans in units of k, along the tensor's dim
        if any(a % k or b % k for a, b in part.spans):
            raise _OffPacking
        return replace(part, dim=dim, spans=tuple((a // k, b // k) for a, b in part.spans))

    if q.scheme is not None:                        # W8A8: weight [N, K], weight_scale [N, 1] or one value
        per_row = math.prod(src.shape(name + ".weight_scale")) > 1
        return {"weight": part, **({"weight_scale": part} if part.dim == 0 and per_row else {})}
    if q.method == COMPRESSED:                      # weight_packed [N, K / p], weight_scale [N, ng], zp [N / p, ng]
        shape = src.shape(name + ".weight_scale")
        per_tensor = all(d == 1 for d in shape)     # strategy "tensor": one scale for the whole weight
        ng = 1 if per_tensor else shape[-1]
        zp = src.has(name + ".weight_zero_point")
        try:
            if part.dim == 0:
                out = {"weight_packed": part}
                if not per_tensor:
                    out["weight_scale"] = part
                if zp:
                    out["weight_zero_point"] = cut(p, 0)
                return out
            K = int(src.tensor(name + ".weight_shape")[1])
            gi = src.g_idx(name)
            if K % p or gi and not torch.equal(src.tensor(gi).long(), torch.arange(K) // (K // ng)):
                return None                         # a ragged last word; act-order: cut from the whole layer
            out = {"weight_packed": cut(p, 1)}
            if ng > 1:
                out["weight_scale"] = cut(K // ng, 1)
                if zp:
                    out["weight_zero_point"] = cut(K // ng, 1)
            if gi:
                out["weight_g_idx"] = part          # not read: within the part it is k // G again
            return out
        except _OffPacking:
            return None
    ng = src.shape(name + ".scales")[0]
    word = p if q.method == "gptq" else 8           # codes per int32 word along N (GPTQ qzeros; AWQ both)
    try:
        if part.dim == 0:                           # output rows: columns of the stored tensors
            return {"scales": cut(1, 1), "qzeros": cut(word, 1), "qweight": cut(1 if q.method == "gptq" else 8, 1)}
        K = src.shape(name + ".qweight")[0] * (p if q.method == "gptq" else 1)
        G = K // ng
        out = {"qweight": cut(p, 0) if q.method == "gptq" else cut(1, 0)}
        if ng > 1:                                  # grouped: the part's groups; per channel: every column's scale
            out["scales"] = out["qzeros"] = cut(G, 0)
        if q.method == "gptq" and src.g_idx(name):
            if not torch.equal(src.tensor(name + ".g_idx").long(), torch.arange(K) // G):
                return None                         # act-order: cut from the whole layer (shard_linear)
            out["g_idx"] = part                     # not read: within the part it is k // G again
        return out
    except _OffPacking:
        return None


class _OffPacking(Exception):
    """A part that cuts a packed word or a group."""


@dataclass(frozen=True)
class CheckpointQuant:
    """A checkpoint's quantization_config, checked."""
    method: str              # "gptq" | "awq" | "compressed-tensors"
    bits: int
    group_size: int          # -1: per output channel
    symmetric: bool
    act_order: bool
    checkpoint_format: str   # "gptq" | "gptq_v2" | "awq" | "pack-quantized"

    @property
    def label(self) -> str:
        """The format's name in messages."""
        return COMPRESSED if self.method == COMPRESSED else self.method.upper()

    @property
    def marker(self) -> str:
        """The name (after the linear's) of a tensor only its quantized linears have."""
        if self.method != COMPRESSED:
            return "qweight"
        return "weight_packed" if self.checkpoint_format == CT_PACKED else "weight_scale"

    @property
    def scheme(self) -> str | None:
        """The activation-quantized scheme of its layers (W8A8 int8 / FP8), None for weight-only ones."""
        return CT_W8A8.get(self.checkpoint_format) if self.method == COMPRESSED else None


COMPRESSED = "compressed-tensors"
CT_PACKED = "pack-quantized"          # compressed-tensors formats read: packed integer weights (W4A16 / W8A16),
CT_W8A8 = {"int-quantized": "w8a8", "float-quantized": "w8a8-fp8"}   # and 8-bit weights with dynamic per-token
#                                                                   activations (W8A8 int8 / FP8)


def _ct_kind(gname: str, g: dict, fmt: str, where: str) -> tuple:
    """One compressed-tensors config group: (format, bits, group size, symmetric), or an error naming what of it
    is not read."""
    w = g.get("weights") or {}
    a = g.get("input_activations") or None
    gfmt = str(g.get("format") or fmt).lower()
    wtype, bits, strategy = str(w.get("type", "int")).lower(), w.get("num_bits"), str(w.get("strategy")).lower()
    got = (f"format {gfmt!r}, weights {{type: {w.get('type')!r}, num_bits: {bits!r}, strategy: {w.get('strategy')!r}, "
           f"symmetric: {w.get('symmetric', True)!r}}}, input_activations {a!r}")
    if gfmt == CT_PACKED:
        if a or wtype != "int" or bits not in (4, 8) or strategy not in ("group", "channel", "tensor"):
            raise ValueError(f"{where}: compressed-tensors config group {gname!r} in format {CT_PACKED!r} must hold "
                             f"integer weights of 4 or 8 bits by group, channel or tensor and no input_activations "
                             f"(W4A16 / W8A16), got {got}")
        gs = int(w["group_size"]) if strategy == "group" else PER_CHANNEL
        return gfmt, int(bits), gs, bool(w.get("symmetric", True))
    if gfmt in CT_W8A8:
        want = "float" if gfmt == "float-quantized" else "int"
        acts_ok = isinstance(a, dict) and str(a.get("type", want)).lower() == want and a.get("num_bits") == 8 \
            and a.get("dynamic") is True and str(a.get("strategy")).lower() == "token" and a.get("symmetric", True)
        if wtype != want or bits != 8 or strategy not in ("channel", "tensor") or not w.get("symmetric", True) \
                or not acts_ok:
            raise ValueError(f"{where}: compressed-tensors config group {gname!r} in format {gfmt!r} must hold "
                             f"symmetric 8-bit {want} weights by channel or tensor and {want} activations quantized "
                             f"per token at run time (dynamic; {CT_W8A8[gfmt]}), got {got}")
        return gfmt, 8, PER_CHANNEL, True
    raise ValueError(f"{where}: compressed-tensors config group {gname!r} has format {gfmt!r}; read are "
                     f"{CT_PACKED!r} (W4A16 / W8A16) and {', '.join(map(repr, CT_W8A8))} (W8A8 int8 / FP8 with "
                     f"dynamic activations), got {got}")


def _compressed_spec(qc: dict, where: str) -> CheckpointQuant:
    """A compressed-tensors quantization_config: every config group of one kind this reader takes."""
    fmt = str(qc.get("format") or "").lower()
    status = str(qc.get("quantization_status") or "compressed").lower()
    if status != "compressed":
        raise ValueError(f"{where}: compressed-tensors quantization_status must be 'compressed' (packed codes), got "
                         f"{status!r}: its weights are not stored as codes")
    sparsity = qc.get("sparsity_config") or {}
    if sparsity and str(sparsity.get("format", "dense")).lower() != "dense":
        raise ValueError(f"{where}: compressed-tensors sparse checkpoints are not read, got sparsity format "
                         f"{sparsity.get('format')!r}")
    if qc.get("transform_config"):
        raise ValueError(f"{where}: compressed-tensors checkpoints with transforms (rotations) are not read")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(f"{where}: compressed-tensors quantization_config needs config_groups, got {groups!r}")
    kinds = {gname: _ct_kind(gname, g or {}, fmt, where) for gname, g in groups.items()}
    gfmt, bits, gs, sym = _one_kind(kinds, f"{where}: compressed-tensors config groups must share format, num_bits, "
                                           f"group_size and symmetric")
    return CheckpointQuant(COMPRESSED, bits, gs, sym, False, gfmt)


def quant_spec(config: dict, where: str = "config.json") -> CheckpointQuant | None:
    """The checked quantization_config of a config.json dict; None when there is none."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"{where}: quantization_config must be an object, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "")).lower()
    bits, gs = qc.get("bits", 4), qc.get("group_size", qc.get("q_group_size", 128))
    if method == "gptq":
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"{where}: GPTQ checkpoint_format must be 'gptq' or 'gptq_v2', got {fmt!r} (other "
                             f"layouts, e.g. Marlin-repacked, are not read)")
        if bits not in (4, 8):
            raise ValueError(f"{where}: GPTQ bits must be 4 or 8, got {bits!r}")
        spec = CheckpointQuant("gptq", bits, gs, bool(qc.get("sym", True)), bool(qc.get("desc_act", False)), fmt)
    elif method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"{where}: AWQ version must be 'gemm' (AutoAWQ's default layout), got {version!r}")
        if bits != 4:
            raise ValueError(f"{where}: AWQ bits must be 4, got {bits!r}")
        if not qc.get("zero_point", True):
            raise ValueError(f"{where}: AWQ without zero points (zero_point=false) is not read")
        spec = CheckpointQuant("awq", 4, gs, False, False, "awq")
    elif method == COMPRESSED:
        spec = _compressed_spec(qc, where)
        gs = spec.group_size
    else:
        raise ValueError(f"{where}: quantization_config.quant_method must be 'gptq', 'awq' or 'compressed-tensors', "
                         f"got {qc.get('quant_method')!r}")
    try:
        check_group_size(gs)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return spec


# ---------------------------------------------------------------------------------------------
# load_pretrained


def _fresh_buffers(model: nn.Module, device) -> None:
    """Non-persistent buffers left on the meta device (rotary inv_freq: computed at construction, never saved)
    are recomputed by rebuilding their module on `device` from the model config."""
    for name, mod in list(model.named_modules()):
        if any(b is not None and b.is_meta for b in mod._buffers.values()) and not list(mod.parameters()):
            try:
                with torch.device(device):
                    new = type(mod)(config=model.config)
            except TypeError:
                continue
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, new)


def load_pretrained(path, *, device="cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """A transformers causal LM from a Hugging Face directory: float layers as they are stored, GPTQ / AWQ /
    compressed-tensors quantized layers (module docstring) as QuantizedLinear, straight from their codes (no float
    copy). The model is built on the meta device and every tensor is read onto `device` once; it is returned only
    when complete (a missing or misshapen tensor raises, naming it). dtype: the activation dtype (default the
    checkpoint's torch_dtype, float16 when absent); quantized layers' scales are converted to it."""
    from transformers import AutoConfig, AutoModelForCausalLM
    src = SafetensorsDir(path)
    device = torch.device(device)
    if dtype is None:
        name = str(src.config.get("torch_dtype") or src.config.get("dtype") or "float16").replace("torch.", "")
        dtype = getattr(torch, name, torch.float16)
        dtype = dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float16
    if src.quant is not None and dtype == torch.float32:
        raise TypeError(f"{src.path} holds {src.quant.label} layers, which take float16 / bfloat16 "
                        f"activations: pass dtype=torch.float16 or torch.bfloat16")
    cfg = AutoConfig.from_pretrained(str(src.path))
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config      # ours to apply, not transformers'
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    for name, mod in list(model.named_modules()):
        if isinstance(mod, nn.Linear) and src.is_quantized(name):
            q = src.quantized_linear(name, (mod.out_features, mod.in_features), device, dtype)
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, q)
    _fresh_buffers(model, device)
    state, missing = {}, []
    persistent = model.state_dict(keep_vars=True)
    for name, t in persistent.items():
        if t is None or not t.is_meta:
            continue
        if src.has(name):
            v = src.tensor(name)
            if tuple(v.shape) != tuple(t.shape):
                raise ValueError(f"{src.path}: tensor {name!r} has shape {tuple(v.shape)}, the model config "
                                 f"expects {tuple(t.shape)}")
            state[name] = v.to(device, dtype if v.is_floating_point() else v.dtype)
        else:
            missing.append(name)
    tied = getattr(cfg, "tie_word_embeddings", False)
    missing = [n for n in missing if not (tied and n == "lm_head.weight")]
    if missing:
        raise ValueError(f"{src.path}: tensor(s) missing from the checkpoint: {missing[:8]}"
                         + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(f"internal error: tensors not loaded: {left[:8]}")
    return model.eval()


# ---------------------------------------------------------------------------------------------
# save_gptq


def _pack_words(fields: torch.Tensor, bits: int) -> torch.Tensor:
    """uint [R, C] (C a multiple of 32 / bits) -> int32 [R, C * bits / 32]: field j of word w from column
    w * p + j, in bits j * bits (the inverse of packed_weight._unpack_words)."""
    p = 32 // bits
    R, C = fields.shape
    f = fields.to(torch.int64).reshape(R, C // p, p)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=fields.device)
    v = (f << shifts).sum(-1)
    v = torch.where(v >= 2 ** 31, v - 2 ** 32, v)
    return v.to(torch.int32)


def gptq_tensors(q: QuantizedLinear, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """The GPTQ tensors (qweight, qzeros, scales, g_idx, bias) of a weight-only QuantizedLinear."""
    pw = q.packed_weight()
    N, K = pw.shape
    p = 32 // pw.bits
    if N % p:
        raise ValueError(f"the GPTQ format packs {p} output channels per zero-point word: out_features={N} is not a "
                         f"multiple of {p}")
    if not pw.int_zeros:
        raise ValueError("the GPTQ format stores integer zero points; this layer has fractional ones")
    u, _, _, g_idx = pw.unpack()
    u = u.to(torch.int16) + (2 ** (pw.bits - 1) if pw.symmetric else 0)     # unsigned codes, input order
    z = pw.scale_zero[..., 1].float().round().to(torch.int64)                 # [N, ng]
    if checkpoint_format == "gptq":
        z = z - 1
        if bool((z < 0).any()):
            raise ValueError("a zero point of 0 cannot be stored in checkpoint_format 'gptq' (zeros minus one): "
                             "use 'gptq_v2'")
    return {"qweight": _pack_words(u, pw.bits).t().contiguous(),                # packed along K: [K / p, N]
            "qzeros": _pack_words(z.t().contiguous(), pw.bits),
            "scales": pw.scales.t().contiguous().to(torch.float16),
            "g_idx": g_idx.to(torch.int32).contiguous(),
            **({"bias": q.bias.detach().to(torch.float16)} if q.bias is not None else {})}


def _one_kind(kinds: dict, head: str) -> tuple:
    """The one value of kinds ({layer or group: its kind}), or an error: head, then the first that differs."""
    (first_name, first), *_ = kinds.items()
    odd = next((n for n, k in kinds.items() if k != first), None)
    if odd is not None:
        raise ValueError(f"{head}: {odd!r} has {kinds[odd]}, {first_name!r} has {first}")
    return first


def _hf_quantized_layers(model: nn.Module) -> tuple[dict, dict, tuple]:
    """The model's QuantizedLinear layers under the transformers names a checkpoint gives them ({name: layer};
    fused q|k|v and quantize_'s fused MLPs written as the model's own modules), the norms a fused MLP holds
    ({name: tensor}), and the prefixes of the state-dict entries those layers replace."""
    from .fused import QKV_NAMES, QuantizedMLP, qkv_groups
    mlps = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedMLP)}
    inside = tuple(f"{p}." for p in mlps)
    qs = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear) and not n.startswith(inside)}
    norms = {}
    for p, m in mlps.items():     # a fused MLP (quantize_'s fuse) is written as the model's own modules
        if p.rpartition(".")[2] != "mlp":
            raise ValueError(f"a QuantizedMLP is written as its decoder layer's mlp and post_attention_layernorm: "
                             f"expected it at '<layer>.mlp', got {p!r}")
        qs[f"{p}.gate_proj"], qs[f"{p}.up_proj"] = m.gate_up_proj.split([m.intermediate_size] * 2)
        qs[f"{p}.down_proj"] = m.down_proj
        norms[f"{p[:-len('mlp')]}post_attention_layernorm.weight"] = m.norm.weight.detach().contiguous().cpu()
    fused = []
    for attn, g in qkv_groups(model).items():     # fused q|k|v: written as the three projections
        del qs[f"{attn}.qkv_proj"]
        fused.append(f"{attn}.qkv_proj.")
        qs.update({f"{attn}.{n}": part for n, part in zip(QKV_NAMES, g.proj.split(list(g.sizes)))})
    return qs, norms, tuple(f"{n}." for n in qs) + inside + tuple(fused)


def _write_hf_dir(model: nn.Module, path, tensors: dict, skip: tuple, quantization_config: dict) -> Path:
    """A Hugging Face directory of `model`: `tensors` (the quantized layers' own) and every other state-dict entry
    not under `skip` (tied weights once), config.json with quantization_config and the weights' checksum. The
    weights and then config.json are each replaced in one step (the checksum tells an interrupted save)."""
    from safetensors.torch import save_file
    seen = {}
    for name, t in model.state_dict().items():
        if name.startswith(skip) or t is None:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:       # tied weights (lm_head = embed_tokens): stored once, as transformers does
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    cfg = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    cfg["quantization_config"] = quantization_config
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    # the weights, then config.json recording their checksum (each replaced in one step): a save interrupted
    # between the two leaves new weights beside the old config, which SafetensorsDir refuses by the checksum
    replace_atomically(out / "model.safetensors", lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    cfg[DIGEST_KEY] = {"model.safetensors": file_digest(out / "model.safetensors")}
    write_text_atomically(out / "config.json", json.dumps(cfg, indent=1, default=str))
    (out / "model.safetensors.index.json").unlink(missing_ok=True)     # a sharded save's index would win
    return out


def save_gptq(model: nn.Module, path, checkpoint_format: str | None = None) -> Path:
    """Write a transformers model whose quantized linears are weight-only QuantizedLinear modules as a GPTQ
    directory (config.json with quantization_config, model.safetensors) that GPTQ loaders read. Every
    quantized layer must share bits, group size, symmetry and act-order (one quantization_config holds
    them). checkpoint_format: "gptq" (zeros minus one: every zero point >= 1, true of symmetric weights) or
    "gptq_v2"; default "gptq" when it can hold the zeros. The weights and then config.json are each replaced in
    one step, config.json recording the weights' BLAKE2b checksum: a save interrupted between the two leaves
    a directory that load_pretrained / from_pretrained refuse with a clear error (other GPTQ loaders do not
    check it), never a half-written file."""
    qs, norms, skip = _hf_quantized_layers(model)
    if not qs:
        raise ValueError("model has no QuantizedLinear layers: nothing to write in the GPTQ format")
    bad = [n for n, m in qs.items() if not m.scheme.weight_only]
    if bad:
        raise ValueError(f"the GPTQ format holds weight-only layers (w4a16 / w8a16); {bad[:4]} are "
                         f"{qs[bad[0]].scheme.name}")
    bits, gs, sym, act = _one_kind({n: (m.bits, m.group_size, m.symmetric, m.perm is not None) for n, m in qs.items()},
                                   "one GPTQ quantization_config holds one (bits, group_size, sym, desc_act); layers "
                                   "differ")
    if checkpoint_format is None:
        zmin = min(float(m.scale_zero[..., 1].min()) for m in qs.values())
        checkpoint_format = "gptq" if zmin >= 1 else "gptq_v2"
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}")
    tensors = {f"{n}.{k}": v.cpu() for n, m in qs.items() for k, v in gptq_tensors(m, checkpoint_format).items()}
    tensors.update(norms)
    return _write_hf_dir(model, path, tensors, skip, {"quant_method": "gptq", "bits": bits, "group_size": gs,
                                                      "sym": sym, "desc_act": act,
                                                      "checkpoint_format": checkpoint_format})


def compressed_tensors_tensors(q: QuantizedLinear) -> dict[str, torch.Tensor]:
    """The compressed-tensors tensors of a QuantizedLinear (the module docstring's layouts): weight-only layers as
    "pack-quantized" (weight_packed, weight_scale, weight_zero_point where asymmetric, weight_shape), W8A8 ones as
    "int-quantized" / "float-quantized" (weight, weight_scale [N, 1] float32)."""
    bias = {"bias": q.bias.detach()} if q.bias is not None else {}
    if not q.scheme.weight_only:
        # copies: a split layer's tensors are views of the fused one's, which safetensors will not store
        return {"weight": q.weight.detach().clone(), "weight_scale": q.weight_scale.detach().float()[:, None].clone(),
                **{k: v.clone() for k, v in bias.items()}}
    pw = q.packed_weight()
    if pw.perm is not None:
        raise ValueError("compressed-tensors has no act-order columns (its activation order 'group' was removed): "
                         "quantize without act_order, or save with format='gptq'")
    if not pw.int_zeros:
        raise ValueError("compressed-tensors stores integer zero points; this layer has fractional ones")
    N, K = pw.shape
    half = 2 ** (pw.bits - 1)
    u, _, _, _ = pw.unpack()
    stored = u.to(torch.int16) + (half if pw.symmetric else 0)                 # signed code + 2**(bits - 1)
    out = {"weight_packed": _pack_words(_pad_to(stored, 32 // pw.bits), pw.bits),
           "weight_scale": pw.scales.contiguous(), "weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    if not pw.symmetric:
        z = pw.zeros.float().round().to(torch.int64)                          # unsigned: signed zero point + half
        if bool((z > 2 * half - 1).any()):
            raise ValueError(f"a zero point of {2 * half} does not fit compressed-tensors' signed {pw.bits}-bit "
                             f"zero points")
        out["weight_zero_point"] = _pack_words(_pad_to(z.t().contiguous(), 32 // pw.bits), pw.bits).t().contiguous()
    return {**out, **bias}


def _pad_to(fields: torch.Tensor, p: int) -> torch.Tensor:
    """[R, C] -> [R, C rounded up to a multiple of p], zero-filled (a part-filled last word)."""
    return torch.nn.functional.pad(fields, (0, -fields.shape[1] % p))


def save_compressed_tensors(model: nn.Module, path) -> Path:
    """Write a transformers model whose quantized linears are QuantizedLinear modules as a compressed-tensors
    directory (llm-compressor's format, which vLLM and transformers load): weight-only layers as "pack-quantized"
    (W4A16 / W8A16), w8a8 / w8a8-fp8 ones as "int-quantized" / "float-quantized" with activations quantized per
    token at run time, as qkernels runs them. Every quantized layer must be of one kind (one config group targets
    every Linear; the float ones, e.g. lm_head, are listed in `ignore`). Written as save_gptq writes (the weights,
    then config.json with their checksum, each in one step)."""
    qs, norms, skip = _hf_quantized_layers(model)
    if not qs:
        raise ValueError("model has no QuantizedLinear layers: nothing to write in the compressed-tensors format")
    facts = {n: (m.scheme.name, m.bits if m.scheme.weight_only else 8, m.group_size if m.scheme.weight_only else
                 PER_CHANNEL, m.symmetric if m.scheme.weight_only else True) for n, m in qs.items()}
    scheme, bits, gs, sym = _one_kind(facts, "one compressed-tensors config group holds one (scheme, bits, "
                                             "group_size, symmetric); layers differ")
    tensors = {f"{n}.{k}": v.cpu() for n, m in qs.items() for k, v in compressed_tensors_tensors(m).items()}
    tensors.update(norms)
    if scheme in CT_W8A8.values():
        typ = "float" if scheme == "w8a8-fp8" else "int"
        fmt = f"{typ}-quantized"
        weights = dict(num_bits=8, type=typ, symmetric=True, strategy="channel", group_size=None, dynamic=False)
        acts = dict(num_bits=8, type=typ, symmetric=True, strategy="token", group_size=None, dynamic=True)
    else:
        fmt, acts = CT_PACKED, None
        weights = dict(num_bits=bits, type="int", symmetric=sym, strategy="channel" if gs == PER_CHANNEL else "group",
                       group_size=None if gs == PER_CHANNEL else gs, dynamic=False)
    quantized = set(qs)
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in quantized]
    qc = {"quant_method": COMPRESSED, "format": fmt, "quantization_status": "compressed", "ignore": ignore,
          "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt, "weights": weights,
                                        "input_activations": acts, "output_activations": None}}}
    return _write_hf_dir(model, path, tensors, skip, qc)

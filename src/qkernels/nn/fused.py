"""Fused modules for Llama / Qwen-style decoder blocks in a quantized model.

- `RMSNorm`: drop-in for the models' RMSNorm (weight, variance_epsilon), one qkernels.rms_norm kernel
  instead of six eager ops.
- `QuantizedMLP`: replaces a block's post-attention RMSNorm and its SwiGLU MLP; gate and up run as one
  GEMM. w8a8 schemes: the norm kernel writes the int8 / fp8 codes of its output and their per-token
  scales (the float output never goes to memory), silu_and_mul quantizes its output in the same pass,
  and down_proj takes those codes: per layer two activation quantization passes, the norm's float
  output, one GEMM launch and the eager SwiGLU ops fewer. Weight-only schemes: the norm kernel, then
  the gate|up product with SwiGLU applied in the same call (at decode sizes in the GEMV's epilogue:
  QuantizedLinear.forward_swiglu), then down: one launch and the eager SwiGLU ops fewer per layer.

- fused q|k|v (`fuse_qkv_`): a self-attention module's q / k / v projections as one GEMM, [q; k; v]
  (`<attn>.qkv_proj`, a QuantizedLinear). The module calls `q_proj`, `k_proj` and `v_proj` one after the other on
  the same input, so they become `QKVPart` modules without tensors of their own (their shared state: a
  `QuantizedQKV`): the first call runs the merged product and keeps its three slices until each has been taken
  (nothing outlives the three calls, so nothing escapes a compiled or captured step). A part called with another
  input than the one its slices came from runs the product again: never a stale slice. One launch (w8a8: one
  activation quantization) instead of three; at decode the k and v products are too small to fill the GPU on
  their own. Only modules named `self_attn` are fused: a cross-attention module (`encoder_attn`) feeds k and v
  another input than q.

Attention stays the model's own (PyTorch scaled_dot_product_attention).

On a plain CPU (no GPU, no interpreter) the modules run the reference twins, like QuantizedLinear.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import reference as ref
from .._runtime import runs_kernels
from ..schemes import Scheme, parse_scheme
from .linear import QuantizedLinear, concat_problem


class RMSNorm(nn.Module):
    """y = x * rsqrt(mean(x^2) + eps) * weight in fp32, one rounding to x's dtype."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps

    @classmethod
    def from_module(cls, norm: nn.Module) -> "RMSNorm":
        w = norm.weight.detach()
        mod = cls(w.shape[0], float(norm.variance_epsilon), device="meta", dtype=w.dtype)
        mod.weight = nn.Parameter(w, requires_grad=False)
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not runs_kernels(x):
            return ref.rms_norm(x, self.weight, self.variance_epsilon)[0]
        from ..ops.fused import rms_norm
        return rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}"


class QuantizedMLP(nn.Module):
    """post-attention RMSNorm -> gate|up GEMM -> SiLU(gate) * up -> down GEMM. w8a8 schemes quantize the
    activations per token inside the norm and SwiGLU kernels; weight-only schemes apply SwiGLU in the gate|up
    call (QuantizedLinear.forward_swiglu)."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float = 1e-6, scheme: str | Scheme = "w8a8",
                 bias: bool = False, device=None, dtype: torch.dtype = torch.float16):
        super().__init__()
        scheme = parse_scheme(scheme)
        self.scheme, self.hidden_size, self.intermediate_size = scheme, hidden_size, intermediate_size
        self.norm = RMSNorm(hidden_size, eps, device=device, dtype=dtype)
        self.gate_up_proj = QuantizedLinear(hidden_size, 2 * intermediate_size, bias, scheme, device, dtype)
        self.down_proj = QuantizedLinear(intermediate_size, hidden_size, bias, scheme, device, dtype)

    @classmethod
    def from_modules(cls, norm: nn.Module, mlp: nn.Module, scheme: str | Scheme, device=None,
                     dtype: torch.dtype | None = None) -> "QuantizedMLP":
        """From a model's post-attention RMSNorm and its gate/up/down nn.Linear MLP (see fusable)."""
        g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        dev = device or g.weight.device
        dt = dtype or g.weight.dtype
        bias = g.bias is not None
        mod = cls(g.in_features, g.out_features, float(norm.variance_epsilon), scheme, bias, "meta", dt)
        mod.norm.weight = nn.Parameter(norm.weight.detach().to(dev, dt), requires_grad=False)
        gate_up = nn.Linear(g.in_features, 2 * g.out_features, bias=bias, device="meta")
        gate_up.weight = nn.Parameter(torch.cat([g.weight.detach().to(dev, dt), u.weight.detach().to(dev, dt)]),
                                      requires_grad=False)
        if bias:
            gate_up.bias = nn.Parameter(torch.cat([g.bias.detach(), u.bias.detach()]).to(dev, dt), requires_grad=False)
        mod.gate_up_proj = QuantizedLinear.from_linear(gate_up, scheme)
        del gate_up
        down = nn.Linear(d.in_features, d.out_features, bias=d.bias is not None, device="meta")
        down.weight = nn.Parameter(d.weight.detach().to(dev, dt), requires_grad=False)
        if d.bias is not None:
            down.bias = nn.Parameter(d.bias.detach().to(dev, dt), requires_grad=False)
        mod.down_proj = QuantizedLinear.from_linear(down, scheme)
        return mod

    @classmethod
    def from_quantized(cls, norm: nn.Module, mlp: nn.Module) -> "QuantizedMLP":
        """From a layer's post-attention RMSNorm and an MLP whose gate / up / down are already QuantizedLinear
        layers of one scheme (fusable_quantized): gate and up concatenated row-wise (QuantizedLinear.concat: the
        same codes, whatever method quantized them), down as it is."""
        g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        w = norm.weight.detach()
        mod = cls(g.in_features, g.out_features, float(norm.variance_epsilon), g.scheme, g.bias is not None, "meta",
                  w.dtype)
        mod.norm.weight = nn.Parameter(w, requires_grad=False)
        mod.gate_up_proj = QuantizedLinear.concat([g, u])
        mod.down_proj = d
        return mod

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.scheme.weight_only:
            return self.down_proj(self.gate_up_proj.forward_swiglu(self.norm(h)))
        fmt = self.scheme.format
        eps = self.norm.variance_epsilon
        if runs_kernels(h):
            from ..ops.fused import rms_norm, silu_and_mul
            q, s = rms_norm(h, self.norm.weight, eps, quantize=fmt)
            q2, s2 = silu_and_mul(self.gate_up_proj.forward_quantized(q, s, h.dtype), quantize=fmt)
        else:
            q, s = ref.rms_norm(h, self.norm.weight, eps, quantize_to=fmt)
            q2, s2 = ref.silu_and_mul(self.gate_up_proj.forward_quantized(q, s, h.dtype), quantize_to=fmt)
        return self.down_proj.forward_quantized(q2, s2, h.dtype)

    def extra_repr(self) -> str:
        return f"hidden={self.hidden_size}, intermediate={self.intermediate_size}, scheme={self.scheme.name!r}"


class QuantizedQKV:
    """The shared state of an attention module's three QKVPart modules: its merged projection (`attn.qkv_proj`,
    registered on the attention module, so .to() and state_dict see it once) and the slices of the last product
    until all three are taken. Not a module: the parts refer to it without owning the tensors."""

    def __init__(self, proj: QuantizedLinear, sizes):
        self.proj, self.sizes = proj, tuple(int(n) for n in sizes)
        self._cache = None                   # (input, its slices, how many were taken): one tuple, stored at once

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        cache = self._cache
        if cache is None or cache[0] is not x:      # a new input: the product of this one
            cache = (x, self.proj(x).split(self.sizes, dim=-1), 0)
        _, parts, taken = cache
        # all three taken: hold nothing between steps. The slice returned is always from the product of this x (read
        # from one tuple), so calls from several threads interleaving only cost recomputations
        self._cache = None if taken + 1 == len(self.sizes) else (x, parts, taken + 1)
        return parts[index]


class QKVPart(nn.Module):
    """q_proj, k_proj or v_proj of an attention module whose projections run as one GEMM (fuse_qkv_): slice
    `index` of the merged product. No tensors of its own; `layer()` is its rows of the merged layer as a
    QuantizedLinear (views), what loaders and writers that want the separate projection take."""

    def __init__(self, shared: QuantizedQKV, index: int):
        super().__init__()
        object.__setattr__(self, "shared", shared)      # not a submodule: the attention module owns qkv_proj
        self.index = index
        self.in_features, self.out_features = shared.proj.in_features, shared.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.part(x, self.index)

    def layer(self) -> QuantizedLinear:
        return self.shared.proj.split(list(self.shared.sizes))[self.index]

    def extra_repr(self) -> str:
        return f"rows {sum(self.shared.sizes[:self.index])}:{sum(self.shared.sizes[:self.index + 1])} of qkv_proj"


QKV_NAMES = ("q_proj", "k_proj", "v_proj")


def fuse_qkv(attn: nn.Module, proj: QuantizedLinear, sizes) -> None:
    """Make `attn`'s q_proj / k_proj / v_proj the slices of `proj` ([q; k; v] rows of `sizes`)."""
    shared = QuantizedQKV(proj, sizes)
    attn.qkv_proj = proj
    for i, n in enumerate(QKV_NAMES):
        setattr(attn, n, QKVPart(shared, i))


def fusable_qkv(attn: nn.Module) -> bool:
    """An attention module with q_proj / k_proj / v_proj QuantizedLinear layers that concatenate (one scheme, one
    input, ...: concat_problem)."""
    lins = [getattr(attn, n, None) for n in QKV_NAMES]
    return (all(isinstance(m, QuantizedLinear) for m in lins) and not hasattr(attn, "qkv_proj")
            and concat_problem(lins) is None)


def fuse_qkv_(model: nn.Module) -> int:
    """Every self-attention module of `model` (named `self_attn`, as in the Llama / Qwen / Mistral families; not a
    cross-attention, whose k and v take another input than q) whose q / k / v projections are concatenable
    QuantizedLinear layers runs them as one (QuantizedLinear.concat: the same codes). Returns how many were
    fused."""
    attns = [m for n, m in model.named_modules() if n.rpartition(".")[2] == "self_attn" and fusable_qkv(m)]
    for attn in attns:
        lins = [getattr(attn, n) for n in QKV_NAMES]
        fuse_qkv(attn, QuantizedLinear.concat(lins), [m.out_features for m in lins])
    return len(attns)


def qkv_groups(model: nn.Module) -> dict:
    """{attention module name: its QuantizedQKV} of a model with fused q / k / v projections."""
    return {n.rpartition(".")[0]: m.shared for n, m in model.named_modules()
            if isinstance(m, QKVPart) and m.index == 0}


def linear_count(model: nn.Module) -> int:
    """The model's quantized linear layers as its own modules count them: a fused MLP's gate|up two, a fused
    q|k|v three."""
    n = sum(isinstance(m, QuantizedLinear) for m in model.modules()) + sum(isinstance(m, QuantizedMLP)
                                                                         for m in model.modules())
    return n + 2 * len(qkv_groups(model))


# ---------------------------------------------------------------------------------------------
# recognising the blocks


def is_rms_norm(mod: nn.Module) -> bool:
    """A Llama / Qwen / Mistral-style RMSNorm: y = weight * normalized x (Gemma's (1 + weight)
    variant has no `variance_epsilon` and is not matched)."""
    return (type(mod).__name__.endswith("RMSNorm") and hasattr(mod, "variance_epsilon")
            and isinstance(getattr(mod, "weight", None), torch.Tensor) and mod.weight.dim() == 1)


def _is_silu(act) -> bool:
    return isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLU", "SiLUActivation")


def fusable_quantized(layer: nn.Module) -> bool:
    """A decoder layer whose post_attention_layernorm -> mlp is RMSNorm -> SwiGLU(gate, up) -> down with
    QuantizedLinear projections of one scheme, gate and up concatenable (QuantizedLinear.concat)."""
    norm, mlp = getattr(layer, "post_attention_layernorm", None), getattr(layer, "mlp", None)
    if norm is None or mlp is None or not is_rms_norm(norm):
        return False
    lins = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, QuantizedLinear) for m in lins) or not _is_silu(getattr(mlp, "act_fn", None)):
        return False
    g, u, d = lins
    return (g.in_features == u.in_features == d.out_features and g.out_features == u.out_features == d.in_features
            and g.scheme == u.scheme == d.scheme and (g.bias is None) == (d.bias is None)
            and concat_problem([g, u]) is None)


def fusable(layer: nn.Module) -> bool:
    """A decoder layer whose post_attention_layernorm -> mlp is RMSNorm -> SwiGLU(gate, up) -> down
    with plain nn.Linear projections."""
    norm, mlp = getattr(layer, "post_attention_layernorm", None), getattr(layer, "mlp", None)
    if norm is None or mlp is None or not is_rms_norm(norm):
        return False
    lins = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(m) is nn.Linear for m in lins) or not _is_silu(getattr(mlp, "act_fn", None)):
        return False
    g, u, d = lins
    return (g.in_features == u.in_features == d.out_features and g.out_features == u.out_features == d.in_features
            and (g.bias is None) == (u.bias is None))

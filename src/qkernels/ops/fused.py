"""Fused LLM blocks: RMSNorm / LayerNorm (residual add, output quantization), SiLU-and-mul
(output quantization) and softmax. Launchers: validate -> allocate -> launch.

Kernels: kernels/_fused.py. Numerics: reference.rms_norm / layer_norm / silu_and_mul / softmax.
The quantized outputs are exactly `quantize(y, fmt, "row")` of the float output y the same op
returns without `quantize` (same kernel, same arithmetic), ready for
`w8a8_linear(q, ..., x_scale=scale)`. Attention itself is PyTorch's scaled_dot_product_attention
and memory comes from PyTorch's caching allocator: qkernels does not replace either.
"""
from __future__ import annotations

import functools
import math

import torch

from .._runtime import (FLOAT_DTYPES, alloc, call_op, cdiv, check_kernel_device, check_same_device, check_tensor,
                        launch, next_pow2, pdl_options, register_twin, scoped_update)
from .. import reference as ref
from .quant import _fp8_emulate

QUANTIZE_FORMATS = {"int8": (torch.int8, 127), "fp8_e4m3": (torch.float8_e4m3fn, 448)}

# Tiles as data (one place): rows up to max_block elements stay in registers (one pass); longer rows
# loop over loop_block chunks. Short rows are batched rows_tile elements per program.
# elems_per_warp sets num_warps (elems_per_warp_quant for the kernels that also quantize: they hold a
# row across two reductions). silu_block: widest column tile of the elementwise SwiGLU, narrowed to
# the widest that pads the row by at most 1/16. Values from an H100 sweep (scripts/tune_fused.py).
# Quantizing kernels on rows wider than 8192 use quant_long_warps (fewer values per thread).
TILES = {"max_block": 16384, "loop_block": 4096, "rows_tile": 4096, "elems_per_warp": 512,
         "elems_per_warp_quant": 1024, "max_warps": 16, "quant_long_warps": 32, "silu_block": 4096}


def tiles(**overrides):
    """Scoped override of TILES (tests force the chunked path on small rows with it; the tuning script
    sweeps them)."""
    return scoped_update(TILES, overrides, "tile")


@functools.cache
def _kf():
    from ..kernels import _fused
    return _fused


def _row_tiles(M: int, N: int, quant: bool = False) -> tuple[int, int, bool, int]:
    """(BLOCK_M, BLOCK_N, ONE_BLOCK, num_warps) for a kernel that owns whole rows."""
    if N <= TILES["max_block"]:
        block_n = max(2, next_pow2(N))
        block_m = max(1, min(TILES["rows_tile"] // block_n, next_pow2(M)))
        one = True
    else:
        block_n, block_m, one = TILES["loop_block"], 1, False
    epw = TILES["elems_per_warp_quant" if quant else "elems_per_warp"]
    warps = max(1, min(TILES["max_warps"], block_m * block_n // epw))
    if quant and block_m * block_n > 8192:
        warps = TILES["quant_long_warps"]
    return block_m, block_n, one, next_pow2(warps)


def _column_block(I: int) -> int:
    """The widest power-of-two column tile <= silu_block that pads I by at most 1/16."""
    bn = min(TILES["silu_block"], max(2, next_pow2(I)))
    while bn > 256 and (cdiv(I, bn) * bn - I) * 16 > I:
        bn //= 2
    return bn


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [M, N] rows with a unit column stride (a view where possible)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.shape[-1] else x.reshape(math.prod(x.shape[:-1]), 0)
    return x2 if x2.stride(-1) == 1 or x2.shape[-1] <= 1 else x2.contiguous()


def _quant_meta(quantize: str, device: torch.device) -> dict:
    qmax = QUANTIZE_FORMATS[quantize][1]
    return dict(QUANT=True, QMAX=qmax, IS_FP8=quantize != "int8", FP8_EMULATE=_fp8_emulate(device))


_NO_QUANT = dict(QUANT=False, QMAX=127, IS_FP8=False, FP8_EMULATE=False)


def _alloc_out(M: int, N: int, dtype: torch.dtype, quantize: str, device):
    if not quantize:
        return alloc((M, N), dtype, device), torch.empty(0, dtype=torch.float32, device=device)
    return alloc((M, N), QUANTIZE_FORMATS[quantize][0], device), alloc((M,), torch.float32, device)


# ---------------------------------------------------------------------------------------------
# custom ops (flat [M, N] views in and out; the public functions reshape)


def _norm_impl(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
               bias: torch.Tensor | None, eps: float, rms: bool, quantize: str
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    M, N = x.shape
    y, scale = _alloc_out(M, N, x.dtype, quantize, x.device)
    rout = alloc((M, N), x.dtype, x.device) if residual is not None else torch.empty(0, dtype=x.dtype,
                                                                                       device=x.device)
    if M == 0:
        return y, scale, rout
    if N == 0:
        scale.fill_(1.0)
        return y, scale, rout
    bm, bn, one, warps = _row_tiles(M, N, bool(quantize))
    unused = x
    launch(_kf()._norm_kernel, (cdiv(M, bm),),
        x, residual if residual is not None else unused, weight if weight is not None else unused,
        bias if bias is not None else unused, y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y,
        rout if residual is not None else unused, scale if quantize else unused,
        M, N, float(eps), x.stride(0), residual.stride(0) if residual is not None else 0, y.stride(0),
        rout.stride(0) if residual is not None else 0,
        RMS=rms, HAS_RES=residual is not None, HAS_W=weight is not None, HAS_B=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, ONE_BLOCK=one, num_warps=warps,
        **(_quant_meta(quantize, x.device) if quantize else _NO_QUANT), **pdl_options(x.device))
    return y, scale, rout


_norm_op = torch.library.custom_op("qkernels::norm", mutates_args=())(_norm_impl)


def _norm_twin(x, residual, weight, bias, eps, rms, quantize):
    q = quantize or None
    out = (ref.rms_norm(x, weight, eps, residual, q) if rms else ref.layer_norm(x, weight, bias, eps, residual, q))
    scale = out[1].reshape(-1) if q else torch.empty(0, dtype=torch.float32, device=x.device)
    rout = out[-1] if residual is not None else torch.empty(0, dtype=x.dtype, device=x.device)
    return out[0], scale, rout


register_twin(_norm_op, _norm_twin)


@_norm_op.register_fake
def _(x, residual, weight, bias, eps, rms, quantize):
    M, N = x.shape
    y = x.new_empty((M, N), dtype=QUANTIZE_FORMATS[quantize][0] if quantize else x.dtype)
    scale = x.new_empty((M,) if quantize else (0,), dtype=torch.float32)
    return y, scale, x.new_empty((M, N) if residual is not None else (0,))


def _silu_and_mul_impl(x: torch.Tensor, quantize: str) -> tuple[torch.Tensor, torch.Tensor]:
    M, I2 = x.shape
    I = I2 // 2
    y, scale = _alloc_out(M, I, x.dtype, quantize, x.device)
    if M == 0:
        return y, scale
    if I == 0:
        scale.fill_(1.0)
        return y, scale
    y_arg = y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y
    kf = _kf()
    if quantize:
        bm, bn, one, warps = _row_tiles(M, I, True)
        grid = (cdiv(M, bm), 1)
        meta = _quant_meta(quantize, x.device)
    else:   # elementwise: a 2-D grid of tiles
        bn = _column_block(I)
        bm = max(1, min(TILES["rows_tile"] // bn, next_pow2(M)))
        one, warps = True, next_pow2(max(1, min(TILES["max_warps"], bm * bn // TILES["elems_per_warp"])))
        grid = (cdiv(M, bm), cdiv(I, bn))
        meta = _NO_QUANT
    launch(kf._silu_and_mul_kernel, grid, x, y_arg, scale if quantize else x, M, I, x.stride(0), y.stride(0),
           BLOCK_M=bm, BLOCK_N=bn, ONE_BLOCK=one, num_warps=warps, **meta, **pdl_options(x.device))
    return y, scale


_silu_and_mul_op = torch.library.custom_op("qkernels::silu_and_mul", mutates_args=())(_silu_and_mul_impl)


def _silu_and_mul_twin(x, quantize):
    out = ref.silu_and_mul(x, quantize or None)
    return out[0], (out[1].reshape(-1) if quantize else torch.empty(0, dtype=torch.float32, device=x.device))


register_twin(_silu_and_mul_op, _silu_and_mul_twin)


@_silu_and_mul_op.register_fake
def _(x, quantize):
    M, I = x.shape[0], x.shape[1] // 2
    y = x.new_empty((M, I), dtype=QUANTIZE_FORMATS[quantize][0] if quantize else x.dtype)
    return y, x.new_empty((M,) if quantize else (0,), dtype=torch.float32)


def _softmax_impl(x: torch.Tensor, scale: float, causal: bool, l_q: int) -> torch.Tensor:
    M, N = x.shape
    y = alloc((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    bm, bn, one, warps = _row_tiles(M, N)
    launch(_kf()._softmax_kernel, (cdiv(M, bm),),
        x, y, M, N, float(scale), max(l_q, 1), N - l_q, x.stride(0), y.stride(0),
        CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, ONE_BLOCK=one, num_warps=warps)
    return y


_softmax_op = torch.library.custom_op("qkernels::softmax", mutates_args=())(_softmax_impl)


def _softmax_twin(x, scale, causal, l_q):
    if not causal:
        return ref.softmax(x, -1, scale)
    return ref.softmax(x.reshape(-1, l_q, x.shape[-1]), -1, scale, True).reshape(x.shape)


register_twin(_softmax_op, _softmax_twin)


@_softmax_op.register_fake
def _(x, scale, causal, l_q):
    return torch.empty_like(x)


# ---------------------------------------------------------------------------------------------
# validation


def _check_x(name: str, x) -> None:
    check_tensor(name, x, dtypes=FLOAT_DTYPES, ndim_min=1)
    check_kernel_device(name, x)


def _check_vector(name: str, t, N: int, x: torch.Tensor) -> None:
    if t is None:
        return
    check_tensor(name, t, dtypes=FLOAT_DTYPES)
    check_same_device("x", x, **{name: t})
    if t.dim() != 1 or t.shape[0] != N:
        raise ValueError(f"{name} must have shape ({N},) to match x's last dim, got {tuple(t.shape)}")


def _check_quantize(quantize) -> str:
    if quantize is None:
        return ""
    if quantize not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize must be None, 'int8' or 'fp8_e4m3', got {quantize!r}")
    return quantize


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    return float(eps)


def _norm(x, weight, bias, eps, residual, quantize, rms):
    _check_x("x", x)
    N = x.shape[-1]
    _check_vector("weight", weight, N, x)
    _check_vector("bias", bias, N, x)
    eps = _check_eps(eps)
    q = _check_quantize(quantize)
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,))
        check_same_device("x", x, residual=residual)
        if residual.shape != x.shape:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    x2 = _rows(x)
    r2 = _rows(residual) if residual is not None else None
    w = weight.contiguous() if weight is not None else None
    b = bias.contiguous() if bias is not None else None
    y, scale, rout = call_op(_norm_op, _norm_impl, x2, r2, w, b, eps, rms, q)
    out = (y.reshape(x.shape),) if not q else (y.reshape(x.shape), scale.reshape(*x.shape[:-1], 1))
    if residual is not None:
        out = out + (rout.reshape(x.shape),)
    return out[0] if len(out) == 1 else out


# ---------------------------------------------------------------------------------------------
# public API


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, *,
             residual: torch.Tensor | None = None, quantize: str | None = None):
    """RMSNorm over the last dim: y = h * rsqrt(mean(h^2) + eps) * weight with h = x (+ residual),
    in fp32, rounded once to x's dtype (fp32 / fp16 / bf16, any leading dims, any hidden size).

    Returns y; with `residual`, (y, h): h = x + residual is the updated residual stream, written in
    the same pass. With quantize="int8" or "fp8_e4m3", y is returned as (codes, scales): exactly
    `qkernels.quantize(y, quantize, "row")` (codes of x's shape, fp32 scales [..., 1]), so
    rms_norm(..., quantize=f) returns (codes, scales) or (codes, scales, h)."""
    return _norm(x, weight, None, eps, residual, quantize, True)


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5, *,
               residual: torch.Tensor | None = None, quantize: str | None = None):
    """LayerNorm over the last dim: y = (h - mean) * rsqrt(var + eps) * weight + bias (biased
    variance, fp32), h = x (+ residual). Returns like rms_norm."""
    return _norm(x, weight, bias, eps, residual, quantize, False)


def silu_and_mul(gate_up: torch.Tensor, *, quantize: str | None = None):
    """SwiGLU on the concatenated gate/up projection [..., 2I]: silu(gate) * up -> [..., I] in x's
    dtype (fp32 arithmetic, one rounding). With quantize="int8" / "fp8_e4m3": (codes, scales [..., 1])
    exactly as quantize(y, quantize, "row")."""
    _check_x("gate_up", gate_up)
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dim must be even (gate and up halves), got {gate_up.shape[-1]}")
    q = _check_quantize(quantize)
    x2 = _rows(gate_up)
    y, scale = call_op(_silu_and_mul_op, _silu_and_mul_impl, x2, q)
    shape = (*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    return y.reshape(shape) if not q else (y.reshape(shape), scale.reshape(*shape[:-1], 1))


def softmax(x: torch.Tensor, dim: int = -1, *, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
    """softmax(x * scale) along `dim` with fp32 arithmetic, output in x's dtype; numerically stable
    (max-subtracted), any row length (rows longer than one block use an online two-pass path).

    causal (x at least 2-D, dim the last): x is [..., Lq, Lk] attention scores and query i sees keys
    j <= i + (Lk - Lq). A row with no finite logit (all -inf or all masked) gives zeros, not NaN; a
    NaN or +inf logit gives NaN in its row, as torch.softmax does."""
    _check_x("x", x)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}] for x of shape {tuple(x.shape)}, "
                         f"got {dim!r}")
    dim = dim % x.dim()
    if causal and (x.dim() < 2 or dim != x.dim() - 1):
        raise ValueError(f"causal=True needs x of at least 2 dims [..., Lq, Lk] and dim=-1, got shape "
                         f"{tuple(x.shape)} and dim={dim}")
    xt = x.movedim(dim, -1)
    l_q = xt.shape[-2] if causal else 1
    y = call_op(_softmax_op, _softmax_impl, _rows(xt), float(scale), bool(causal), l_q)
    return y.reshape(xt.shape).movedim(-1, dim)

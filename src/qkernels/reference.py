"""Pure-torch twins of every qkernels op: the numerics, written once.

Tests compare each kernel against these (bit-exactly where the arithmetic is exact) and the
benchmarks use them as the "torch eager" / "torch.compile" peers. Everything is computed in
float32 unless stated.

Quantization numerics (x viewed as [M, K]: leading dims flattened into rows, K the last dim)
-------------------------------------------------------------------------------------------
A *segment* is the set of elements sharing one scale: the whole tensor ("tensor"), a row of K
("row"), a column of M ("column"), or `group_size` consecutive elements of a row ("group").

Statistics ignore non-finite values (NaN and +-inf count as 0):
  symmetric:   absmax = max |x|;                 scale = absmax / Q
  asymmetric:  lo = min(min x, 0), hi = max(max x, 0);  scale = (hi - lo) / (qmax - qmin)
  then scale = max(scale, 2**-126) (so 1/scale is finite), and 1.0 where absmax == 0 / hi == lo.
  zero_point = clamp(qmin - rint(lo / scale), qmin, qmax)  (int32; asymmetric only)
  Q = 127 (int8), 7 (int4), 448 (fp8_e4m3), 57344 (fp8_e5m2).
Quantize, integer formats:  inv = 1 / scale (correctly rounded);  y = x * inv (one rounding, never
  fused with the add below);  q = clamp(rint(y) + zero_point, qmin, qmax), rint = half to even.
  +-inf saturate to qmax / qmin; NaN quantizes to zero_point (it dequantizes to 0).
  Ranges: symmetric int8 [-128, 127] (int8), int4 [-8, 7]; asymmetric int8 [0, 255] (uint8),
  int4 [0, 15]. int4 is stored packed: two per uint8 along the last dim, the element at the
  even index in the low nibble.
Quantize, fp8:  q = fp8_rne(clamp(x * inv, -F, F)), F = 448 (e4m3) or 57344 (e5m2); NaN stays NaN.
Dequantize:  (q - zero_point) * scale in fp32, then cast.
Scale layouts for x of shape (*lead, K): tensor (), row (*lead, 1), column (K,),
group (*lead, K // group_size); zero points have the same shape (int32).
"""
from __future__ import annotations

import math

import torch

from .formats import SCALE_MIN, QFormat, get_format
from .schemes import PER_CHANNEL


# ---------------------------------------------------------------------------------------------
# layout helpers


def num_segments(granularity: str, M: int, K: int, group_size: int) -> int:
    return {"tensor": 1, "row": M, "column": K, "group": M * (K // group_size if group_size else 0)}[granularity]


def scale_shape(granularity: str, shape: torch.Size, group_size: int) -> tuple[int, ...]:
    lead, K = tuple(shape[:-1]), shape[-1]
    if granularity == "tensor":
        return ()
    if granularity == "row":
        return lead + (1,)
    if granularity == "column":
        return (K,)
    return lead + (K // group_size,)


def _segments(x2: torch.Tensor, granularity: str, group_size: int) -> torch.Tensor:
    """[M, K] -> [num_segments, segment_len]."""
    M, K = x2.shape
    if granularity == "tensor":
        return x2.reshape(1, M * K)
    if granularity == "row":
        return x2
    if granularity == "column":
        return x2.t()
    return x2.reshape(M * (K // group_size), group_size)


def _unsegment(seg: torch.Tensor, granularity: str, M: int, K: int) -> torch.Tensor:
    if granularity == "column":
        return seg.t().reshape(M, K)
    return seg.reshape(M, K)


# ---------------------------------------------------------------------------------------------
# quantize / dequantize


def _div(a: torch.Tensor, b) -> torch.Tensor:
    """Correctly rounded a / b. (On CUDA, PyTorch divides by a Python scalar by multiplying with
    its reciprocal, which is not correctly rounded; dividing by a tensor is.)"""
    return a / torch.as_tensor(b, dtype=a.dtype, device=a.device).expand_as(a).contiguous()


def compute_scale(seg: torch.Tensor, fmt: QFormat, symmetric: bool):
    """Dynamic scale (and zero point) per segment row of `seg` ([S, L], float32)."""
    finite = torch.where(torch.isfinite(seg), seg, torch.zeros((), dtype=seg.dtype, device=seg.device))
    S, L = seg.shape
    if L == 0:
        finite = torch.zeros(S, 1, dtype=torch.float32, device=seg.device)
    if symmetric:
        amax = finite.abs().amax(dim=1)
        scale = torch.clamp_min(_div(amax, fmt.q_sym), SCALE_MIN)
        scale = torch.where(amax == 0, torch.ones_like(scale), scale)
        return scale, None
    qmin, qmax = fmt.qrange(False)
    lo = torch.clamp_max(finite.amin(dim=1), 0.0)
    hi = torch.clamp_min(finite.amax(dim=1), 0.0)
    rng = hi - lo
    scale = torch.clamp_min(_div(rng, float(qmax - qmin)), SCALE_MIN)
    scale = torch.where(rng == 0, torch.ones_like(scale), scale)
    zp = torch.clamp(qmin - torch.round(lo / scale), qmin, qmax).to(torch.int32)
    return scale, zp


def quantize_values(seg: torch.Tensor, scale: torch.Tensor, zp, fmt: QFormat, symmetric: bool) -> torch.Tensor:
    """Quantize float32 segments [S, L] with per-segment scale [S] (and zero point [S])."""
    inv = _div(torch.ones_like(scale), scale).unsqueeze(1)
    y = seg * inv
    if fmt.is_float:
        return torch.clamp(y, -fmt.fp_max, fmt.fp_max).to(fmt.torch_dtype)
    qmin, qmax = fmt.qrange(symmetric)
    z = zp.unsqueeze(1).float() if zp is not None else torch.zeros_like(inv)
    y = torch.round(torch.minimum(torch.maximum(y, qmin - z), qmax - z))
    y = torch.where(torch.isnan(seg), torch.zeros_like(y), y)
    return (y + z).to(torch.int32)


def quantize(x: torch.Tensor, dtype: str, granularity: str = "tensor", group_size: int = 128,
             symmetric: bool = True, scale=None, zero_point=None):
    """Reference quantize. Returns (data, scale, zero_point) in the layouts documented above."""
    fmt = get_format(dtype)
    shape = x.shape
    K = shape[-1] if x.dim() > 0 else 1
    M = x.numel() // K if K else math.prod(shape[:-1])
    x2 = x.reshape(M, K).float()
    seg = _segments(x2, granularity, group_size)
    if scale is None:
        s, zp = compute_scale(seg, fmt, symmetric)
    else:
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).reshape(-1)
        zp = None if symmetric else torch.as_tensor(zero_point, device=x.device).reshape(-1).to(torch.int32)
    q = quantize_values(seg, s, zp, fmt, symmetric)
    q = _unsegment(q, granularity, M, K)
    if fmt.is_float:
        data = q.reshape(shape)
    elif fmt.bits == 4:
        data = pack_int4(q).reshape(*shape[:-1], K // 2)
    else:
        data = q.to(fmt.storage_dtype(symmetric)).reshape(shape)
    sshape = scale_shape(granularity, shape, group_size)
    s = s.reshape(sshape)
    zp = zp.reshape(sshape) if zp is not None else None
    return data, s, zp


def dequantize(data: torch.Tensor, scale: torch.Tensor, zero_point, shape, dtype: str, granularity: str,
               group_size: int = 128, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    fmt = get_format(dtype)
    K = shape[-1]
    M = math.prod(shape[:-1])
    if fmt.bits == 4:
        q = unpack_int4(data, signed=zero_point is None).to(torch.float32)
    else:
        q = data.to(torch.float32)
    seg = _segments(q.reshape(M, K), granularity, group_size)
    s = scale.reshape(-1, 1).float()
    if zero_point is not None:
        seg = seg - zero_point.reshape(-1, 1).float()
    out = _unsegment(seg * s, granularity, M, K)
    return out.reshape(shape).to(out_dtype)


# ---------------------------------------------------------------------------------------------
# int4 packing


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[..., K] integers -> uint8 [..., K // 2]: element 2i in the low nibble, 2i+1 in the high one.
    Only the low 4 bits of each value are kept."""
    v = q.to(torch.int16) & 0xF
    return (v[..., 0::2] | (v[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor, signed: bool = True) -> torch.Tensor:
    """uint8 [..., K // 2] -> [..., K]: int8 in [-8, 7] if signed, else uint8 in [0, 15]."""
    p = packed.to(torch.int16)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    v = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    if signed:
        return torch.where(v >= 8, v - 16, v).to(torch.int8)
    return v.to(torch.uint8)


# ---------------------------------------------------------------------------------------------
# GEMMs

ACTIVATIONS = (None, "relu", "gelu", "silu")


def activation(x: torch.Tensor, act: str | None) -> torch.Tensor:
    if act is None:
        return x
    if act == "relu":
        return torch.relu(x)
    if act == "gelu":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if act == "silu":
        return torch.nn.functional.silu(x)
    raise ValueError(act)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int32 product of integer matrices [M, K] @ [K, N] (computed in int64, on any device)."""
    return (a.to(torch.int64).cpu() @ b.to(torch.int64).cpu()).to(torch.int32).to(a.device)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a=None, scale_b=None, scale_c: float = 1.0, bias=None,
              act: str | None = None, out_dtype=torch.float16, compute_dtype=torch.float64) -> torch.Tensor:
    """(a @ b) * scale_a * scale_b * scale_c (+ bias), activation, cast. a: [M, K], b: [K, N] (int8 or
    fp8); scale_a: scalar or [M]/[M, 1]; scale_b: scalar or [N]/[1, N]. Computed in `compute_dtype`."""
    a2 = a.reshape(-1, a.shape[-1])
    acc = a2.to(compute_dtype) @ b.to(compute_dtype)
    if scale_a is not None:
        sa = torch.as_tensor(scale_a, device=a.device).to(compute_dtype)
        acc = acc * (sa.reshape(-1, 1) if sa.numel() > 1 else sa.reshape(()))
    if scale_b is not None:
        sb = torch.as_tensor(scale_b, device=a.device).to(compute_dtype)
        acc = acc * (sb.reshape(1, -1) if sb.numel() > 1 else sb.reshape(()))
    acc = acc * scale_c
    if bias is not None:
        acc = acc + bias.to(compute_dtype)
    return activation(acc, act).to(out_dtype).reshape(*a.shape[:-1], b.shape[-1])


def int4_mm(a_packed: torch.Tensor, b_packed: torch.Tensor) -> torch.Tensor:
    """Exact int32 product of signed int4 operands packed along K: a [M, K/2], b [N, K/2] -> [M, N]."""
    return int_mm(unpack_int4(a_packed, True), unpack_int4(b_packed, True).t())


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias=None, act_scale=None,
                dtype: str = "int8", x_scale=None, out_dtype=None) -> torch.Tensor:
    """Per-token dynamic (or static per-tensor) activation quantization, then the scaled GEMM with the
    dequantized-product epilogue in fp32, output in x's dtype. Pre-quantized x (int8 / e4m3 codes):
    its per-row scales x_scale are used as they are and the output is out_dtype (default fp16)."""
    fmt = "int8" if dtype == "int8" else "fp8_e4m3"
    if x_scale is not None:
        q, s = x, x_scale.reshape(-1)
        out_dtype = out_dtype or torch.float16
    elif act_scale is None:
        q, s, _ = quantize(x, fmt, "row")
    else:
        q, s, _ = quantize(x, fmt, "tensor", scale=act_scale)
    return scaled_mm(q, w_q.t(), s, w_scale, 1.0, bias, None, out_dtype or x.dtype, torch.float32)


# ---------------------------------------------------------------------------------------------
# weight-only (W4A16 / W8A16): layout in packed_weight.py


WO_CHUNK = 64   # 4-bit weight codes are packed in chunks of 64 k-values (see pack_weight_codes)


def pack_weight_codes(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes [N, K] -> the kernel layout. 8-bit: uint8 [N, K] as is. 4-bit: uint8 [N, Kp / 2]
    with K padded with zero codes to Kp, a multiple of 64; byte j of chunk c holds k = 64 c + j in its
    low nibble and k = 64 c + 32 + j in its high nibble. (So a kernel unpacks a byte tile into two
    [rows, 32] tiles of consecutive k with no interleaving.)"""
    if bits == 8:
        return u.to(torch.uint8)
    N, K = u.shape
    Kp = -(-K // WO_CHUNK) * WO_CHUNK
    v = torch.zeros((N, Kp), dtype=torch.int16, device=u.device)
    v[:, :K] = u.to(torch.int16) & 0xF
    v = v.reshape(N, Kp // WO_CHUNK, 2, WO_CHUNK // 2)
    return (v[:, :, 0] | (v[:, :, 1] << 4)).to(torch.uint8).reshape(N, Kp // 2)


def unpack_weight_codes(qweight: torch.Tensor, bits: int, K: int) -> torch.Tensor:
    """Inverse of pack_weight_codes: uint8 codes [N, K]."""
    if bits == 8:
        return qweight
    N = qweight.shape[0]
    b = qweight.to(torch.int16).reshape(N, -1, 1, WO_CHUNK // 2)
    v = torch.cat([b & 0xF, (b >> 4) & 0xF], dim=2)
    return v.reshape(N, -1)[:, :K].to(torch.uint8)


def weight_only_dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros, bits: int, group_size: int, K: int,
                           perm=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[N, K] weight in input-channel order: W[n, perm[k]] = (u[n, k] - z[n, k // G]) * s[n, k // G]
    in fp32 (z = 2**(bits - 1) when zeros is None), then cast to dtype."""
    u = unpack_weight_codes(qweight, bits, K).to(torch.float32)
    G = K if group_size == PER_CHANNEL else group_size
    s = scales.to(torch.float32).repeat_interleave(G, dim=1)[:, :K]
    z = (zeros.to(torch.float32).repeat_interleave(G, dim=1)[:, :K] if zeros is not None
         else torch.full_like(u, float(2 ** (bits - 1))))
    w = (u - z) * s
    if perm is not None:
        out = torch.empty_like(w)
        out[:, perm] = w
        w = out
    return w.to(dtype)


def weight_only_linear(x: torch.Tensor, qweight, scales, zeros, bits: int, group_size: int, perm=None,
                       bias=None) -> torch.Tensor:
    """x [..., K] @ dequant(W).T (+ bias), computed in fp32, output in x's dtype."""
    w = weight_only_dequantize(qweight, scales, zeros, bits, group_size, x.shape[-1], perm)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def w4a8_linear(x: torch.Tensor, qweight, scales, zeros, group_size: int, perm=None, bias=None) -> torch.Tensor:
    """W4A8-FP8: x [..., K] quantized per token to float8_e4m3fn (quantize(x, "fp8_e4m3", "row")), times the
    dequantized 4-bit weight (weight_only_dequantize: (u - z) * s exactly in fp32), in fp32, times the tokens'
    scales (+ bias), output in x's dtype. act-order (perm): x is gathered into the codes' order first."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if perm is not None:
        x2 = x2[:, perm]
    q, sx, _ = quantize(x2, "fp8_e4m3", "row")
    w = weight_only_dequantize(qweight, scales, zeros, 4, group_size, K)
    y = (q.to(torch.float32) @ w.t()) * sx.reshape(-1, 1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).reshape(*x.shape[:-1], -1)


# ---------------------------------------------------------------------------------------------
# collectives (ops/collective.py)


def all_reduce_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """The all-reduce every rank gets from its ranks' tensors `parts` (in rank order): the fp32 sum in rank order,
    rounded once to their dtype."""
    acc = torch.zeros(parts[0].shape, dtype=torch.float32, device=parts[0].device)
    for p in parts:
        acc += p.to(torch.float32)
    return acc.to(parts[0].dtype)


def all_reduce_rms_norm(parts: list[torch.Tensor], residual: torch.Tensor, weight, eps: float, quantize_to=None,
                        compute_dtype=torch.float32):
    """A tensor-parallel block's all-reduce and the norm after it: rms_norm(all_reduce_sum(parts), weight, eps,
    residual, quantize_to) -> (y,) or (codes, scales), then h = the reduced sum + residual."""
    return rms_norm(all_reduce_sum(parts), weight, eps, residual, quantize_to, compute_dtype)


# ---------------------------------------------------------------------------------------------
# fused LLM blocks (ops/fused.py). Arithmetic in fp32 (fp64 when compute_dtype says so), one
# rounding to x's dtype at the end. With `quantize`, the rounded output is quantized per row
# exactly as quantize(y, fmt, "row") does (the kernels match that bit for bit).

NORM_QUANT_FORMATS = {"int8": "int8", "fp8_e4m3": "fp8_e4m3"}


def _add_residual(x: torch.Tensor, residual):
    """x + residual as an eager op computes it: in fp32, rounded once to x's dtype."""
    if residual is None:
        return x
    return (x.float() + residual.float()).to(x.dtype)


def _finish(y: torch.Tensor, dtype: torch.dtype, quantize_to):
    y = y.to(dtype)
    if quantize_to is None:
        return (y,)
    q, s, _ = quantize(y, NORM_QUANT_FORMATS[quantize_to], "row")
    return q, s


def rms_norm(x: torch.Tensor, weight, eps: float, residual=None, quantize_to=None,
             compute_dtype=torch.float32):
    """h = x (+ residual); y = h * rsqrt(mean(h^2) + eps) * weight, computed in compute_dtype and
    rounded to x's dtype. Returns (y,) or (codes, scales) with quantize_to, plus h when residual is
    given."""
    h = _add_residual(x, residual)
    hf = h.to(compute_dtype)
    rstd = 1.0 / torch.sqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    y = hf * rstd
    if weight is not None:
        y = y * weight.to(compute_dtype)
    out = _finish(y, x.dtype, quantize_to)
    return out + (h,) if residual is not None else out


def layer_norm(x: torch.Tensor, weight, bias, eps: float, residual=None, quantize_to=None,
               compute_dtype=torch.float32):
    """h = x (+ residual); y = (h - mean) * rsqrt(var + eps) * weight + bias (biased variance)."""
    h = _add_residual(x, residual)
    hf = h.to(compute_dtype)
    d = hf - hf.mean(-1, keepdim=True)
    y = d * (1.0 / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + eps))
    if weight is not None:
        y = y * weight.to(compute_dtype)
    if bias is not None:
        y = y + bias.to(compute_dtype)
    out = _finish(y, x.dtype, quantize_to)
    return out + (h,) if residual is not None else out


def silu_and_mul(gate_up: torch.Tensor, quantize_to=None, compute_dtype=torch.float32):
    """SwiGLU on the concatenated projection [..., 2I]: silu(gate_up[..., :I]) * gate_up[..., I:]."""
    g, u = gate_up.to(compute_dtype).chunk(2, dim=-1)
    return _finish(g * torch.sigmoid(g) * u, gate_up.dtype, quantize_to)


def softmax(x: torch.Tensor, dim: int = -1, scale: float = 1.0, causal: bool = False,
            compute_dtype=torch.float32) -> torch.Tensor:
    """softmax(x * scale) along `dim` in compute_dtype, cast to x's dtype. causal (dim = -1, x at
    least 2-D [..., Lq, Lk]): query i sees keys j <= i + (Lk - Lq). Rows with no finite logit (all
    -inf or all masked) give zeros, not NaN; a NaN or +inf logit gives NaN in its row (as torch)."""
    s = x.to(compute_dtype) * scale
    if causal:
        lq, lk = s.shape[-2], s.shape[-1]
        i = torch.arange(lq, device=x.device).unsqueeze(1)
        j = torch.arange(lk, device=x.device).unsqueeze(0)
        s = s.masked_fill(j > i + (lk - lq), float("-inf"))
    dead = (s == float("-inf")).all(dim=dim, keepdim=True)
    y = torch.softmax(s, dim=dim)
    return torch.where(dead, torch.zeros_like(y), y).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# decoder attention: rotary embedding + KV-cache write, decode attention (models/)
#
# Rotary embedding, the "rotate half" convention of Llama / Qwen checkpoints in Hugging Face form:
# a head vector x of D = 2h elements is split into x1 = x[:h], x2 = x[h:]; at position p with angles
# a_i = p * inv_freq_i (cos / sin tables [positions, h], fp32):
#   out[:h] = x1 * cos - x2 * sin,   out[h:] = x2 * cos + x1 * sin        (fp32, one rounding)
# Optional per-head RMSNorm before rotation (Qwen3's q_norm / k_norm): x * rsqrt(mean(x^2) + eps) * w.


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """inv_freq_i = theta^(-2i / D), i < D / 2 (fp64 -> fp32), with the "llama3" frequency scaling of
    Llama 3.1+ checkpoints when `scaling` says so (rope_type / type "llama3"); "default" / None: none."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv.float()
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: default, llama3)")
    factor = scaling["factor"]
    lo, hi = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - lo) / (hi - lo)
    scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
    mid = (wavelen <= old_len / lo) & (wavelen >= old_len / hi)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).float()


def rope_tables(inv_freq: torch.Tensor, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_positions, D / 2] fp32 of p * inv_freq (the product in fp32, as HF computes it)."""
    p = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    ang = p[:, None] * inv_freq.float()[None, :]
    return torch.cos(ang), torch.sin(ang)


def mrope_tables(inv_freq: torch.Tensor, positions: torch.Tensor, section) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved multimodal rotary tables (Qwen3-VL): positions [3, N] (temporal, height, width) -> cos, sin
    [N, D / 2] fp32. Frequency i takes the height position where i % 3 == 1 and i < 3 section[1], the width position
    where i % 3 == 2 and i < 3 section[2], the temporal one elsewhere; for text (three equal positions) a row is
    rope_tables' row at that position."""
    ang = positions.float()[:, :, None] * inv_freq.float()[None, None, :]          # [3, N, D / 2]
    mixed = ang[0].clone()
    for axis in (1, 2):
        idx = slice(axis, 3 * section[axis], 3)
        mixed[:, idx] = ang[axis][:, idx]
    return torch.cos(mixed), torch.sin(mixed)


def _head_norm(x: torch.Tensor, weight, eps: float) -> torch.Tensor:
    if weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on x [..., D], cos / sin [..., D / 2] against its halves: (x1 c - x2 s, x2 c + x1 s)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def qkv_rope_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int, n_kv_heads: int,
                   q_norm=None, k_norm=None, eps: float = 1e-6, rope_positions=None) -> torch.Tensor:
    """Split the merged projection qkv [B, T, (H + 2 Hkv) D] into heads, (optionally RMS-normalize q and k
    per head,) rotate q and k by the rows `rope_positions` [B, T] of cos / sin (default: `positions`), write k
    and v into the caches [B, Hkv, S, D] at `positions` [B, T] (in place) and return the rotated q [B, T, H, D]
    in qkv's dtype."""
    B, T, _ = qkv.shape
    D = k_cache.shape[-1]
    x = qkv.float().reshape(B, T, n_heads + 2 * n_kv_heads, D)
    q, k, v = x.split([n_heads, n_kv_heads, n_kv_heads], dim=2)
    rp = (positions if rope_positions is None else rope_positions).long()
    c, s = cos[rp][:, :, None, :], sin[rp][:, :, None, :]
    q = rotate(_head_norm(q, q_norm, eps), c, s)
    k = rotate(_head_norm(k, k_norm, eps), c, s)
    b = torch.arange(B, device=qkv.device)[:, None].expand(B, T)
    k_cache[b, :, positions.long()] = k.to(k_cache.dtype)     # [B, T, Hkv, D] into [B, Hkv, S, D]
    v_cache[b, :, positions.long()] = v.to(v_cache.dtype)
    return q.to(qkv.dtype)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One query per sequence: q [B, H, D] attends to the first lengths[b] keys of the cache [B, Hkv, S, D]
    (head h reads KV head h // (H / Hkv)); softmax in fp32; output [B, H, D] in q's dtype."""
    B, H, D = q.shape
    G = H // k_cache.shape[1]
    k = k_cache.float().repeat_interleave(G, dim=1)
    v = v_cache.float().repeat_interleave(G, dim=1)
    s = torch.einsum("bhd,bhsd->bhs", q.float(), k) * scale
    live = torch.arange(k.shape[2], device=q.device)[None, :] < lengths.long()[:, None]
    s = s.masked_fill(~live[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhs,bhsd->bhd", p, v).to(q.dtype)

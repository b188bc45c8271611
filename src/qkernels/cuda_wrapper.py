"""The Python interface of the kernel-library guide (docs/guide/index.md), on qkernels' kernels.

The guide's snippets run as written with `from cuda_wrapper import ...` changed to `from qkernels.cuda_wrapper
import ...` (tests/test_cuda_wrapper.py runs each of them). Where the guide contradicts itself this module takes the
reading under which the guide's own code computes what it says:

- `int8_matmul` returns int32, as the guide's "Output: C [M×N] int32" and its snippets (which dequantize C with
  scale_a * scale_b) have it. scale_a and scale_b are the factors of C's real value, C * scale_a * scale_b ≈
  (A * scale_a) @ (B * scale_b); scale_c, the guide's output scale, multiplies the exact product in the int32
  result (rounded half to even, saturated); 1.0, the guide's own value everywhere, leaves it exact.
- B is [K, N] as the guide's "Kernel Details" say. The guide's QuantizedLinear passes an nn.Linear weight [N, K]
  instead; a B that cannot be [K, N] but is [N, K] is taken as that weight (its transpose), so the layer computes
  x @ W.T as its float path does. A square weight cannot be told from a [K, N] matrix and is read as [K, N]: give
  the guide's layer in_features != out_features, or pass the weight transposed.
- INT4: two signed 4-bit values per byte, the lower 4 bits first, A_packed [M, ceil(K / 2)] packed along its
  rows and B_packed [ceil(K / 2), N] packed along its columns (byte (i, n) holds B[2i, n] and B[2i + 1, n]);
  an odd K pads the last byte's upper nibble, which never enters the product.
"""
from __future__ import annotations

import math
import numbers

import torch

from ._runtime import check_tensor
from .ops import gemm as _gemm
from .ops import quant as _quant

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1

__all__ = ["quantize_tensor", "dequantize_tensor", "int8_matmul", "quantize_tensor_int4", "pack_int4",
           "unpack_int4", "int4_matmul"]


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor symmetric int8: (q int8 with x's shape, scale as a 0-d float32 tensor); x ≈ q * scale."""
    return _quant.quantize_tensor(x)


def dequantize_tensor(q: torch.Tensor, scale) -> torch.Tensor:
    """q * scale as float32. q: int8 codes (from quantize_tensor) or the int32 result of int8_matmul / int4_matmul
    (then scale = scale_a * scale_b); scale: a number or a one-element tensor."""
    check_tensor("q", q, dtypes=(torch.int8, torch.int32), ndim_min=1)
    if q.dtype == torch.int8:
        return _quant.dequantize_tensor(q, scale)
    _scale("scale", scale)
    s = scale.detach().reshape(()).to(q.device, torch.float32) if isinstance(scale, torch.Tensor) else float(scale)
    return q.float() * s


def int8_matmul(A: torch.Tensor, B: torch.Tensor, scale_a=1.0, scale_b=1.0, scale_c=1.0) -> torch.Tensor:
    """int8 A [M, K] @ int8 B [K, N] -> int32 C [M, N]: the exact product times scale_c (rounded half to even and
    saturated to int32 where scale_c != 1). C * scale_a * scale_b ≈ (A * scale_a) @ (B * scale_b) * scale_c.
    B may also be an nn.Linear weight [N, K] (N != K): see the module's notes. Scales: numbers or one-element
    tensors, finite and > 0 (scale_a / scale_b on a GPU are not read back: they do not enter C)."""
    check_tensor("A", A, dtypes=(torch.int8,))
    check_tensor("B", B, dtypes=(torch.int8,))
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"A and B must be 2-D, got A {tuple(A.shape)} and B {tuple(B.shape)}")
    b = _as_kn("B", B, A.shape[1])
    _scale("scale_a", scale_a)
    _scale("scale_b", scale_b)
    sc = _scale("scale_c", scale_c, read=True)
    c = _gemm.int8_matmul(A, b)
    return c if sc == 1.0 else _requantize(c, sc)


def quantize_tensor_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor symmetric int4 (codes in [-8, 7], scale = absmax / 7), packed along the last dim:
    (uint8 [..., ceil(K / 2)], scale as a 0-d float32 tensor); x ≈ unpack_int4(packed, K) * scale."""
    check_tensor("x", x, ndim_min=1)
    if x.shape[-1] % 2:     # a zero column: no change to the scale, a zero code in the padding nibble
        x = torch.cat([x, x.new_zeros(*x.shape[:-1], 1)], dim=-1)
    qt = _quant.quantize(x, "int4", "tensor")
    return qt.data, qt.scale


def pack_int4(q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Signed 4-bit integers (int8 in [-8, 7]) two per byte along `dim`, the lower 4 bits first: [.., K, ..] ->
    uint8 [.., ceil(K / 2), ..] (an odd K: the last byte's upper nibble is 0)."""
    check_tensor("q", q, dtypes=(torch.int8,), ndim_min=1)
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"q must hold int4 values in [-8, 7], got values in [{int(q.min())}, {int(q.max())}]")
    dim = _dim("dim", dim, q.dim())
    k = q.shape[dim]
    qm = q.movedim(dim, -1)
    if k % 2:
        qm = torch.cat([qm, qm.new_zeros(*qm.shape[:-1], 1)], dim=-1)
    return _quant.pack_int4(qm.contiguous()).movedim(-1, dim).contiguous()


def unpack_int4(packed: torch.Tensor, k: int, dim: int = -1) -> torch.Tensor:
    """Inverse of pack_int4: uint8 [.., ceil(k / 2), ..] -> int8 [.., k, ..] in [-8, 7]."""
    check_tensor("packed", packed, dtypes=(torch.uint8,), ndim_min=1)
    dim = _dim("dim", dim, packed.dim())
    if not isinstance(k, int) or k < 0 or (k + 1) // 2 != packed.shape[dim]:
        raise ValueError(f"k must be an int with ceil(k / 2) = packed.shape[{dim}] = {packed.shape[dim]}, got {k!r}")
    q = _quant.unpack_int4(packed.movedim(dim, -1).contiguous(), signed=True)
    return q[..., :k].movedim(-1, dim).contiguous()


def int4_matmul(A_packed: torch.Tensor, B_packed: torch.Tensor, K: int) -> torch.Tensor:
    """Exact int32 product of signed int4 A [M, K] and B [K, N] in the guide's packed layout: A_packed [M,
    ceil(K / 2)] (packed along rows), B_packed [ceil(K / 2), N] (packed along columns) -> int32 C [M, N]."""
    check_tensor("A_packed", A_packed, dtypes=(torch.uint8,))
    check_tensor("B_packed", B_packed, dtypes=(torch.uint8,))
    if A_packed.dim() != 2 or B_packed.dim() != 2:
        raise ValueError(f"A_packed and B_packed must be 2-D, got {tuple(A_packed.shape)} and "
                         f"{tuple(B_packed.shape)}")
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be a positive int, got {K!r}")
    half = (K + 1) // 2
    if A_packed.shape[1] != half or B_packed.shape[0] != half:
        raise ValueError(f"A_packed must be [M, ceil(K / 2) = {half}] and B_packed [{half}, N] for K = {K}, got "
                         f"{tuple(A_packed.shape)} and {tuple(B_packed.shape)}")
    a = A_packed
    if K % 2:       # the padding nibble of A's last byte out of the product, whatever B holds there
        a = A_packed.clone()
        a[:, -1] &= 0x0F
    return _gemm.int4_matmul(a.contiguous(), B_packed.t().contiguous(), 2 * half)


def _as_kn(name: str, b: torch.Tensor, k: int) -> torch.Tensor:
    """b as the [K, N] operand: b itself when its rows are K, else its transpose when its columns are (an
    nn.Linear weight [N, K])."""
    if b.shape[0] == k:
        return b
    if b.shape[1] == k:
        return b.t()
    raise ValueError(f"{name} must be [K, N] (or an nn.Linear weight [N, K]) with K = {k} (A's columns), got shape "
                     f"{tuple(b.shape)}")


def _scale(name: str, s, read: bool = False) -> float | None:
    """Check a scale: a real number or a one-element tensor, finite and > 0. Its value is read (and returned) where
    that costs no device round trip (a number, a CPU tensor) or where `read` asks for it; else None."""
    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got shape {tuple(s.shape)}")
        if not read and s.device.type != "cpu":
            return None
        v = float(s)
    elif isinstance(s, numbers.Real) and not isinstance(s, bool):
        v = float(s)
    else:
        raise TypeError(f"{name} must be a number or a one-element tensor, got {type(s).__name__}")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be finite and > 0, got {v}")
    return v


def _requantize(c: torch.Tensor, scale_c: float) -> torch.Tensor:
    """rint(c * scale_c) saturated to int32 (the product in float64: exact for every int32 c)."""
    return torch.round(c.double() * scale_c).clamp(INT32_MIN, INT32_MAX).to(torch.int32)


def _dim(name: str, dim, ndim: int) -> int:
    if not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"{name} must be an int in [{-ndim}, {ndim}), got {dim!r}")
    return dim % ndim

"""One table of every public op, shared by the reliability tests (shape grid, views, determinism,
batch invariance, torch.compile and CUDA graphs).

Each OpSpec builds its inputs for a case (M rows, a width K, sometimes N) and runs the op. The
first argument is the activation-like input `x` that the view tests re-lay-out; the op's result
must not depend on x's layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

import qkernels as qk

from ..conftest import DEVICE, ON_GPU

FP8_OK = not ON_GPU or torch.cuda.get_device_capability() >= (8, 9)


@dataclass(frozen=True)
class OpSpec:
    name: str
    make: Callable[[int, int, int], tuple]      # (M, K, N) -> args (args[0] is x)
    run: Callable[..., object]                    # run(*args) -> tensor or tuple of tensors
    ks: tuple[int, ...] = (33, 255, 513, 1025)   # widths this op takes (odd where it may)
    n: int = 40                                   # output width for GEMMs
    exact_batch: bool = True                      # row m's result independent of M (see RELIABILITY.md)
    needs_fp8: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)
    like_x: tuple[int, ...] = ()                  # other args of x's shape, re-laid-out with it


def _f16(*shape, scale=2.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(torch.float16)


def _i8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)


def _weight(N, K, bits, gs, sym):
    return qk.PackedWeight.from_float(_f16(N, K, scale=0.05), bits, gs, sym)


def _qt(qt) -> tuple:
    return tuple(t for t in (qt.data, qt.scale, qt.zero_point) if t is not None)


def _ql(K, N, scheme):
    lin = torch.nn.Linear(K, N, device=DEVICE, dtype=torch.float16)
    return qk.QuantizedLinear.from_linear(lin, scheme)


OPS = [
    OpSpec("quantize_int8_row", lambda M, K, N: (_f16(M, K),),
           lambda x: _qt(qk.quantize(x, "int8", "row"))),
    OpSpec("quantize_int4_group", lambda M, K, N: (_f16(M, K),),
           lambda x: _qt(qk.quantize(x, "int4", "group", group_size=32, symmetric=False)), ks=(64, 288)),
    OpSpec("quantize_fp8_row", lambda M, K, N: (_f16(M, K),),
           lambda x: _qt(qk.quantize(x, "fp8_e4m3", "row"))),
    OpSpec("quantize_int8_tensor", lambda M, K, N: (_f16(M, K),),
           lambda x: _qt(qk.quantize(x, "int8", "tensor")), exact_batch=False, tags=("whole-tensor",)),
    OpSpec("quantize_int8_column", lambda M, K, N: (_f16(M, K),),
           lambda x: _qt(qk.quantize(x, "int8", "column")), exact_batch=False, tags=("whole-tensor",)),
    OpSpec("dequantize_int8_row", lambda M, K, N: (_f16(M, K),),
           lambda x: qk.quantize(x, "int8", "row").dequantize(torch.float16)),
    OpSpec("pack_unpack_int4", lambda M, K, N: (torch.randint(-8, 8, (M, K), dtype=torch.int8, device=DEVICE),),
           lambda q: (qk.pack_int4(q), qk.unpack_int4(qk.pack_int4(q))), ks=(34, 256)),
    OpSpec("int8_matmul", lambda M, K, N: (_i8(M, K), _i8(N, K).t()), lambda a, b: qk.int8_matmul(a, b)),
    OpSpec("int8_matmul_epilogue", lambda M, K, N: (_i8(M, K), _i8(N, K).t(), torch.rand(N, device=DEVICE)),
           lambda a, b, sb: qk.int8_matmul(a, b, 0.01, sb, bias=None, activation="silu", out_dtype=torch.float16)),
    OpSpec("fp8_matmul", lambda M, K, N: (_f16(M, K).to(torch.float8_e4m3fn), _f16(N, K).to(torch.float8_e4m3fn).t(),
                                          torch.rand(N, device=DEVICE)),
           lambda a, b, sb: qk.fp8_matmul(a, b, 0.5, sb, out_dtype=torch.bfloat16), needs_fp8=True),
    OpSpec("int4_matmul", lambda M, K, N: (qk.pack_int4(torch.randint(-8, 8, (M, K), dtype=torch.int8, device=DEVICE)),
                                           qk.pack_int4(torch.randint(-8, 8, (N, K), dtype=torch.int8, device=DEVICE)), K),
           lambda a, b, k: qk.int4_matmul(a, b, k), ks=(34, 256)),
    OpSpec("w8a8_linear", lambda M, K, N: (_f16(M, K), _ql(K, N, "w8a8")),
           lambda x, ql: ql(x)),
    OpSpec("w8a8_fp8_linear", lambda M, K, N: (_f16(M, K), _ql(K, N, "w8a8-fp8")),
           lambda x, ql: ql(x), needs_fp8=True, exact_batch=False, tags=("M-dispatch: cuBLAS at prefill sizes",)),
    OpSpec("w4a16_linear", lambda M, K, N: (_f16(M, K), _weight(N, K, 4, 32, False)),
           lambda x, w: qk.w4a16_linear(x, w), ks=(64, 288), exact_batch=False, tags=("M-dispatch",)),
    OpSpec("w8a16_linear", lambda M, K, N: (_f16(M, K), _weight(N, K, 8, -1, True)),
           lambda x, w: qk.w8a16_linear(x, w), exact_batch=False, tags=("M-dispatch",)),
    OpSpec("rms_norm_int8", lambda M, K, N: (_f16(M, K), _f16(K), _f16(M, K)),
           lambda x, w, r: qk.rms_norm(x, w, residual=r, quantize="int8"), like_x=(2,)),
    OpSpec("layer_norm", lambda M, K, N: (_f16(M, K), _f16(K), _f16(K)),
           lambda x, w, b: qk.layer_norm(x, w, b)),
    OpSpec("silu_and_mul_fp8", lambda M, K, N: (_f16(M, 2 * K),),
           lambda x: qk.silu_and_mul(x, quantize="fp8_e4m3")),
    OpSpec("softmax_causal", lambda M, K, N: (_f16(M, K),),
           lambda x: qk.softmax(x, scale=0.3, causal=True), exact_batch=False, tags=("causal: row i depends on M",)),
]
OPS_BY_NAME = {o.name: o for o in OPS}


def available(spec: OpSpec) -> bool:
    return FP8_OK or not spec.needs_fp8


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


# ---------------------------------------------------------------------------------------------
# layouts of x with the same values


def relayout(x: torch.Tensor, how: str) -> torch.Tensor:
    """x's values in another layout: "sliced" (row stride > width, storage offset 1: unaligned),
    "offset" (contiguous at an odd storage offset), "transposed" (unit row stride), "3d"."""
    M, K = x.shape
    if how == "sliced":
        buf = torch.zeros(M, K + 7, dtype=x.dtype, device=x.device)
        buf[:, 1:K + 1] = x
        return buf[:, 1:K + 1]
    if how == "offset":
        buf = torch.zeros(M * K + 3, dtype=x.dtype, device=x.device)
        buf[3:] = x.reshape(-1)
        return buf[3:].view(M, K)
    if how == "transposed":
        return x.t().contiguous().t()
    if how == "3d":
        return x.reshape(1, M, K)
    raise ValueError(how)


LAYOUTS = ("sliced", "offset", "transposed", "3d")


def relayout_args(spec: OpSpec, args: tuple, how: str) -> tuple:
    return tuple(relayout(a, how) if i == 0 or i in spec.like_x else a for i, a in enumerate(args))

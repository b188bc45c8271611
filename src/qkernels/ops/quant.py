"""Quantize / dequantize / int4 pack launchers: validate -> allocate -> launch.

Kernels: kernels/_quant.py. Numerics: reference.py (bit-exact twin). Each public op is a
torch.library custom op with a fake implementation, so it traces under torch.compile.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch

from .. import reference as ref
from .._runtime import (FLOAT_DTYPES, alloc, call_op, capability, cdiv, check_kernel_device, check_same_device,
                        check_tensor, is_interpreter, launch, next_pow2, num_sms, pdl_options, register_twin,
                        scoped_update)
from ..formats import GRANULARITIES, get_format


@dataclass
class QuantizedTensor:
    """Result of `qkernels.quantize`.

    data:        codes. int8 (symmetric int8), uint8 (asymmetric int8), uint8 packed two per byte along
                 the last dim (int4; even index in the low nibble), or torch.float8_e4m3fn / e5m2.
    scale:       float32; shape () for "tensor", (*lead, 1) for "row", (K,) for "column",
                 (*lead, K // group_size) for "group".
    zero_point:  int32 with the scale's shape (asymmetric), else None.
    shape:       logical shape of the original tensor (data's last dim is half of it for int4).
    """

    data: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    shape: torch.Size
    dtype: str
    granularity: str
    group_size: int | None = None

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize(self, dtype)

    def __repr__(self) -> str:
        gs = f", group_size={self.group_size}" if self.granularity == "group" else ""
        return (f"QuantizedTensor(shape={tuple(self.shape)}, dtype={self.dtype!r}, granularity={self.granularity!r}"
                f"{gs}, symmetric={self.symmetric}, device={self.data.device})")


@functools.cache
def _kq():
    """The kernel module, imported at the first launch: Triton fixes interpreter-or-GPU when a
    kernel is decorated, so importing qkernels must not decorate anything yet."""
    from ..kernels import _quant
    return _quant


# Tile sizes of these memory-bound kernels, in elements per program, and warps (one place;
# scripts/tune_quant.py sweeps them; values from an H100 sweep, docs/design/quantize.md).
# flat: per-tensor kernel; seg: row / group kernel (rows longer than seg_max_block take two passes).
TILES = {"flat_min": 2048, "flat_max": 2048, "flat_warps": 8,
         "seg_tile_row": 8192, "seg_tile_group": 4096, "seg_warps": 4, "seg_max_block": 16384, "seg_warps_max": 16}


@contextlib.contextmanager
def tiles(**overrides):
    """Scoped override of TILES (scripts/tune_quant.py sweeps them); the plans made from them are redone."""
    with scoped_update(TILES, overrides, "tile"):
        _segment_plan.cache_clear()
        try:
            yield
        finally:
            _segment_plan.cache_clear()

_GRAN_ID = {"tensor": 0, "row": 1, "column": 2, "group": 3}


@functools.cache
def _format_constexprs(dtype: str, symmetric: bool, fp8_emulate: bool) -> dict:
    """The kernels' format constexprs (one dict per format: callers only read it)."""
    fmt = get_format(dtype)
    qmin, qmax = (0, 0) if fmt.is_float else fmt.qrange(symmetric)
    return dict(
        QMIN=qmin, QMAX=qmax, QSYM=fmt.q_sym, IS_FP8=fmt.is_float, FP_MAX=fmt.fp_max,
        FP8_MAN=3 if dtype == "fp8_e4m3" else 2, FP8_BIAS=7 if dtype == "fp8_e4m3" else 15,
        FP8_EMULATE=fp8_emulate, SYMMETRIC=symmetric, PACK4=fmt.bits == 4,
    )


@functools.cache
def _fp8_emulate(device: torch.device) -> bool:
    return is_interpreter() or capability(device) < (8, 9)


def _warps(elements: int) -> int:
    return 2 if elements <= 1024 else 4 if elements <= 4096 else 8 if elements <= 8192 else 16


# ---------------------------------------------------------------------------------------------
# validation


def _as_2d(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    if x.dim() == 2:
        M, K = x.shape
        return x, M, K
    K = x.shape[-1]
    M = math.prod(x.shape[:-1])
    return x.reshape(M, K), M, K


def _validate_quantize(x, dtype, granularity, group_size, symmetric, scale, zero_point):
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim_min=1)
    check_kernel_device("x", x)
    fmt = get_format(dtype)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if fmt.is_float and not symmetric:
        raise ValueError(f"dtype {dtype!r} supports symmetric quantization only, got symmetric=False")
    K = x.shape[-1]
    if granularity == "group":
        if not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if K % group_size:
            raise ValueError(f"x's last dim must be divisible by group_size={group_size}, got K={K}")
        if fmt.bits == 4 and group_size % 2:
            raise ValueError(f"int4 packs pairs within a group: group_size must be even, got {group_size}")
    if fmt.bits == 4 and K % 2:
        raise ValueError(f"int4 packs two values per byte along the last dim: it must be even, got K={K}")
    if scale is None:
        if zero_point is not None:
            raise ValueError("zero_point was given without scale: give both (static) or neither (dynamic)")
        return fmt, None, None
    M = math.prod(x.shape[:-1])
    n = ref.num_segments(granularity, M, K, group_size)
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float32, device=x.device)
    check_tensor("scale", scale, dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64))
    check_same_device("x", x, scale=scale)
    if scale.numel() != n:
        raise ValueError(f"scale for granularity={granularity!r} must have {n} element(s) "
                         f"(shape {ref.scale_shape(granularity, x.shape, group_size)}), got shape {tuple(scale.shape)}")
    scale = scale.reshape(-1).to(torch.float32).contiguous()
    if symmetric:
        if zero_point is not None:
            raise ValueError("zero_point must be None when symmetric=True")
        return fmt, scale, None
    if zero_point is None:
        raise ValueError("symmetric=False with a static scale needs zero_point too")
    if not isinstance(zero_point, torch.Tensor):
        zero_point = torch.tensor(int(zero_point), dtype=torch.int32, device=x.device)
    check_tensor("zero_point", zero_point, dtypes=(torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8))
    check_same_device("x", x, zero_point=zero_point)
    if zero_point.numel() != n:
        raise ValueError(f"zero_point must have {n} element(s) like scale, got shape {tuple(zero_point.shape)}")
    return fmt, scale, zero_point.reshape(-1).to(torch.int32).contiguous()


# ---------------------------------------------------------------------------------------------
# launch


def _launch_quantize(x, dtype, granularity, group_size, symmetric, scale, zero_point):
    """x: float [*, K]; scale/zero_point: flat (static) or None (dynamic).
    Returns data, flat scale, flat zero point (empty int32 when symmetric)."""
    kq = _kq()
    fmt = get_format(dtype)
    dev = x.device
    x2, M, K = _as_2d(x)
    pack4 = fmt.bits == 4
    data = alloc((M, K // 2 if pack4 else K), fmt.storage_dtype(symmetric), dev)
    static = scale is not None
    nseg = ref.num_segments(granularity, M, K, group_size)
    if not static:
        scale = alloc((nseg,), torch.float32, dev)
        zero_point = None if symmetric else alloc((nseg,), torch.int32, dev)
    zp_out = zero_point if zero_point is not None else alloc((0,), torch.int32, dev)
    if x.numel() == 0:
        if not static and nseg:
            scale.fill_(1.0)
            if zero_point is not None:
                zero_point.fill_(fmt.qrange(False)[0])
        return data, scale, zp_out
    meta = _format_constexprs(dtype, symmetric, _fp8_emulate(dev))
    q_arg = data.view(torch.uint8) if fmt.is_float else data
    zp_arg = zero_point if zero_point is not None else scale   # never read when symmetric

    if granularity in ("row", "group"):
        seg = K if granularity == "row" else group_size
        grid, tiles = _segment_plan(granularity, nseg, seg)
        launch(kq._quantize_segments_kernel, grid,
            x2, q_arg, scale, zp_arg, nseg, seg, K // seg, x2.stride(0), x2.stride(1), data.stride(0),
            STATIC=static, **tiles, **meta, **pdl_options(x2.device))
    elif granularity == "column":
        block_k = 64 if K >= 64 else max(2, next_pow2(K))
        block_m = 64 if M >= 64 else next_pow2(M)
        launch(kq._quantize_columns_kernel, (cdiv(K, block_k),),
            x2, q_arg, scale, zp_arg, M, K, x2.stride(0), x2.stride(1), data.stride(0),
            STATIC=static, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=4, **meta)
    else:   # tensor
        xf = x2.contiguous().view(-1)
        n = xf.numel()
        block = _flat_block(n, dev)
        partials, nparts, p_block = scale, 1, 1
        if not static:
            nparts = min(cdiv(n, 8192), 8 if is_interpreter() else 512)
            chunk = cdiv(cdiv(n, nparts), 2048) * 2048
            nparts = cdiv(n, chunk)
            partials = torch.empty(nparts * (1 if symmetric else 2), dtype=torch.float32, device=dev)
            launch(kq._stats_partials_kernel, (nparts,), xf, partials, n, chunk, nparts, SYMMETRIC=symmetric,
                   BLOCK=2048, num_warps=8)
            p_block = next_pow2(nparts)
        launch(kq._quantize_flat_kernel, (cdiv(n, block),),
            xf, q_arg.view(-1), scale, zp_arg, partials, n, nparts,
            STATIC=static, BLOCK=block, P_BLOCK=p_block, num_warps=min(TILES["flat_warps"], _warps(block)), **meta)
    return data, scale, zp_out


@functools.lru_cache(maxsize=4096)
def _segment_plan(granularity: str, nseg: int, seg: int) -> tuple[tuple, dict]:
    """Grid and tiles of the row / group quantize kernel (worked out once per shape: eager calls repeat them)."""
    block_s = max(2, min(next_pow2(seg), TILES["seg_max_block"]))
    tile = TILES["seg_tile_row" if granularity == "row" else "seg_tile_group"]
    block_r = max(1, min(tile // block_s, next_pow2(nseg)))
    warps = TILES["seg_warps"] if block_r * block_s <= tile else TILES["seg_warps_max"]
    return (cdiv(nseg, block_r),), dict(BLOCK_R=block_r, BLOCK_S=block_s, ONE_CHUNK=seg <= block_s, num_warps=warps)


def _flat_block(n: int, device: torch.device) -> int:
    """Elements per program for flat elementwise kernels: enough programs to fill the GPU
    (about 4 per SM), 1K..8K elements each."""
    if is_interpreter():
        return max(2, min(next_pow2(n), 1 << 16))
    per_prog = n // (4 * num_sms(device))
    return max(TILES["flat_min"], min(TILES["flat_max"], next_pow2(max(per_prog, 1))))


# ---------------------------------------------------------------------------------------------
# custom ops


def _quantize_dynamic(x: torch.Tensor, dtype: str, granularity: str, group_size: int,
                      symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_quantize(x, dtype, granularity, group_size, symmetric, None, None)


def _quantize_static(x: torch.Tensor, dtype: str, granularity: str, group_size: int, symmetric: bool,
                     scale: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    return _launch_quantize(x, dtype, granularity, group_size, symmetric, scale, zero_point)[0]


_quantize_dynamic_op = torch.library.custom_op("qkernels::quantize_dynamic", mutates_args=())(_quantize_dynamic)
_quantize_static_op = torch.library.custom_op("qkernels::quantize_static", mutates_args=())(_quantize_static)


def _quantize_twin(x, dtype, granularity, group_size, symmetric, scale=None, zero_point=None):
    """reference.quantize in the custom ops' layouts: 2-D codes, flat scales and zero points (empty: symmetric)."""
    fmt = get_format(dtype)
    _, M, _ = _as_2d(x)
    data, s, zp = ref.quantize(x, dtype, granularity, group_size, symmetric, scale, zero_point)
    if fmt.bits != 4:
        data = data.to(fmt.storage_dtype(symmetric))
    zp = zp.reshape(-1).to(torch.int32) if zp is not None else torch.empty(0, dtype=torch.int32, device=x.device)
    return data.reshape(M, -1), s.reshape(-1).to(torch.float32), zp


register_twin(_quantize_dynamic_op, _quantize_twin)
register_twin(_quantize_static_op, lambda *args: _quantize_twin(*args)[0])


@_quantize_dynamic_op.register_fake
def _(x, dtype, granularity, group_size, symmetric):
    fmt = get_format(dtype)
    K = x.shape[-1]
    M = x.numel() // K if K else math.prod(x.shape[:-1])
    n = ref.num_segments(granularity, M, K, group_size)
    data = x.new_empty((M, K // 2 if fmt.bits == 4 else K), dtype=fmt.storage_dtype(symmetric))
    zp = x.new_empty((0 if symmetric else n,), dtype=torch.int32)
    return data, x.new_empty((n,), dtype=torch.float32), zp


@_quantize_static_op.register_fake
def _(x, dtype, granularity, group_size, symmetric, scale, zero_point):
    fmt = get_format(dtype)
    K = x.shape[-1]
    M = x.numel() // K if K else math.prod(x.shape[:-1])
    return x.new_empty((M, K // 2 if fmt.bits == 4 else K), dtype=fmt.storage_dtype(symmetric))


def _launch_dequantize(data: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, shape: list[int],
                       dtype: str, granularity: str, group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    kq = _kq()
    fmt = get_format(dtype)
    dev = data.device
    K = shape[-1]
    M = math.prod(shape[:-1])
    out = alloc((M, K), out_dtype, dev)
    if out.numel() == 0:
        return out.reshape(shape)
    q2 = data.reshape(M, K // 2 if fmt.bits == 4 else K)
    if q2.stride(1) != 1:
        q2 = q2.contiguous()
    if fmt.is_float:
        q2 = q2.view(torch.uint8)
    meta = _format_constexprs(dtype, zero_point is None, _fp8_emulate(dev))
    block_k = min(256, max(2, next_pow2(K)))
    block_m = max(1, min(4096 // block_k, next_pow2(M)))
    grid = (cdiv(M, block_m), cdiv(K, block_k))
    G = K // group_size if granularity == "group" else 1
    launch(kq._dequantize_kernel, grid,
        q2, scale, zero_point if zero_point is not None else scale, out, M, K,
        group_size if granularity == "group" else 1, G, q2.stride(0), out.stride(0),
        GRAN=_GRAN_ID[granularity], HAS_ZP=zero_point is not None, IS_INT4=meta["PACK4"], IS_FP8=meta["IS_FP8"],
        FP8_MAN=meta["FP8_MAN"], FP8_BIAS=meta["FP8_BIAS"], FP8_EMULATE=meta["FP8_EMULATE"],
        BLOCK_M=block_m, BLOCK_K=block_k, num_warps=4)
    return out.reshape(shape)


_dequantize_op = torch.library.custom_op("qkernels::dequantize", mutates_args=())(_launch_dequantize)


register_twin(_dequantize_op, ref.dequantize)


@_dequantize_op.register_fake
def _(data, scale, zero_point, shape, dtype, granularity, group_size, out_dtype):
    return data.new_empty(shape, dtype=out_dtype)


# ---------------------------------------------------------------------------------------------
# public API


def quantize(x: torch.Tensor, dtype: str, granularity: str = "tensor", *, group_size: int = 128,
             symmetric: bool = True, scale=None, zero_point=None) -> QuantizedTensor:
    """Quantize `x` (fp32/fp16/bf16, any shape; leading dims are rows, the last dim is the row).

    dtype: "int8", "int4", "fp8_e4m3", "fp8_e5m2". granularity: "tensor", "row", "column" or
    "group" (`group_size` consecutive elements of a row). Dynamic (scales computed in the kernel;
    per-row in one pass) unless `scale` (and, asymmetric, `zero_point`) are given. Numerics and
    layouts: qkernels.reference.
    """
    fmt, scale_flat, zp_flat = _validate_quantize(x, dtype, granularity, group_size, symmetric, scale, zero_point)
    gs = group_size if granularity == "group" else 0
    sshape = ref.scale_shape(granularity, x.shape, group_size)
    dshape = (*x.shape[:-1], x.shape[-1] // 2) if fmt.bits == 4 else tuple(x.shape)
    if scale_flat is None:
        data, s, zp = call_op(_quantize_dynamic_op, _quantize_dynamic, x, dtype, granularity, gs, symmetric)
        zp = None if symmetric else zp.reshape(sshape)
        s = s.reshape(sshape)
    else:
        data = call_op(_quantize_static_op, _quantize_static, x, dtype, granularity, gs, symmetric, scale_flat,
                       zp_flat)
        s = scale_flat.reshape(sshape)
        zp = None if zp_flat is None else zp_flat.reshape(sshape)
    return QuantizedTensor(data.reshape(dshape), s, zp, x.shape, dtype, granularity,
                           group_size if granularity == "group" else None)


def dequantize(qt: QuantizedTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(q - zero_point) * scale in fp32, cast to `dtype` (fp32, fp16 or bf16)."""
    if not isinstance(qt, QuantizedTensor):
        raise TypeError(f"qt must be a QuantizedTensor, got {type(qt).__name__}")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of float32, float16, bfloat16, got {dtype}")
    check_kernel_device("qt.data", qt.data)
    check_same_device("qt.data", qt.data, **{"qt.scale": qt.scale, "qt.zero_point": qt.zero_point})
    fmt = get_format(qt.dtype)
    want = fmt.storage_dtype(qt.symmetric)
    if qt.data.dtype != want:
        raise TypeError(f"qt.data must be {want} for dtype={qt.dtype!r} (symmetric={qt.symmetric}), got {qt.data.dtype}")
    K = qt.shape[-1]
    M = math.prod(qt.shape[:-1])
    gs = qt.group_size or 0
    n = ref.num_segments(qt.granularity, M, K, gs)
    if qt.scale.numel() != n:
        raise ValueError(f"qt.scale must have {n} element(s) for granularity={qt.granularity!r}, "
                         f"got shape {tuple(qt.scale.shape)}")
    scale = qt.scale.reshape(-1).to(torch.float32).contiguous()
    zp = None if qt.zero_point is None else qt.zero_point.reshape(-1).to(torch.int32).contiguous()
    return call_op(_dequantize_op, _launch_dequantize, qt.data, scale, zp, list(qt.shape), qt.dtype, qt.granularity,
                   gs, dtype)


def quantize_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor symmetric int8: returns (q int8 with x's shape, scale as a 0-d float32 tensor)."""
    qt = quantize(x, "int8", "tensor")
    return qt.data, qt.scale


def dequantize_tensor(q: torch.Tensor, scale) -> torch.Tensor:
    """Inverse of quantize_tensor: q.float() * scale, as float32."""
    check_tensor("q", q, dtypes=(torch.int8,), ndim_min=1)
    if not isinstance(scale, torch.Tensor):
        scale = torch.tensor(float(scale), dtype=torch.float32, device=q.device)
    if scale.numel() != 1:
        raise ValueError(f"scale must have one element (per-tensor), got shape {tuple(scale.shape)}")
    return dequantize(QuantizedTensor(q, scale.reshape(()).float(), None, q.shape, "int8", "tensor"))


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    kq = _kq()
    qc = q.contiguous()
    out = alloc((*q.shape[:-1], q.shape[-1] // 2), torch.uint8, q.device)
    if out.numel():
        block = 1024 if not is_interpreter() else max(2, min(next_pow2(out.numel()), 1 << 15))
        launch(kq._pack_int4_kernel, (cdiv(out.numel(), block),), qc, out, out.numel(), BLOCK=block, num_warps=4)
    return out


_pack_int4_op = torch.library.custom_op("qkernels::pack_int4", mutates_args=())(_pack_int4)


register_twin(_pack_int4_op, ref.pack_int4)


@_pack_int4_op.register_fake
def _(q):
    return q.new_empty((*q.shape[:-1], q.shape[-1] // 2), dtype=torch.uint8)


def _unpack_int4(packed: torch.Tensor, signed: bool) -> torch.Tensor:
    kq = _kq()
    pc = packed.contiguous()
    out = alloc((*packed.shape[:-1], packed.shape[-1] * 2), torch.int8 if signed else torch.uint8, packed.device)
    if out.numel():
        block = 1024 if not is_interpreter() else max(1, min(next_pow2(pc.numel()), 1 << 15))
        launch(kq._unpack_int4_kernel, (cdiv(pc.numel(), block),), pc, out, pc.numel(), SIGNED=signed,
               BLOCK=block, num_warps=4)
    return out


_unpack_int4_op = torch.library.custom_op("qkernels::unpack_int4", mutates_args=())(_unpack_int4)


register_twin(_unpack_int4_op, ref.unpack_int4)


@_unpack_int4_op.register_fake
def _(packed, signed):
    return packed.new_empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.int8 if signed else torch.uint8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit integers two per uint8 along the last dim (element 2i in the low nibble).
    q: int8/uint8/int16/int32 [..., K], K even; values in [-8, 7] or [0, 15] (only the low 4 bits
    of each value are kept)."""
    check_tensor("q", q, dtypes=(torch.int8, torch.uint8, torch.int16, torch.int32), ndim_min=1)
    check_kernel_device("q", q)
    if q.shape[-1] % 2:
        raise ValueError(f"q's last dim must be even to pack two values per byte, got {q.shape[-1]}")
    return call_op(_pack_int4_op, _pack_int4, q)


def unpack_int4(packed: torch.Tensor, signed: bool = True) -> torch.Tensor:
    """uint8 [..., K // 2] -> [..., K]: int8 in [-8, 7] (signed) or uint8 in [0, 15]."""
    check_tensor("packed", packed, dtypes=(torch.uint8,), ndim_min=1)
    check_kernel_device("packed", packed)
    return call_op(_unpack_int4_op, _unpack_int4, packed, bool(signed))

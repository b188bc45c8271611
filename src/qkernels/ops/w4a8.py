"""W4A8-FP8 linear: 4-bit weights as W4A16 stores them (PackedWeight), activations quantized per token to
float8_e4m3fn, the product on FP8 tensor cores (kernels/_w4a8.py; numerics there). Reference:
reference.w4a8_linear.

One op (qkernels::w4a8_linear): the per-token quantization of x (ops.quant.quantize, "fp8_e4m3", "row"), then the
GEMM with the group scales and zero points applied per group in fp32. Tile configs: `config=` (tests, tuners), else
DEFAULT_CONFIGS by M. GPUs without FP8 tensor cores (compute capability < 8.9) refuse it, naming the GPU.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import configs
from .. import reference as ref
from .._runtime import (alloc, capability, call_op, cdiv, check_kernel_device, check_same_device, check_tensor,
                        device_name, ensure_context, gpu_slug, is_interpreter, k_splits, lacks_fp8, launch, next_pow2,
                        pdl_options, register_twin, splitk_scratch)
from ..packed_weight import PackedWeight
from ..schemes import PER_CHANNEL
from .quant import quantize

X_DTYPES = (torch.float16, torch.bfloat16)
# M bucket (next power of two, at most 256) -> tile config. SPLIT_K with MIN_PROGRAMS: K split (in whole groups)
# only while the grid has fewer programs than that.
DEFAULT_CONFIGS = {   # SWAP: the weight tile as the MMA's M side (H200 sweep, benchmarks/logs/tune_w4a8_h200.log)
    16: dict(BLOCK_M=16, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=4, MIN_PROGRAMS=528, SWAP=True),
    32: dict(BLOCK_M=32, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=4, MIN_PROGRAMS=528, SWAP=True),
    64: dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=4, MIN_PROGRAMS=528, SWAP=True),
    128: dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=4, MIN_PROGRAMS=528),
    256: dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, num_warps=4, num_stages=3, SPLIT_K=4, MIN_PROGRAMS=528),
}
# Hopper: the Gluon FP8 wgmma kernel (kernels/_w4a8_wg.py; "path": "wg"), for integer zero points; the Triton
# config under "fallback" runs where it does not (other GPUs, float zero points). BLOCK_N: 64 per warpgroup. WS: a
# producer warp issues the copies (then "maxnreg" caps the registers, which it otherwise takes all of: one program
# an SM). CPG: 64-k chunks per accumulator promotion (2: once per 128-k group; needs STAGES >= 4, and runs as 1
# where the group is 64).
WG_CONFIGS = {
    16: dict(path="wg", BLOCK_M=16, BLOCK_N=64, GROUP_M=8, STAGES=4, num_warps=4, SPLIT_K=4, MIN_PROGRAMS=528),
    32: dict(path="wg", BLOCK_M=32, BLOCK_N=64, GROUP_M=8, STAGES=4, num_warps=4, SPLIT_K=4, MIN_PROGRAMS=528),
    64: dict(path="wg", BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=6, num_warps=4, SPLIT_K=4, MIN_PROGRAMS=528,
             CPG=2),
    128: dict(path="wg", BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=4, num_warps=4, SPLIT_K=4, MIN_PROGRAMS=264),
    256: dict(path="wg", BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8, SPLIT_K=2, MIN_PROGRAMS=264),
}
_KERNEL = {}


def _kernel(path: str):
    if path not in _KERNEL:      # imported on first use: `import qkernels` compiles and touches nothing
        if path == "wg":
            from ..kernels._w4a8_wg import _w4a8_wg_kernel as k
        else:
            from ..kernels._w4a8 import _w4a8_kernel as k
        _KERNEL[path] = k
    return _KERNEL[path]


def _bucket(M: int) -> int:
    return min(max(next_pow2(M), 16), 256)


def config_for(M: int, device: torch.device | None = None, N: int | None = None, K: int | None = None) -> dict:
    """The tile config of a call: on a GPU with a "w4a8-fp8" table (configs/<gpu>.json) its entry for the M bucket
    and shape (N, K); else on Hopper the wgmma kernel's bucket config (with its Triton fallback), elsewhere the
    Triton kernel's."""
    bucket = _bucket(M)
    entry = _table_entry(bucket, N, K, device)
    if entry is not None:
        return dict(entry, fallback=DEFAULT_CONFIGS[bucket])
    if device is not None and device.type == "cuda" and capability(device) == (9, 0):
        return dict(WG_CONFIGS[bucket], fallback=DEFAULT_CONFIGS[bucket])
    return DEFAULT_CONFIGS[bucket]


@functools.cache
def _table_entry(bucket: int, N: int | None, K: int | None, device: torch.device | None) -> dict | None:
    if device is None or device.type != "cuda" or is_interpreter() or N is None:
        return None
    table = configs.load(gpu_slug(device_name(device))).get("w4a8-fp8")
    return configs.lookup(table, bucket, N, K) if table else None


def prefers_w4a16(M: int, N: int, K: int, device: torch.device) -> bool:
    """Whether this GPU's table says W4A16's kernels (fp16 activations, the same stored weight) ran this shape and
    M faster than any W4A8 config measured: a w4a8-fp8 layer then runs them (QuantizedLinear)."""
    entry = _table_entry(_bucket(M), N, K, device)
    return bool(entry and entry.get("W4A16"))


def wg_runs(device: torch.device, int_zeros: bool) -> bool:
    """Whether the Gluon wgmma kernel runs: sm_90, integer zero points (-z as an exact e4m3 tile), no interpreter."""
    return (device.type == "cuda" and not is_interpreter() and torch.version.hip is None
            and capability(device) == (9, 0) and int_zeros)


@functools.cache
def _wg_layouts():
    """TensorDescriptor and the shared layouts of its blocks: x (e4m3) 64-byte swizzled, as the wgmma's B operand
    reads it; code bytes unswizzled. Built once: the launcher runs per call."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor, gl.NVMMASharedLayout(64, 8, rank=2), gl.NVMMASharedLayout(0, 8, rank=2)


def _run_wg(xq, xs, qweight, scale_zero, bias, group_size, out, cfg) -> torch.Tensor:
    M, K = xq.shape
    N = qweight.shape[0]
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    cpg = cfg.get("CPG", 1)
    if K % (64 * cpg) or (group_size != PER_CHANNEL and group_size % (64 * cpg)) or cfg["STAGES"] < 2 * cpg:
        cpg = 1         # a promotion unit spans whole groups, the ring two units
    split = k_splits(cfg.get("SPLIT_K", 1), K // (64 * cpg), tiles, cfg.get("MIN_PROGRAMS"))
    ws, cnt = (out, out) if split == 1 else splitk_scratch(out.device, split * M * N, tiles)
    pdl = pdl_options(out.device) if cfg.get("PDL", True) else {}
    desc, xl, wl = _wg_layouts()
    ensure_context(out.device)
    x_desc = desc.from_tensor(xq, [cfg["BLOCK_M"], 64], xl)
    w_desc = desc.from_tensor(qweight, [cfg["BLOCK_N"], 32], wl)
    launch(_kernel(cfg["path"]), (tiles, split), x_desc, w_desc, xs, scale_zero, bias if bias is not None else out,
           out, M, N, K, scale_zero.stride(0) // 2, out.stride(0), ws, cnt, GROUP=group_size,
           HAS_BIAS=bias is not None, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], GROUP_M=cfg["GROUP_M"],
           STAGES=cfg["STAGES"], SPLIT_K=split, CPG=cpg, WS=cfg.get("WS", False), num_warps=cfg["num_warps"],
           **({"maxnreg": cfg["maxnreg"]} if "maxnreg" in cfg else {}), **pdl)
    return out


def _run(xq: torch.Tensor, xs: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor,
         bias: torch.Tensor | None, group_size: int, out: torch.Tensor, cfg: dict, int_zeros: bool) -> torch.Tensor:
    if cfg.get("path") == "wg":
        if wg_runs(out.device, int_zeros) and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0:
            return _run_wg(xq, xs, qweight, scale_zero, bias, group_size, out, cfg)
        cfg = cfg.get("fallback") or DEFAULT_CONFIGS[_bucket(xq.shape[0])]
    M, K = xq.shape
    N = qweight.shape[0]
    group = 64 if group_size == PER_CHANNEL else group_size     # per channel: one scale word, promoted every 64 k
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    split = k_splits(cfg.get("SPLIT_K", 1), K // group, tiles, cfg.get("MIN_PROGRAMS"))
    ws, cnt = (out, out) if split == 1 else splitk_scratch(out.device, split * M * N, tiles)
    pdl = pdl_options(out.device) if cfg.get("PDL", True) else {}
    launch(_kernel("triton"), (tiles, split), xq.view(torch.uint8), xs, qweight, scale_zero,
           bias if bias is not None else out, out, ws, cnt, M, N, K, xq.stride(0), qweight.stride(0),
           scale_zero.stride(0) // 2, out.stride(0),
           GROUP=group, HAS_BIAS=bias is not None, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
           GROUP_M=cfg["GROUP_M"], PER_CHANNEL=group_size == PER_CHANNEL, SWAP=cfg.get("SWAP", False), SPLIT_K=split, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl)
    return out


def _w4a8_impl(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor, bias: torch.Tensor | None,
               group_size: int, int_zeros: bool = False) -> torch.Tensor:
    """x [M, K] (fp16 / bf16), qweight / scale_zero contiguous in the 4-bit PackedWeight layout."""
    M, K = x.shape
    N = qweight.shape[0]
    if scale_zero.data_ptr() % 4 or not scale_zero.is_contiguous():
        scale_zero = scale_zero.contiguous().clone()   # the kernel reads each (scale, zero) as one 32-bit word
    out = alloc((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return out
    q = quantize(x, "fp8_e4m3", "row")
    return _run(q.data, q.scale.reshape(M), qweight, scale_zero, bias, group_size, out,
                _forced[0] or config_for(M, x.device, N, K), int_zeros)


_w4a8_op = torch.library.custom_op("qkernels::w4a8_linear", mutates_args=())(_w4a8_impl)


def _w4a8_twin(x, qweight, scale_zero, bias, group_size, int_zeros=False):
    return ref.w4a8_linear(x, qweight, scale_zero[..., 0], scale_zero[..., 1], group_size, None, bias)


register_twin(_w4a8_op, _w4a8_twin)


@_w4a8_op.register_fake
def _(x, qweight, scale_zero, bias, group_size, int_zeros=False):
    return x.new_empty((x.shape[0], qweight.shape[0]))


_forced: list = [None]


class use_config:
    """with use_config(cfg): every w4a8_linear call runs tile config cfg (tests and tuners)."""

    def __init__(self, cfg: dict):
        self.cfg = cfg

    def __enter__(self):
        self.prev, _forced[0] = _forced[0], self.cfg

    def __exit__(self, *exc):
        _forced[0] = self.prev


def fp8_capable(device: torch.device) -> bool:
    """FP8 tensor cores: compute capability >= 8.9 (Ada, Hopper and later); the interpreter emulates them (unless
    an older capability is simulated)."""
    return not lacks_fp8(device)


def w4a8_linear(x: torch.Tensor, w_packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = quant_fp8(x) @ W.T (+ bias) with W a 4-bit PackedWeight (group-wise with a group size a multiple of 64,
    or per channel; symmetric or with zero points; act-order) and x (float16 / bfloat16 [..., K]) quantized per
    token to float8_e4m3fn inside the call; output in x's dtype."""
    if not isinstance(w_packed, PackedWeight):
        raise TypeError(f"w_packed must be a qkernels.PackedWeight, got {type(w_packed).__name__}")
    if w_packed.bits != 4:
        raise ValueError(f"w4a8_linear needs a 4-bit PackedWeight, got bits={w_packed.bits}")
    check_tensor("x", x, dtypes=X_DTYPES, ndim_min=1)
    check_kernel_device("x", x)
    N, K = w_packed.shape
    check_same_device("x", x, w_packed=w_packed.qweight, bias=bias)
    if x.shape[-1] != K:
        raise ValueError(f"x's last dim must be the weight's in_features K={K}, got x.shape={tuple(x.shape)}")
    if K % 64:
        raise ValueError(f"w4a8_linear needs in_features K a multiple of 64, got K={K}")
    if w_packed.group_size != PER_CHANNEL and w_packed.group_size % 64:
        raise ValueError(f"w4a8_linear needs group_size a multiple of 64 or -1 (per channel), got "
                         f"{w_packed.group_size}")
    if not fp8_capable(x.device):
        name = device_name(x.device)
        cc = ".".join(map(str, capability(x.device)))
        raise RuntimeError(f"w4a8_linear needs FP8 tensor cores (compute capability >= 8.9), got {name} "
                           f"(compute capability {cc}): use w4a16 there")
    if bias is not None:
        check_tensor("bias", bias, dtypes=X_DTYPES + (torch.float32,))
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    M = math.prod(x.shape[:-1])
    x2 = x.reshape(M, K)
    if w_packed.perm is not None:
        x2 = x2.index_select(1, w_packed.perm)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = call_op(_w4a8_op, _w4a8_impl, x2, w_packed.qweight.contiguous(), w_packed.scale_zero, bias,
                  w_packed.group_size, w_packed.int_zeros)
    return out.reshape(*x.shape[:-1], N)


__all__ = ["w4a8_linear", "use_config", "config_for", "DEFAULT_CONFIGS", "WG_CONFIGS", "fp8_capable", "wg_runs",
           "prefers_w4a16"]

"""Weight-only quantized linears: W4A16 and W8A16 (fp16 / bf16 activations, 4- or 8-bit weights).

One op, five paths picked by M from the per-GPU config table (configs/<gpu>.json, keys "w4a16" /
"w8a16", M-bucketed; defaults in configs/__init__.py): "gemv" (fp32 FMA reduction, decode), "tc" (Gluon
tensor-core kernel for M <= 16: 4-bit weights, groups of a multiple of 128 or per channel), "mm" (tensor
cores with in-register dequantization), "wg" (Gluon Hopper kernel: wgmma on in-register dequantized weights,
overlapped with the next tile's dequantization, x tiles of 8-256 rows; 4-bit weights, groups of a multiple of
64 or per channel) and "dequant" (dequantize to x's dtype, then cuBLAS). A "tc" or "wg" config carries a
"fallback" config for the cases its kernel does not run (other GPUs, group sizes, K).
SPLIT_K > 1 in a config splits K over programs when the grid is small; for "gemv", "tc" and "wg", K is split
up to SPLIT_K ways only while the grid has fewer than MIN_PROGRAMS programs; every kernel adds the partials up
itself (the last program of an output tile, in slice order).
On Hopper the GEMV is launched with programmatic dependent launch (_runtime.pdl_options): it fetches its first
weight step while the kernel before it finishes. The tensor-core kernels are not (docs/design.md: early-launched
programs of a one-wave GEMM crowd onto the SMs the kernel before leaves free).
Kernels: kernels/_weight_only.py, _weight_only_tc.py, _weight_only_wg.py. Reference: reference.weight_only_linear.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import autotune, configs
from .._runtime import (alloc, call_op, cdiv, check_kernel_device, check_same_device, check_tensor, device_name,
                        ensure_context, gpu_slug, is_interpreter, k_splits, launch, next_pow2, pdl_options,
                        scoped_value, tile_counters)
from ..packed_weight import PackedWeight

X_DTYPES = (torch.float16, torch.bfloat16)
# forced paths for tests: "*-splitk": K split 3 ways
PATHS = ("gemv", "mm", "dequant", "mm-splitk", "gemv-splitk", "tc", "tc-splitk", "wg", "wg-splitk")
# "tc" (kernels/_weight_only_tc.py, Gluon): 4-bit weights, K a multiple of TC_K, groups of a multiple of TC_K
# or per channel, CUDA GPUs of sm_80+. Elsewhere a "tc" config runs its "fallback" config.
TC_K = 128
TC_DEFAULT = dict(path="tc", BLOCK_N=64, BLOCK_M=8, num_warps=4, SPLIT_K=8, MIN_PROGRAMS=2048)
# "wg" (kernels/_weight_only_wg.py, Gluon, wgmma): 4-bit weights, K a multiple of WG_K, groups of a multiple
# of WG_K or per channel, sm_90 (Hopper) only.
WG_K = 64
WG_DEFAULT = dict(path="wg", BLOCK_M=256, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8)


def _kw():
    from ..kernels import _weight_only
    return _weight_only


def _kw_tc():
    from ..kernels import _weight_only_tc
    return _weight_only_tc


def _kw_wg():
    from ..kernels import _weight_only_wg
    return _weight_only_wg


def tc_supported(bits: int, K: int, group: int, qweight: torch.Tensor) -> bool:
    """Whether the Gluon tensor-core kernel runs this case: NVIDIA sm_80+ (mma.sync, cp.async); it has no
    interpreter twin (the Triton-language kernels are its CPU stand-ins). It reads code rows as 16-byte
    vectors: rows must be 16-byte aligned."""
    return (bits == 4 and K % TC_K == 0 and (group == K or group % TC_K == 0) and not is_interpreter()
            and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) >= (8, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


def wg_supported(bits: int, K: int, group: int, qweight: torch.Tensor) -> bool:
    """Whether the Gluon wgmma kernel runs this case: sm_90 (wgmma is Hopper's; no interpreter twin), code
    rows 16-byte aligned (TMA descriptors need 16-byte aligned bases and row strides)."""
    return (bits == 4 and K % WG_K == 0 and (group == K or group % WG_K == 0) and not is_interpreter()
            and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) == (9, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


# the Gluon paths: which cases their kernels run (elsewhere their configs' "fallback" runs)
_GLUON = {"tc": tc_supported, "wg": wg_supported}


@functools.cache
def _capability(device: torch.device) -> tuple:
    return torch.cuda.get_device_capability(device)


@functools.cache
def _config_bucket(bits: int, m_bucket: int, N: int, K: int, device: torch.device) -> dict | None:
    """The shipped config for this GPU, M bucket and shape (configs.lookup: a shape override if the table
    has one); None for a GPU without a table (autotuned)."""
    if is_interpreter():
        return configs.pick(configs.INTERPRETER_WEIGHT_ONLY, m_bucket)
    table = configs.load(gpu_slug(device_name(device))).get(f"w{bits}a16")
    return configs.lookup(table, m_bucket, N, K) if table else None


_FORCED_CONFIG: list = [None]    # set only inside use_config()


def config_for(bits: int, M: int, N: int, K: int, device: torch.device) -> dict | None:
    forced = _FORCED_CONFIG[0]
    if forced is not None:
        return forced
    return _config_bucket(bits, next_pow2(max(M, 1)), N, K, device)


def use_config(cfg: dict):
    """Every weight-only call inside the block runs `cfg` (a config-table entry, e.g. {"path": "gemv",
    "BLOCK_N": 16, ...}) whatever M and shape: the scoped override the tuner and profilers use."""
    if not isinstance(cfg, dict) or "path" not in cfg:
        raise ValueError(f"cfg must be a config-table entry with a 'path' key, got {cfg!r}")
    return scoped_value(_FORCED_CONFIG, cfg)


# (id(cfg), M, N, K, bits, group, has_bias, int_zeros) -> (cfg, launch plan); cfg kept alive: ids stay unique
_PLANS: dict = {}


def _plan(cfg: dict, M: int, N: int, K: int, bits: int, group: int, has_bias: bool, int_zeros: bool):
    """kernel, grid, split and constexprs of a gemv / mm launch: worked out once per shape and config, so
    an eager call does no dict building beyond the lookup."""
    key = (id(cfg), M, N, K, bits, group, has_bias, int_zeros)
    hit = _PLANS.get(key)
    if hit is not None:
        return hit[1]
    p = {k: v for k, v in cfg.items() if k not in ("path", "fallback")}
    if cfg["path"] not in _GLUON and p["BLOCK_K"] % 64:
        raise RuntimeError(f"weight-only config BLOCK_K={p['BLOCK_K']} must be a multiple of 64: {cfg}")
    split = int(p.pop("SPLIT_K", 1))
    if cfg["path"] in _GLUON:
        # K split up to SPLIT_K ways while the grid has fewer than MIN_PROGRAMS programs, in equal slices of
        # whole steps (none empty); the kernels add the partials up themselves
        tiles = cdiv(N, p["BLOCK_N"]) * cdiv(M, p["BLOCK_M"])
        split = k_splits(split, K // (TC_K if cfg["path"] == "tc" else WG_K), tiles, int(p.pop("MIN_PROGRAMS", 0)))
        constexprs = dict(GROUP=0 if group == K else group, HAS_BIAS=has_bias, INT_Z=int_zeros, SPLIT_K=split, **p)
        if cfg["path"] == "tc":
            grid = (cdiv(N, p["BLOCK_N"]), split, cdiv(M, p["BLOCK_M"]))
            return _keep_plan(key, cfg, (_kw_tc()._wo_tc_kernel, grid, split, constexprs))
        return _keep_plan(key, cfg, (_kw_wg()._wo_wg_kernel, (tiles, split), split, constexprs))
    if cfg["path"] == "gemv":
        # K is split only where the grid would leave SMs short of programs (long K, few rows: 4096 x 14336)
        split = k_splits(split, cdiv(K, p["BLOCK_K"]), cdiv(N, p["BLOCK_N"]) * M, int(p.pop("MIN_PROGRAMS", 0)))
        kernel, grid = _kw()._wo_gemv_kernel, (cdiv(N, p["BLOCK_N"]), M)
    else:
        split = k_splits(split, cdiv(K, p["BLOCK_K"]))
        kernel, grid = _kw()._wo_mm_kernel, (cdiv(N, p["BLOCK_N"]) * cdiv(M, p["BLOCK_M"]),)
    if split == 1:
        grid = grid + (1,)
    else:
        grid = (grid[0], grid[1], split) if cfg["path"] == "gemv" else (grid[0], split)
    constexprs = dict(BITS=bits, GROUP=0 if group == K else group, HAS_BIAS=has_bias,
                      EVEN_K=K % p["BLOCK_K"] == 0, SPLIT_K=split, **p)
    if cfg["path"] == "gemv":
        constexprs["INT_Z"] = int_zeros
    return _keep_plan(key, cfg, (kernel, grid, split, constexprs))


def _keep_plan(key, cfg, plan):
    if len(_PLANS) >= 4096:      # many distinct M (prefill lengths): start over rather than grow
        _PLANS.clear()
    _PLANS[key] = (cfg, plan)
    return plan


def _launch(x2, qweight, scale_zero, bias, out, bits, group, int_zeros, cfg):
    """out [M, N] written by one kernel. x2 rows are contiguous; scale_zero is [N, G, 2] contiguous, read as one
    32-bit word per group (stride in words: G). With split-K the kernels add the partials up themselves: an fp32
    workspace [split, M, N] and one counter per output tile (_runtime.tile_counters)."""
    M, K = x2.shape
    N = qweight.shape[0]
    kernel, grid, split, constexprs = _plan(cfg, M, N, K, bits, group, bias is not None, int_zeros)
    bias_arg = bias if bias is not None else scale_zero
    if split > 1:
        ws = torch.empty((split, M, N), dtype=torch.float32, device=x2.device)
        cnt = tile_counters(x2.device, grid[0] * grid[2] if cfg["path"] == "tc" else
                            grid[0] * grid[1] if cfg["path"] == "gemv" else grid[0])
    else:      # unused by the kernels: no workspace, no counter lookup on the per-call path
        ws = cnt = out
    if cfg["path"] == "tc":
        launch(kernel, grid, x2, qweight, scale_zero, bias_arg, out, M, N, K, x2.stride(0), qweight.stride(0),
               scale_zero.shape[1], out.stride(0), ws, cnt, **constexprs)
    elif cfg["path"] == "wg":
        # x and the code bytes through TMA descriptors (rows past M / N read as zeros); launch's cache key sees a
        # descriptor only by its class: its dtype follows out's, its blocks the constexprs
        x_desc, w_desc = _wg_descriptors(x2, qweight, constexprs["BLOCK_M"], constexprs["BLOCK_N"])
        launch(kernel, grid, x_desc, w_desc, scale_zero, bias_arg, out, M, N, K, scale_zero.shape[1], out.stride(0),
               ws, cnt, **constexprs)
    else:      # gemv / mm: only the GEMV starts early under PDL (it prefetches its first weight step)
        launch(kernel, grid, x2, qweight, scale_zero, bias_arg, out, ws, cnt, M, N, K, x2.stride(0),
               qweight.stride(0), scale_zero.shape[1], out.stride(0), **constexprs,
               **(pdl_options(x2.device) if cfg["path"] == "gemv" else {}))
    return out


@functools.cache
def _wg_layouts():
    """TensorDescriptor and the shared layouts of its two blocks: x 128-byte swizzled (wgmma's B operand as
    is), code bytes unswizzled. Built once: the launcher runs per call."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor, gl.NVMMASharedLayout(128, 16, rank=2), gl.NVMMASharedLayout(0, 8, rank=2)


def _wg_descriptors(x2, qweight, block_m: int, block_n: int):
    """TMA descriptors of x [M, K] (blocks [block_m, 64]) and of the code bytes [N, K / 2] (blocks
    [block_n, 32])."""
    desc, x_layout, w_layout = _wg_layouts()
    ensure_context(x2.device)
    return (desc.from_tensor(x2, [block_m, WG_K], x_layout),
            desc.from_tensor(qweight, [block_n, WG_K // 2], w_layout))


def _dequant_into(qweight, scale_zero, w, bits, group, cfg):
    N, K = w.shape
    p = {k: v for k, v in cfg.items() if k != "path"}
    g = 0 if group == K else group
    launch(_kw()._wo_dequant_kernel, (cdiv(N, p["BLOCK_N"]), cdiv(K, p["BLOCK_K"])),
           qweight, scale_zero, w, N, K, qweight.stride(0), scale_zero.shape[1], w.stride(0), BITS=bits, GROUP=g,
           EVEN_K=K % p["BLOCK_K"] == 0, **p)
    return w


# ---------------------------------------------------------------------------------------------
# custom op


def _weight_only_impl(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor,
                      bias: torch.Tensor | None, bits: int, group: int, int_zeros: bool, path: str) -> torch.Tensor:
    """x [M, K] with contiguous rows, qweight / scale_zero in the PackedWeight layout (contiguous),
    group: group length (K: per channel); int_zeros: every zero point an integer in [0, 2**bits]
    (PackedWeight.int_zeros: lets the kernels fold their conversion constant into them); path "" = pick by M
    from the config table."""
    M, K = x.shape
    N = qweight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()     # the kernels read x rows as contiguous runs (vector loads, async copies)
    if scale_zero.data_ptr() % 4 or not scale_zero.is_contiguous():
        scale_zero = scale_zero.contiguous().clone()   # the kernels read each (scale, zero) as one 32-bit word
    if M == 0 or N == 0 or K == 0:    # empty product: zeros (+ bias)
        out = torch.zeros((M, N), dtype=torch.float32, device=x.device)
        return (out + bias.float() if bias is not None else out).to(x.dtype)
    cfg = config_for(bits, M, N, K, x.device)
    if path:
        cfg = _path_config(cfg, path, bits, N, K, x.device)
    elif cfg is None:    # a GPU without a shipped table: tune once per (M bucket, N, K, group), cached on disk
        bucket = next_pow2(M)
        cfg = autotune.tuned(gpu_slug(device_name(x.device)), f"w{bits}a16:M{bucket}:N{N}:K{K}:g{group}",
                             configs.candidates(f"w{bits}a16", bucket, configs.DEFAULT_WEIGHT_ONLY),
                             functools.partial(_run_config, x, qweight, scale_zero, bias, bits, group, int_zeros))
    return _run_config(x, qweight, scale_zero, bias, bits, group, int_zeros, cfg)


def _run_config(x, qweight, scale_zero, bias, bits, group, int_zeros, cfg):
    M, K = x.shape
    N = qweight.shape[0]
    if cfg["path"] in _GLUON:
        if not _GLUON[cfg["path"]](bits, K, group, qweight):
            cfg = cfg.get("fallback") or configs.pick(configs.DEFAULT_WEIGHT_ONLY, next_pow2(M))
        elif x.data_ptr() % 16 or x.stride(0) % 8:
            x = x.clone(memory_format=torch.contiguous_format)    # x rows are read as 16-byte vectors too
    if cfg["path"] == "dequant":
        w = _dequant_into(qweight, scale_zero, torch.empty((N, K), dtype=x.dtype, device=x.device), bits, group,
                          cfg)
        # cuBLAS picks its kernel (and summation order) by layout: a row-sliced x must give the bits of
        # the contiguous x
        return torch.nn.functional.linear(x.contiguous(), w, bias.to(x.dtype) if bias is not None else None)
    return _launch(x, qweight, scale_zero, bias, alloc((M, N), x.dtype, x.device), bits, group, int_zeros, cfg)


def _path_config(cfg: dict, path: str, bits: int, N: int, K: int, device) -> dict:
    """The config of the first bucket whose path is `path` (tests use it to run every path at every M)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "mm-splitk":
        return dict(_path_config(cfg, "mm", bits, N, K, device), SPLIT_K=3)
    if path == "tc":
        return cfg if cfg is not None and cfg["path"] == "tc" else dict(TC_DEFAULT, fallback=_path_config(
            cfg, "gemv", bits, N, K, device))
    if path == "wg":
        return cfg if cfg is not None and cfg["path"] == "wg" else dict(WG_DEFAULT, fallback=_path_config(
            cfg, "mm", bits, N, K, device))
    if path in ("tc-splitk", "wg-splitk"):
        return dict(_path_config(cfg, path[:2], bits, N, K, device), SPLIT_K=3, MIN_PROGRAMS=1 << 30)
    if path == "gemv-splitk":
        return dict(_path_config(cfg, "gemv", bits, N, K, device), SPLIT_K=3, MIN_PROGRAMS=1 << 30)
    if cfg is not None and cfg["path"] == path:
        return cfg
    for m in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536):
        c = _config_bucket(bits, m, N, K, device)
        if c is not None and c["path"] == path:
            return c
    return configs.pick({k: v for k, v in configs.DEFAULT_WEIGHT_ONLY.items() if v["path"] == path}, 1)


_weight_only_op = torch.library.custom_op("qkernels::weight_only_linear", mutates_args=())(_weight_only_impl)


@_weight_only_op.register_fake
def _(x, qweight, scale_zero, bias, bits, group, int_zeros, path):
    return x.new_empty((x.shape[0], qweight.shape[0]))


# ---------------------------------------------------------------------------------------------
# public API


def _weight_only(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None, bits: int, name: str,
                 path: str = "") -> torch.Tensor:
    qweight = getattr(w, "qweight", None)
    if (w.__class__ is PackedWeight and w.bits == bits and bias is None and w.perm is None
            and x.__class__ is torch.Tensor and x.dim() == 2 and x.dtype in X_DTYPES and x.shape[1] == w.shape[1]
            and x.device == qweight.device            and (x.is_cuda or is_interpreter())):
        # the common call (2-D x, no bias, no act-order, where kernels run) validated in a few checks; anything
        # else goes through the full checks below, which name what is wrong
        return call_op(_weight_only_op, _weight_only_impl, x, qweight, w.scale_zero, None, bits, w.group_len,
                       w.int_zeros, path)
    if not isinstance(w, PackedWeight):
        raise TypeError(f"w_packed must be a qkernels.PackedWeight (see PackedWeight.from_float / from_gptq / "
                        f"from_awq), got {type(w).__name__}")
    if w.bits != bits:
        raise ValueError(f"{name} needs a {bits}-bit PackedWeight, got bits={w.bits} (use w{w.bits}a16_linear)")
    check_tensor("x", x, dtypes=X_DTYPES, ndim_min=1)
    check_kernel_device("x", x)
    N, K = w.shape
    check_same_device("x", x, w_packed=w.qweight, bias=bias)
    if x.shape[-1] != K:
        raise ValueError(f"x's last dim must be the weight's in_features K={K}, got x.shape={tuple(x.shape)}")
    if bias is not None:
        check_tensor("bias", bias, dtypes=X_DTYPES + (torch.float32,))
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    M = math.prod(x.shape[:-1])
    x2 = x.reshape(M, K)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    out = call_op(_weight_only_op, _weight_only_impl, x2, w.qweight, w.scale_zero, bias, bits, w.group_len,
                  w.int_zeros, path)
    return out.reshape(*x.shape[:-1], N)


def w4a16_linear(x: torch.Tensor, w_packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W a 4-bit PackedWeight (group-wise or per-channel, symmetric or with zero
    points, optionally act-ordered). x: float16 / bfloat16 [..., K]; output in x's dtype, fp32 accumulation."""
    return _weight_only(x, w_packed, bias, 4, "w4a16_linear")


def w8a16_linear(x: torch.Tensor, w_packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W an 8-bit PackedWeight (typically per output channel, group_size=-1).
    x: float16 / bfloat16 [..., K]; output in x's dtype, fp32 accumulation."""
    return _weight_only(x, w_packed, bias, 8, "w8a16_linear")

"""Launching the weight-only kernels (kernels/weight_only/) for a config that dispatch.py chose: a launch
plan per (config, shape) worked out once, split-K workspaces and tile counters, TMA descriptors for "wg"."""
from __future__ import annotations

import functools
import importlib

import torch

from ... import configs
from ..._runtime import alloc, cdiv, ensure_context, k_splits, launch, next_pow2, num_sms, pdl_options, splitk_scratch
from .dispatch import GV_K, GVT_K, SUPPORTED, TC_K, WG_K


@functools.cache
def _kernels(name: str):
    """kernels/weight_only/<name>.py, imported on first use (Gluon modules only where they run)."""
    return importlib.import_module(f"...kernels.weight_only.{name}", __package__)


# (id(cfg), M, N, K, bits, group_size, has_bias, int_zeros, swiglu, sms) -> (cfg, launch plan); cfg kept alive: ids
# stay unique
_PLANS: dict = {}
_GVP_MAX_BYTES = 2 ** 31     # the persistent GEMV's int32 word offsets: codes below this; larger weights take gv's grid


def _plan(cfg: dict, M: int, N: int, K: int, bits: int, group_size: int, has_bias: bool, int_zeros: bool,
          swiglu: bool = False, sms: int = 0):
    """kernel, grid, split, constexprs and scratch of a launch: worked out once per shape and config, so an eager
    call does no dict building beyond the lookup. swiglu: the GEMV's SWIGLU epilogue (fused_swiglu). scratch: None,
    or the split-K workspace's fp32 elements, its tile counters and the first split program (sms, the device's SM
    count: wg's TAIL sizes the last wave with it, gv's PERSISTENT its grid)."""
    key = (id(cfg), M, N, K, bits, group_size, has_bias, int_zeros, swiglu, sms)
    hit = _PLANS.get(key)
    if hit is not None:
        return hit[1]
    p = {k: v for k, v in cfg.items() if k not in ("path", "fallback", "PDL")}      # PDL: a launch option (_launch)
    if cfg["path"] != "wg" and ("TAIL" in p or "PER_SM" in p):
        raise RuntimeError(f"TAIL / PER_SM (the last wave split along K) are wg config keys: {cfg}")
    if p.get("XBAR") and (cfg["path"] != "wg" or p.get("WS")):
        raise RuntimeError(f"XBAR (x tiles on barriers of their own) is a wg config key, not with WS (the producer "
                           f"warp issues the copies there): {cfg}")
    # maxnreg in any config: a compile option passed through with the constexprs (registers per thread capped)
    if cfg["path"] not in SUPPORTED and p["BLOCK_K"] % 64:
        raise RuntimeError(f"weight-only config BLOCK_K={p['BLOCK_K']} must be a multiple of 64: {cfg}")
    split = int(p.pop("SPLIT_K", 1))
    if cfg["path"] != "gv" and "PERSISTENT" in p:
        raise RuntimeError(f"PERSISTENT (a grid of programs that each take an equal run of the work) is a gv config "
                           f"key: {cfg}")
    if cfg["path"] == "gv":
        # a thread holds WPT words of a chunk, 8 / WPT threads a chunk, so one step spans 4 WPT chunks per warp
        if p["WPT"] not in (1, 2, 4, 8) or p["BLOCK_K"] % (4 * p["WPT"] * p["num_warps"] * GV_K):
            raise RuntimeError(f"gv config needs WPT in (1, 2, 4, 8) and BLOCK_K a multiple of 256 x WPT x num_warps: "
                               f"{cfg}")
        per_sm = int(p.pop("PERSISTENT", 0))
        if "PERSISTENT" in cfg and (per_sm < 1 or split != 1 or "STAGES" in p or "MIN_PROGRAMS" in p):
            raise RuntimeError(f"gv PERSISTENT takes a number of programs per SM >= 1 and no SPLIT_K, MIN_PROGRAMS "
                               f"or STAGES: {cfg}")
        if per_sm and N * (K // 2) < _GVP_MAX_BYTES:
            # PERSISTENT programs per SM, each an equal run of the (row block, step) units (_wo_gvp_kernel); scratch:
            # an fp32 slot of BLOCK_N per unit and a counter per row block, per x row
            units = cdiv(N, p["BLOCK_N"]) * cdiv(K, p["BLOCK_K"])
            constexprs = dict(GROUP=group_size, HAS_BIAS=has_bias, EVEN_K=K % p["BLOCK_K"] == 0, INT_Z=int_zeros, **p)
            if swiglu:
                constexprs["SWIGLU"] = True
            programs = min(units, sms * per_sm) if sms else units
            return _keep_plan(key, cfg, (_kernels("gv")._wo_gvp_kernel, (programs, 1, M), 1, constexprs),
                              (M * units * p["BLOCK_N"], M * cdiv(N, p["BLOCK_N"]), 0))
        # one x row per program column, as the GEMV; K split as the GEMV splits it
        split = k_splits(split, cdiv(K, p["BLOCK_K"]), cdiv(N, p["BLOCK_N"]) * M, int(p.pop("MIN_PROGRAMS", 0)))
        constexprs = dict(GROUP=group_size, HAS_BIAS=has_bias, SPLIT_K=split, EVEN_K=K % p["BLOCK_K"] == 0,
                          INT_Z=int_zeros, **p)
        if swiglu:
            constexprs["SWIGLU"] = True
        return _keep_plan(key, cfg, (_kernels("gv")._wo_gv_kernel, (cdiv(N, p["BLOCK_N"]), split, M), split,
                                     constexprs))
    if cfg["path"] == "gvt":
        # 16-row tiles, 8 x rows per x tile and up to two x tiles per program (M <= 16: every weight read once);
        # a step is WPT / 4 blocks of 16 words (4 per lane of a quad: 128 k at 4 bits, 64 at 8); K split as the
        # GEMV splits it
        if p["WPT"] not in (4, 8, 16) or p["TILES"] % p["num_warps"]:
            raise RuntimeError(f"gvt config needs WPT in (4, 8, 16) and TILES a multiple of num_warps: {cfg}")
        if p.get("STAGES", 1) < 1 or (p.get("STAGES", 1) > 1 and p.get("PAIRS")):
            raise RuntimeError(f"gvt config needs STAGES >= 1, and 1 with PAIRS (the ring keeps one step per "
                               f"iteration): {cfg}")
        mt = 1 if M <= 8 else 2
        step = GVT_K[bits] * p["WPT"] // 4
        # SwiGLU: a tile holds 8 gate rows and their 8 up rows
        grid_n, grid_m = cdiv(N // 2, 8 * p["TILES"]) if swiglu else cdiv(N, 16 * p["TILES"]), cdiv(M, 8 * mt)
        split = k_splits(split, cdiv(K, step), grid_n * grid_m, int(p.pop("MIN_PROGRAMS", 0)))
        constexprs = dict(GROUP=group_size, HAS_BIAS=has_bias, SPLIT_K=split, EVEN_K=K % step == 0, MT=mt, BITS=bits,
                          **p)
        if swiglu:
            constexprs["SWIGLU"] = True
        return _keep_plan(key, cfg, (_kernels("gvt")._wo_gvt_kernel, (grid_n, split, grid_m), split, constexprs))
    if cfg["path"] in SUPPORTED:
        # K split up to SPLIT_K ways while the grid has fewer than MIN_PROGRAMS programs, in equal slices of
        # whole steps (none empty); the kernels add the partials up themselves
        # SwiGLU (wg): a tile's BLOCK_N rows are BLOCK_N / 2 gate rows and their up rows
        tiles = (cdiv(N // 2, p["BLOCK_N"] // 2) if swiglu else cdiv(N, p["BLOCK_N"])) * cdiv(M, p["BLOCK_M"])
        if cfg["path"] == "wg" and (K // WG_K) % p.get("KC", 1):
            p["KC"] = 1         # ring stages of KC chunks need K / 64 a multiple of KC: one chunk per stage then
        step = TC_K if cfg["path"] == "tc" else WG_K * p.get("KC", 1)
        split = k_splits(split, K // step, tiles, int(p.pop("MIN_PROGRAMS", 0)))
        constexprs = dict(GROUP=group_size, HAS_BIAS=has_bias, INT_Z=int_zeros, SPLIT_K=split, **p)
        if cfg["path"] == "tc":
            grid = (cdiv(N, p["BLOCK_N"]), split, cdiv(M, p["BLOCK_M"]))
            return _keep_plan(key, cfg, (_kernels("tc")._wo_tc_kernel, grid, split, constexprs))
        if swiglu:
            constexprs["SWIGLU"] = True
        kernel = _kernels("wg")._wo_wg_kernel
        tail = int(constexprs.pop("TAIL", 1))
        slots = sms * int(constexprs.pop("PER_SM", 1))
        # the fix-up goes through the x ring's shared memory: it must hold BLOCK_N x BLOCK_M fp32
        ring_holds = p["STAGES"] * p.get("KC", 1) * 32 >= p["BLOCK_N"]
        if tail > 1 and split == 1 and slots and tiles % slots and ring_holds:
            # the last wave's `rem` tiles split along K over the SMs the wave would leave idle (at most one
            # slice per slot, whole stages each, none empty)
            rem = tiles % slots
            tail = k_splits(min(tail, slots // rem), K // step)
            if tail > 1:
                full = tiles - rem
                bm, bn = constexprs["BLOCK_M"], constexprs["BLOCK_N"]
                return _keep_plan(key, cfg, (kernel, (full + rem * tail, 1), 1, dict(constexprs, BITS=bits, TAIL=tail)),
                                  (rem * tail * bn * bm, rem, full))
        return _keep_plan(key, cfg, (kernel, (tiles, split), split, dict(constexprs, BITS=bits)))
    if cfg["path"] == "gemv":
        # K is split only where the grid would leave SMs short of programs (long K, few rows: 4096 x 14336)
        split = k_splits(split, cdiv(K, p["BLOCK_K"]), cdiv(N, p["BLOCK_N"]) * M, int(p.pop("MIN_PROGRAMS", 0)))
        kernel, grid = _kernels("gemv")._wo_gemv_kernel, (cdiv(N, p["BLOCK_N"]), M)
    else:
        tiles = cdiv(N, p["BLOCK_N"]) * cdiv(M, p["BLOCK_M"])   # SPLIT_K ways, or fewer with MIN_PROGRAMS
        split = k_splits(split, cdiv(K, p["BLOCK_K"]), tiles, p.pop("MIN_PROGRAMS", None))
        kernel, grid = _kernels("mm")._wo_mm_kernel, (tiles,)
    if split == 1:
        grid = grid + (1,)
    else:
        grid = (grid[0], grid[1], split) if cfg["path"] == "gemv" else (grid[0], split)
    constexprs = dict(BITS=bits, GROUP=group_size, HAS_BIAS=has_bias,
                      EVEN_K=K % p["BLOCK_K"] == 0, SPLIT_K=split, **p)
    if cfg["path"] == "gemv":
        constexprs["INT_Z"] = int_zeros
        if swiglu:
            constexprs["SWIGLU"] = True
    return _keep_plan(key, cfg, (kernel, grid, split, constexprs))


def _keep_plan(key, cfg, plan, scratch=None):
    """plan + (scratch,): with split-K ([split, M, N] fp32 and a counter per output tile) unless given."""
    kernel, grid, split, _ = plan
    if scratch is None and split > 1:
        tiles = (grid[0] * grid[2] if cfg["path"] in ("tc", "gv", "gvt") else grid[0] * grid[1] if cfg["path"] == "gemv"
                 else grid[0])
        scratch = (split * key[1] * key[2], tiles, 0)
    if len(_PLANS) >= 4096:      # many distinct M (prefill lengths): start over rather than grow
        _PLANS.clear()
    _PLANS[key] = (cfg, plan + (scratch,))
    return plan + (scratch,)


def fused_swiglu(cfg: dict) -> bool:
    """Whether the config's kernel applies SwiGLU itself (the GEMVs: gemv / gv with an even BLOCK_N, pairs of gate /
    up rows; gvt, gate and up rows in one thread; wg, gate and up halves of a tile paired in its epilogue);
    elsewhere silu_and_mul runs after the product."""
    return cfg["path"] in ("gvt", "wg") or cfg["path"] in ("gemv", "gv") and cfg["BLOCK_N"] % 2 == 0


def _launch(x2, qweight, scale_zero, bias, out, bits, group_size, int_zeros, cfg, swiglu=False):
    """out [M, N] ([M, N / 2] with swiglu: fused_swiglu(cfg) must hold) written by one kernel. x2 rows are
    contiguous; scale_zero is [N, G, 2] contiguous, read as one 32-bit word per group (stride in words: G).
    With split-K the kernels add the partials up themselves: an fp32 workspace [split, M, N] and one counter per
    output tile (_runtime.splitk_scratch: both kept per stream)."""
    M, K = x2.shape
    N = qweight.shape[0]
    kernel, grid, _, constexprs, scratch = _plan(cfg, M, N, K, bits, group_size, bias is not None, int_zeros, swiglu,
                                                 num_sms(x2.device) if "TAIL" in cfg or "PERSISTENT" in cfg else 0)
    if "PERSISTENT" in cfg and N * qweight.stride(0) >= _GVP_MAX_BYTES and N * (K // 2) < _GVP_MAX_BYTES:
        raise RuntimeError(f"gv PERSISTENT addresses the codes with int32 offsets: rows of {qweight.stride(0)} bytes "
                           f"(K / 2 = {K // 2} expected) put {N} rows past 2**31 bytes")
    bias_arg = bias if bias is not None else scale_zero
    # "PDL": false in a config: launched without programmatic dependent launch (it starts when the kernel before has
    # ended, and the one after it when it has): where an early start meets the kernels around it badly
    pdl = pdl_options(x2.device) if cfg.get("PDL", True) else {}
    if scratch is not None:
        ws, cnt = splitk_scratch(x2.device, scratch[0], scratch[1])
    else:      # unused by the kernels: no workspace, no counter lookup on the per-call path
        ws = cnt = out
    if cfg["path"] in ("tc", "gv", "gvt"):
        launch(kernel, grid, x2, qweight, scale_zero, bias_arg, out, M, N, K, x2.stride(0), qweight.stride(0),
               scale_zero.shape[1], out.stride(0), ws, cnt, **constexprs, **pdl)
    elif cfg["path"] == "wg":
        # x and the code bytes through TMA descriptors (rows past M / N read as zeros); launch's cache key sees a
        # descriptor only by its class: its dtype follows out's, its blocks the constexprs
        x_desc, w_desc = _wg_descriptors(x2, qweight, constexprs["BLOCK_M"],
                                         constexprs["BLOCK_N"] // (2 if swiglu else 1))
        launch(kernel, grid, x_desc, w_desc, scale_zero, bias_arg, out, M, N, K, scale_zero.shape[1], out.stride(0),
               ws, cnt, scratch[2] if scratch is not None else 0, **constexprs, **pdl)
    else:      # gemv / mm
        launch(kernel, grid, x2, qweight, scale_zero, bias_arg, out, ws, cnt, M, N, K, x2.stride(0),
               qweight.stride(0), scale_zero.shape[1], out.stride(0), **constexprs, **pdl)
    return out


@functools.cache
def _wg_layouts():
    """TensorDescriptor and the shared layouts of its two blocks: x 128-byte swizzled (wgmma's B operand as
    is), code bytes unswizzled. Built once: the launcher runs per call."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor, gl.NVMMASharedLayout(128, 16, rank=2), gl.NVMMASharedLayout(0, 8, rank=2)


def _wg_descriptors(x2, qweight, block_m: int, block_n: int):
    """TMA descriptors of x [M, K] (blocks [block_m, 64]) and of the code bytes ([N, K / 2] at 4 bits, [N, K] at 8;
    blocks [block_n, 32])."""
    desc, x_layout, w_layout = _wg_layouts()
    ensure_context(x2.device)
    return (desc.from_tensor(x2, [block_m, WG_K], x_layout),
            desc.from_tensor(qweight, [block_n, WG_K // 2], w_layout))


def _dequant_into(qweight, scale_zero, w, bits, group_size, cfg):
    N, K = w.shape
    p = {k: v for k, v in cfg.items() if k != "path"}
    launch(_kernels("dequant")._wo_dequant_kernel, (cdiv(N, p["BLOCK_N"]), cdiv(K, p["BLOCK_K"])),
           qweight, scale_zero, w, N, K, qweight.stride(0), scale_zero.shape[1], w.stride(0), BITS=bits,
           GROUP=group_size, EVEN_K=K % p["BLOCK_K"] == 0, **p)
    return w


def run_config(x, qweight, scale_zero, bias, bits, group_size, int_zeros, cfg, swiglu=False):
    """out = x @ W.T (+ bias) through the kernel `cfg` names (a "tc" / "wg" config whose kernel does not run this
    case runs its "fallback"); swiglu: silu(gate) * up of the merged [gate; up] product, in the GEMV's epilogue
    (fused_swiglu) or by silu_and_mul after the product."""
    if swiglu:
        cfg = _runnable(x, qweight, bits, group_size, int_zeros, cfg)
        if not fused_swiglu(cfg):
            from ..fused import silu_and_mul
            return silu_and_mul(run_config(x, qweight, scale_zero, bias, bits, group_size, int_zeros, cfg))
    M, K = x.shape
    N = qweight.shape[0]
    cfg = _runnable(x, qweight, bits, group_size, int_zeros, cfg)
    if cfg["path"] in SUPPORTED and (x.data_ptr() % 16 or x.stride(0) % 8):
        x = x.clone(memory_format=torch.contiguous_format)    # x rows are read as 16-byte vectors too
    if cfg["path"] == "dequant":
        w = _dequant_into(qweight, scale_zero, torch.empty((N, K), dtype=x.dtype, device=x.device), bits, group_size,
                          cfg)
        # cuBLAS picks its kernel (and summation order) by layout: a row-sliced x must give the bits of
        # the contiguous x
        return torch.nn.functional.linear(x.contiguous(), w, bias.to(x.dtype) if bias is not None else None)
    return _launch(x, qweight, scale_zero, bias, alloc((M, N // 2 if swiglu else N), x.dtype, x.device), bits,
                   group_size, int_zeros, cfg, swiglu)


def _runnable(x, qweight, bits, group_size, int_zeros, cfg):
    """cfg, or its "fallback" where cfg's Gluon kernel does not run this case."""
    if cfg["path"] in SUPPORTED and not SUPPORTED[cfg["path"]](bits, x.shape[1], group_size, qweight, x.dtype,
                                                               int_zeros):
        return cfg.get("fallback") or configs.pick(configs.DEFAULT_WEIGHT_ONLY, next_pow2(x.shape[0]))
    return cfg

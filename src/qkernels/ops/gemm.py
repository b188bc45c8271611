"""Integer / FP8 GEMM launchers with fused dequant + bias + activation epilogues, and the W8A8 linear.

The per-GPU table (configs/<gpu>.json) picks per M bucket: tile sizes for kernels/_gemm._scaled_mm_kernel (with
"SPLIT_K" / "MIN_PROGRAMS": K split inside the kernel where the grid has few tiles, at small M), "path": "gemv"
(the 8-bit GEMV, decode), for int8 on Hopper "path": "wg" (kernels/_gemm_wg.py: TMA ring and wgmma kept in
flight, prefill sizes) or, for FP8 where cuBLAS is measured faster, "path": "cublas" (torch._scaled_mm with
rowwise scales); each carries a "fallback" tile config for calls it does not take.

Kernels: kernels/_gemm.py, kernels/_gemm_wg.py. Reference: reference.scaled_mm / int_mm / int4_mm / w8a8_linear.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import autotune, configs
from .._runtime import (alloc, call_op, capability, cdiv, check_kernel_device, check_same_device, check_tensor,
                        device_name, ensure_context, gpu_slug, is_interpreter, k_splits, lacks_fp8, launch, next_pow2,
                        not_replayable, num_sms, pdl_options, register_twin, scoped_value, splitk_scratch, warn_once)
from .. import reference as ref
from ..reference import ACTIVATIONS
from ._eager import planned, plans_of
from .quant import _format_constexprs, _fp8_emulate, _quantize_dynamic, quantize

_ACT_ID = {None: 0, "relu": 1, "gelu": 2, "silu": 3}
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# int32 accumulation: |a * b| <= 128 * 128 per term, so K * 2**14 must stay below 2**31.
MAX_K_INT8 = (2 ** 31 - 1) // (128 * 128)


@functools.cache
def _kg():
    from ..kernels import _gemm
    return _gemm


@functools.cache
def _kwg():
    from ..kernels import _gemm_wg     # Gluon: imported where the wg path first runs
    return _gemm_wg


@functools.cache
def _kmma():
    from ..kernels import _gemv_mma     # Gluon: imported where the gvt path first runs
    return _gemv_mma


_FORCED_CONFIG: list = [None]    # set only inside use_config()


def _gemm_config(kind: str, M: int, N: int, K: int, device: torch.device) -> dict | None:
    """The shipped config for this GPU, M bucket and shape; None for a GPU without a table (autotuned)."""
    forced = _FORCED_CONFIG[0]
    if forced is not None:
        return forced
    return _gemm_config_bucket(kind, next_pow2(max(M, 1)), N, K, device)


def use_config(cfg: dict):
    """Every int8 / fp8 / int4 GEMM inside the block runs `cfg` (a config-table entry: tile sizes, or
    {"path": "gemv" | "gvt" | "wg" | "cublas", ..., "fallback": {...}}) whatever M and shape: the scoped override
    tuners use."""
    if not isinstance(cfg, dict) or not ("BLOCK_M" in cfg or cfg.get("path") in ("gemv", "gvt", "cublas", "wg")):
        raise ValueError(f"cfg must be a GEMM config-table entry (tile sizes, or a 'gemv' / 'gvt' / 'wg' / 'cublas' "
                         f"path), got {cfg!r}")
    return scoped_value(_FORCED_CONFIG, cfg)


@functools.cache
def _gemm_config_bucket(kind: str, m_bucket: int, N: int, K: int, device: torch.device) -> dict | None:
    """Config lookup, cached per (kind, M bucket, N, K, device): the per-call cost is one dict hit."""
    if is_interpreter():
        return configs.pick(configs.INTERPRETER_W8A8 if kind in W8A8_TABLES.values() else configs.INTERPRETER_GEMM,
                            m_bucket)
    table = configs.load(gpu_slug(device_name(device))).get(kind)
    return configs.lookup(table, m_bucket, N, K) if table else None


def _launch(a2, b, c, sa, sb, bias, scale_c, act, kind):
    """a2: [M, K] (int4: [M, K/2]), b: [K, N] (int4: [K/2, N]), c: [M, N] output."""
    M, N = c.shape
    if M == 0 or N == 0:
        return c
    K = a2.shape[1] * (2 if kind == "int4" else 1)    # K = 0: no loop iterations, the epilogue still runs
    if kind == "fp8":
        a2, b = a2.view(torch.uint8), b.view(torch.uint8)
    cfg = _gemm_config(kind, M, N, K, c.device)
    if cfg is None:      # a GPU without a shipped table: tune once per (M bucket, N, K), cached on disk
        bucket = next_pow2(max(M, 1))
        cfg = autotune.tuned(gpu_slug(device_name(c.device)), f"{kind}:M{bucket}:N{N}:K{K}",
                             configs.candidates(kind, bucket, configs.DEFAULT_GEMM),
                             functools.partial(_launch_config, a2, b, c, sa, sb, bias, scale_c, act, kind, M, N, K))
    _launch_config(a2, b, c, sa, sb, bias, scale_c, act, kind, M, N, K, cfg)
    return c


def _splitk_buffers(c: torch.Tensor, split: int, tiles: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The stream's split-K workspace (int32 for integer kinds: exact partials) and tile counters for `split`
    slices of c's [M, N]; without a split, c in their place (the kernels never read them then)."""
    if split == 1:
        return c, c
    ws, cnt = splitk_scratch(c.device, split * c.numel(), tiles)
    return (ws if kind == "fp8" else ws.view(torch.int32)), cnt


def _launch_config(a2, b, c, sa, sb, bias, scale_c, act, kind, M, N, K, cfg):
    while "path" in cfg:     # a kernel path, or the fallback it carries for calls it does not take, down to tiles
        path = cfg["path"]
        if path == "cublas" and kind == "fp8" and _cublas_fp8(a2, b, c, sa, sb, bias, scale_c, act):
            return c
        if (path == "gvt" and kind in ("int8", "fp8") and act is None and sa is not None and sa.numel() == M
                and sb is not None and _gvt_ok(a2, b.t(), K, kind)):
            return _launch_gvt(a2, b.t(), c, sa, sb, bias, scale_c, kind, False, M, N, K, cfg)
        if path == "gemv" and kind in ("int8", "fp8") and _gemv_ok(a2, b, K):
            return _launch_gemv(a2, b, c, sa, sb, bias, scale_c, act, kind, M, N, K, cfg)
        # the wg ring looks STAGES - 1 steps ahead within a tile and into the next one
        if (path == "wg" and kind == "int8" and cdiv(K, cfg["BLOCK_K"]) >= cfg["STAGES"] - 1
                and _wg_ok(a2, b, c, act)):
            return _launch_wg(a2, b, c, sa, sb, bias, scale_c, M, N, K, cfg)
        if "fallback" not in cfg:
            raise RuntimeError(f"the {kind} GEMM config {cfg} does not run this call (M={M}, N={N}, K={K}) and "
                               f"carries no fallback config")
        cfg = cfg["fallback"]
    if kind == "int4" and cfg["BLOCK_K"] < 64 and not is_interpreter():   # two codes a byte: 32-byte int8 dots
        raise ValueError(f"an int4 GEMM config needs BLOCK_K >= 64, got {cfg['BLOCK_K']} ({cfg!r})")
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    tile_cfg, split = _tile_plan(cfg, M, N, K)
    unused = c   # pointer for absent optional inputs; the constexpr flags keep it unread
    ws, cnt = _splitk_buffers(c, split, tiles, kind)
    # "PDL": false in a tile config: launched without programmatic dependent launch (it starts once the kernel
    # before, the quantize kernel of a W8A8 linear, has ended): where the early start costs more than it hides
    pdl = pdl_options(c.device) if cfg.get("PDL", True) else {}
    launch(_kg()._scaled_mm_kernel, (tiles, split),
           a2, b, c, sa if sa is not None else unused, sb if sb is not None else unused,
           bias if bias is not None else unused, scale_c, M, N, K,
           a2.stride(0), a2.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1), ws, cnt,
           HAS_SCALES=sa is not None, SA_PER_ROW=sa is not None and sa.numel() > 1,
           SB_PER_COL=sb is not None and sb.numel() > 1, HAS_BIAS=bias is not None, ACT=_ACT_ID[act],
           ACC_INT=kind != "fp8", INT4=kind == "int4", **tile_cfg, **pdl)


# (id(cfg), M, N, K) -> (cfg, the tile kernel's constexprs, split); cfg kept alive: ids stay unique
_TILE_PLANS: dict = {}


def _tile_plan(cfg: dict, M: int, N: int, K: int) -> tuple[dict, int]:
    """The tile kernel's constexprs for `cfg` and the split of K: SPLIT_K ways, or fewer with MIN_PROGRAMS (split
    only while the grid has fewer tiles than that), as the weight-only tile kernel splits; none where the
    workspace would reach 2**31 elements (the kernel's offsets into it are int32 products)."""
    key = (id(cfg), M, N, K)
    hit = _TILE_PLANS.get(key)
    if hit is not None:
        return hit[1:]
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    split = k_splits(int(cfg.get("SPLIT_K", 1)), cdiv(K, cfg["BLOCK_K"]), tiles, cfg.get("MIN_PROGRAMS"))
    if split * M * N >= 2 ** 31:
        split = 1
    # PDL: a launch option (_launch_config), not a constexpr
    constexprs = {k: v for k, v in cfg.items() if k not in ("SPLIT_K", "MIN_PROGRAMS", "PDL")}
    constexprs["SPLIT_K"] = split
    if len(_TILE_PLANS) >= 4096:
        _TILE_PLANS.clear()
    _TILE_PLANS[key] = (cfg, constexprs, split)
    return constexprs, split


def _cublas_fp8(a2, b, c, sa, sb, bias, scale_c, act) -> bool:
    """c = a2 @ b * sa[m] * sb[n] (+ bias) through torch._scaled_mm (cuBLAS, rowwise scales), where a table says
    cuBLAS is the faster kernel (prefill sizes on Hopper) and the call is one it takes: per-row and per-column
    fp32 scales, no activation, scale_c 1, 16-byte aligned rows of a and columns of b (a2 / b: uint8 views of
    the e4m3 codes). Returns False where it does not run (the table's fallback config runs instead)."""
    M, N = c.shape
    K = a2.shape[1]
    if (act is not None or scale_c != 1.0 or sa is None or sb is None or sa.numel() != M or sb.numel() != N
            or not c.is_cuda or not c.is_contiguous() or K % 16 or N % 16 or a2.stride(1) != 1 or b.stride(0) != 1
            or a2.stride(0) % 16 or b.stride(1) % 16 or a2.data_ptr() % 16 or b.data_ptr() % 16
            or not _scaled_mm_takes(c.device, c.dtype, bias.dtype if bias is not None else None)):
        return False
    not_replayable()     # an eager plan replays our launches only: this call keeps the full path
    torch._scaled_mm(a2.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn), sa.reshape(M, 1), sb.reshape(1, N),
                     bias=bias, out_dtype=c.dtype, out=c)
    return True


@functools.cache
def _scaled_mm_takes(device: torch.device, out_dtype: torch.dtype, bias_dtype: torch.dtype | None) -> bool:
    """Whether this torch / cuBLAS runs rowwise-scaled FP8 with this output and bias dtype (asked once)."""
    a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
    bias = torch.zeros(16, device=device, dtype=bias_dtype) if bias_dtype is not None else None
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1, device=device), torch.ones(1, 16, device=device), bias=bias,
                         out_dtype=out_dtype, out=torch.empty(16, 16, device=device, dtype=out_dtype))
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def _wg_ok(a2: torch.Tensor, b: torch.Tensor, c: torch.Tensor, act) -> bool:
    """Whether the Gluon wgmma kernel runs this case: sm_90 (wgmma and TMA are Hopper's; Gluon has no interpreter),
    no activation, a's rows and the [N, K] weight's rows (b's columns) contiguous with 16-byte aligned bases and
    row strides (TMA descriptors), c's rows contiguous."""
    return (act is None and not is_interpreter() and c.is_cuda and torch.version.hip is None
            and capability(c.device) == (9, 0) and a2.stride(1) == 1 and b.stride(0) == 1 and c.stride(1) == 1
            and a2.stride(0) % 16 == 0 and b.stride(1) % 16 == 0 and a2.data_ptr() % 16 == 0
            and b.data_ptr() % 16 == 0)


@functools.cache
def _wg_layouts(block_m: int, block_n: int, block_k: int):
    """TensorDescriptor and the shared layouts of the A and B blocks (built once per tile shape)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return (TensorDescriptor, gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.int8),
            gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.int8))


def _launch_wg(a2, b, c, sa, sb, bias, scale_c, M, N, K, cfg):
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    desc, a_layout, b_layout = _wg_layouts(bm, bn, bk)
    ensure_context(c.device)
    # the weight's [N, K] rows are b's columns: a descriptor of b.t() (rows past M / N and k past K read as zeros)
    a_desc = desc.from_tensor(a2, [bm, bk], a_layout)
    b_desc = desc.from_tensor(b.t(), [bn, bk], b_layout)
    unused = c
    grid = (min(cdiv(M, bm) * cdiv(N, bn), num_sms(c.device)),)     # persistent: at most one program per SM
    launch(_kwg()._i8_wg_kernel, grid, a_desc, b_desc, c,
           sa if sa is not None else unused, sb if sb is not None else unused, bias if bias is not None else unused,
           scale_c, M, N, K, c.stride(0), HAS_SCALES=sa is not None, SA_PER_ROW=sa is not None and sa.numel() > 1,
           SB_PER_COL=sb is not None and sb.numel() > 1, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn,
           BLOCK_K=bk, GROUP_M=cfg["GROUP_M"], STAGES=cfg["STAGES"], num_warps=cfg["num_warps"])
    return c


def _gemv_ok(a2: torch.Tensor, b: torch.Tensor, K: int) -> bool:
    """Whether the 8-bit GEMV runs this case: it reads a's rows and b's columns (rows of the [N, K] weight b is
    a view of) as contiguous runs (int8: 32-bit words of four codes); K = 0 goes to the tile kernel (the GEMV's
    unmasked loads assume at least one step of data)."""
    return (K > 0 and K % 4 == 0 and a2.stride(1) == 1 and b.stride(0) == 1 and a2.stride(0) % 4 == 0
            and b.stride(1) % 4 == 0 and a2.data_ptr() % 4 == 0 and b.data_ptr() % 4 == 0)


# (id(cfg), M, N, K, kind) -> (cfg, grid, split, constexprs) of a GEMV launch; cfg kept alive: ids stay unique
_GEMV_PLANS: dict = {}


def _gemv_plan(cfg: dict, M: int, N: int, K: int, kind: str):
    key = (id(cfg), M, N, K, kind)
    hit = _GEMV_PLANS.get(key)
    if hit is not None:
        return hit[1:]
    p = {k: v for k, v in cfg.items() if k not in ("path", "fallback", "SPLIT_K", "MIN_PROGRAMS")}
    if p["BLOCK_K"] % 4:
        raise RuntimeError(f"GEMV config BLOCK_K={p['BLOCK_K']} must be a multiple of 4: {cfg}")
    nb = cdiv(N, p["BLOCK_N"])
    split = k_splits(int(cfg.get("SPLIT_K", 1)), cdiv(K, p["BLOCK_K"]), nb * M, int(cfg.get("MIN_PROGRAMS", 0)))
    plan = ((nb, M, split), split, dict(FP8=kind == "fp8", EVEN_K=K % p["BLOCK_K"] == 0, SPLIT_K=split, **p))
    if len(_GEMV_PLANS) >= 4096:
        _GEMV_PLANS.clear()
        _GEMV_KEYWORDS.clear()
    _GEMV_PLANS[key] = (cfg,) + plan
    return plan


def _launch_gemv(a2, b, c, sa, sb, bias, scale_c, act, kind, M, N, K, cfg):
    grid, split, constexprs = _gemv_plan(cfg, M, N, K, kind)
    ws, cnt = _splitk_buffers(c, split, grid[0] * grid[1], kind)
    unused = c
    launch(_kg()._gemv8_kernel, grid,
           a2, b, c, sa if sa is not None else unused, sb if sb is not None else unused,
           bias if bias is not None else unused, scale_c, ws, cnt, M, N, K, a2.stride(0), b.stride(1), c.stride(0),
           **_gemv_keywords(constexprs, sa is not None, sa is not None and sa.numel() > 1,
                            sb is not None and sb.numel() > 1, bias is not None, act, pdl_options(c.device)))
    return c


# (id(plan constexprs), epilogue flags, id(launch options)) -> the GEMV launch's keywords, and (id(those), kind, fp8
# emulation, K) -> them with the in-kernel activation quantization's; cleared with _GEMV_PLANS, which keeps the
# constexprs alive (so their ids stay unique)
_GEMV_KEYWORDS: dict = {}


def _gemv_keywords(constexprs: dict, has_scales: bool, sa_per_row: bool, sb_per_col: bool, has_bias: bool, act,
                   options: dict) -> dict:
    """The plan's constexprs with the epilogue's flags and the launch options, merged once per combination."""
    key = (id(constexprs), has_scales, sa_per_row, sb_per_col, has_bias, act, id(options))
    hit = _GEMV_KEYWORDS.get(key)
    if hit is None:
        hit = _GEMV_KEYWORDS[key] = dict(HAS_SCALES=has_scales, SA_PER_ROW=sa_per_row, SB_PER_COL=sb_per_col,
                                         HAS_BIAS=has_bias, ACT=_ACT_ID[act], **constexprs, **options)
    return hit


GVT_K = 64     # "gvt": k per block (16 code words of a row)


def _gvt_ok(x2: torch.Tensor, w: torch.Tensor, K: int, kind: str) -> bool:
    """Whether the Gluon tensor-core GEMV (kernels/_gemv_mma.py) runs this case: NVIDIA sm_80+ (fp8: sm_89+; no
    interpreter twin: the Triton-language GEMV is its CPU stand-in), K a multiple of 64, x's rows and the [N, K]
    weight's rows contiguous with 16-byte aligned bases and row strides."""
    return (K > 0 and K % GVT_K == 0 and not is_interpreter() and x2.is_cuda and torch.version.hip is None
            and capability(x2.device) >= ((8, 9) if kind == "fp8" else (8, 0)) and x2.stride(1) == 1
            and w.stride(1) == 1 and x2.stride(0) * x2.element_size() % 16 == 0 and w.stride(0) % 16 == 0
            and x2.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


# (id(cfg), M, N, K, kind, quant_a) -> (cfg, grid, split, constexprs) of a gvt launch; cfg kept alive
_GVT_PLANS: dict = {}


def _gvt_plan(cfg: dict, M: int, N: int, K: int, kind: str, quant_a: bool):
    """Grid, split and constexprs of a gvt launch: 16-row weight tiles (TILES per program, num_warps dividing it),
    up to two x tiles of 8 rows per program (M <= 16: every weight read once), steps of WPT / 4 blocks of 64 k, K
    split up to SPLIT_K ways while the grid has fewer than MIN_PROGRAMS programs."""
    key = (id(cfg), M, N, K, kind, quant_a)
    hit = _GVT_PLANS.get(key)
    if hit is not None:
        return hit[1:]
    tiles, wpt, warps = cfg["TILES"], cfg["WPT"], cfg["num_warps"]
    if wpt not in (4, 8, 16) or tiles % warps:
        raise RuntimeError(f"gvt config needs WPT in (4, 8, 16) and TILES a multiple of num_warps: {cfg}")
    mt = 1 if M <= 8 else 2
    step = GVT_K * wpt // 4
    grid_n, grid_m = cdiv(N, 16 * tiles), cdiv(M, 8 * mt)
    split = k_splits(int(cfg.get("SPLIT_K", 1)), cdiv(K, step), grid_n * grid_m, int(cfg.get("MIN_PROGRAMS", 0)))
    qsym = _format_constexprs(_W8A8_FORMAT[kind], True, False)["QSYM"]
    # quant_a: a program reads its x rows whole first, up to 64 elements per lane per round of loads
    xb = min(max(next_pow2(K), 32 * warps), 2048 * warps)
    constexprs = dict(FP8=kind == "fp8", QUANT_A=quant_a, QSYM=qsym, TILES=tiles, WPT=wpt, MT=mt, XR=min(M, 8 * mt),
                      XB=xb, SPLIT_K=split, EVEN_K=K % step == 0, num_warps=warps)
    plan = ((grid_n, split, grid_m), split, constexprs)
    if len(_GVT_PLANS) >= 4096:
        _GVT_PLANS.clear()
    _GVT_PLANS[key] = (cfg,) + plan
    return plan


def _launch_gvt(x2, w, c, sa, sb, bias, scale_c, kind, quant_a, M, N, K, cfg):
    """c = (x2 quantized per row, or x2's codes with row scales sa) @ w.T * sa * sb * scale_c (+ bias) by the Gluon
    tensor-core GEMV. x2: float [M, K] (quant_a) or its codes; w: [N, K] codes (fp8 as uint8 or e4m3); sb flat
    fp32 (1 or N)."""
    grid, split, constexprs = _gvt_plan(cfg, M, N, K, kind, quant_a)
    ws, cnt = _splitk_buffers(c, split, grid[0] * grid[2], kind)
    if kind == "fp8":
        w = w.view(torch.uint8)
        if not quant_a:
            x2 = x2.view(torch.uint8)
    launch(_kmma()._w8a8_gvt_kernel, grid, x2, w, c, sa if sa is not None else c, sb,
           bias if bias is not None else c, scale_c, ws, cnt, M, N, K, x2.stride(0), w.stride(0), c.stride(0),
           SB_PER_COL=sb.numel() > 1, HAS_BIAS=bias is not None, **constexprs, **pdl_options(c.device))
    return c


# ---------------------------------------------------------------------------------------------
# custom op: one op for the whole family


def _scaled_mm_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None, scale_b: torch.Tensor | None,
                    scale_c: float, bias: torch.Tensor | None, activation: str, out_dtype: torch.dtype | None,
                    kind: str) -> torch.Tensor:
    """kind: "int8", "fp8" or "int4". a: [M, K] (int4 [M, K/2]); b: [K, N] (int4 [K/2, N]);
    scales flat fp32 (numel 1 or M / N) or None; out_dtype None -> exact int32 product."""
    if kind == "fp8" and lacks_fp8(a.device):
        cap = capability(a.device)
        warn_once((str(a.device), "fp8"), f"qkernels: {device_name(a.device)} of compute capability {cap[0]}.{cap[1]} "
                  f"has no FP8 tensor cores (8.9 or newer): fp8 GEMMs run their pure-torch twin there")
        return _scaled_mm_twin(a, b, scale_a, scale_b, scale_c, bias, activation, out_dtype, kind)
    M, N = a.shape[0], b.shape[1]
    c = alloc((M, N), out_dtype or torch.int32, a.device)
    return _launch(a, b, c, scale_a, scale_b, bias, scale_c, activation or None, kind)


_scaled_mm_op = torch.library.custom_op("qkernels::scaled_mm", mutates_args=())(_scaled_mm_impl)


def _scaled_mm_twin(a, b, scale_a, scale_b, scale_c, bias, activation, out_dtype, kind):
    """The product in exact integers (int8 / int4: the kernels' int32 sums) or float64, then the epilogue as
    reference.scaled_mm."""
    if kind == "int4":
        return ref.int4_mm(a, b.t())
    if out_dtype is None:
        return ref.int_mm(a, b)
    return ref.scaled_mm(a, b, scale_a, scale_b, scale_c, bias, activation or None, out_dtype, torch.float64)


register_twin(_scaled_mm_op, _scaled_mm_twin)


@_scaled_mm_op.register_fake
def _(a, b, scale_a, scale_b, scale_c, bias, activation, out_dtype, kind):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.int32)


# ---------------------------------------------------------------------------------------------
# W8A8 with per-token dynamic activation quantization: one custom op. Where the table's "w8a8" / "w8a8-fp8"
# entry for M says "gemv" or "gvt" (decode sizes) it is one launch of a GEMV that quantizes x itself (the 8-bit
# GEMV kernels/_gemm._gemv8_kernel with QUANT_A, or the tensor-core one kernels/_gemv_mma.py; a gvt entry carries
# a "fallback" entry for the calls it does not take); elsewhere ("path": "quantize") the quantize kernel, then the
# GEMM its own table picks.

W8A8_TABLES = {"int8": "w8a8", "fp8": "w8a8-fp8"}     # config-table kind of the fused op, per code format
_W8A8_FORMAT = {"int8": "int8", "fp8": "fp8_e4m3"}


def _w8a8_dynamic(x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, scale_c: float,
                  bias: torch.Tensor | None, kind: str) -> torch.Tensor:
    """x2: float [M, K]; w_q: [N, K] codes; w_scale: flat fp32 (1 or N); kind "int8" / "fp8". Output x2's dtype."""
    M, K = x2.shape
    N = w_q.shape[0]
    b = w_q.t()
    if M and N and not (kind == "fp8" and lacks_fp8(x2.device)) and _gemv_ok(x2, b, K):
        cfg = _gemm_config(W8A8_TABLES[kind], M, N, K, x2.device)
        if cfg is not None and cfg.get("path") == "gvt":
            if _gvt_ok(x2, w_q, K, kind):
                return _launch_gvt(x2, w_q, alloc((M, N), x2.dtype, x2.device), None, w_scale, bias, scale_c, kind,
                                   True, M, N, K, cfg)
            cfg = cfg["fallback"]
        if cfg is not None and cfg.get("path") == "gemv":
            return _launch_gemv_quant(x2, b, w_scale, scale_c, bias, kind, M, N, K, cfg)
    data, xs, _ = _quantize_dynamic(x2, _W8A8_FORMAT[kind], "row", 0, True)
    return _scaled_mm_impl(data, b, xs, w_scale, scale_c, bias, "", x2.dtype, kind)


def _launch_gemv_quant(x2, b, w_scale, scale_c, bias, kind, M, N, K, cfg):
    c = alloc((M, N), x2.dtype, x2.device)
    grid, split, constexprs = _gemv_plan(cfg, M, N, K, kind)
    ws, cnt = _splitk_buffers(c, split, grid[0] * grid[1], kind)
    if kind == "fp8":
        b = b.view(torch.uint8)
    kw = _gemv_keywords(constexprs, True, False, w_scale.numel() > 1, bias is not None, None, pdl_options(c.device))
    key = (id(kw), kind, _fp8_emulate(c.device), K)
    qkw = _GEMV_KEYWORDS.get(key)
    if qkw is None:
        xblock = min(next_pow2(K), 2048 * constexprs["num_warps"])
        qkw = _GEMV_KEYWORDS[key] = dict(kw, **_quant_a_constexprs(kind, key[2], xblock))
    launch(_kg()._gemv8_kernel, grid,
           x2, b, c, c, w_scale, bias if bias is not None else c, scale_c, ws, cnt, M, N, K, x2.stride(0),
           b.stride(1), c.stride(0), **qkw)
    return c


def _quant_a_constexprs(kind: str, fp8_emulate: bool, xblock: int) -> dict:
    """The GEMV's in-kernel activation quantization: the quantize kernel's format constexprs (so its codes) and
    XBLOCK, the row elements its absmax pass loads per round (up to 64 per thread)."""
    f = _format_constexprs(_W8A8_FORMAT[kind], True, fp8_emulate)
    return dict(QUANT_A=True, QMIN=f["QMIN"], QMAX=f["QMAX"], QSYM=f["QSYM"], FP_MAX=f["FP_MAX"] or 0.0,
                FP8_EMULATE=f["FP8_EMULATE"], XBLOCK=xblock)


_w8a8_dynamic_op = torch.library.custom_op("qkernels::w8a8_dynamic", mutates_args=())(_w8a8_dynamic)


def _w8a8_dynamic_twin(x2, w_q, w_scale, scale_c, bias, kind):
    q, s, _ = ref.quantize(x2, _W8A8_FORMAT[kind], "row")
    return _scaled_mm_twin(q, w_q.t(), s, w_scale, scale_c, bias, "", x2.dtype, kind)


register_twin(_w8a8_dynamic_op, _w8a8_dynamic_twin)


@_w8a8_dynamic_op.register_fake
def _(x2, w_q, w_scale, scale_c, bias, kind):
    return x2.new_empty((x2.shape[0], w_q.shape[0]))


# ---------------------------------------------------------------------------------------------
# validation helpers


def _flat_scale(name: str, s, n: int, ref: torch.Tensor, what: str) -> tuple[torch.Tensor | None, float]:
    """Returns (flat fp32 tensor or None, python factor). Python numbers fold into scale_c."""
    if s is None:
        return None, 1.0
    if isinstance(s, (int, float)):
        return None, float(s)
    check_tensor(name, s, dtypes=(torch.float32, torch.float16, torch.bfloat16, torch.float64))
    check_same_device("a", ref, **{name: s})
    numel = s.numel()
    if numel != 1 and numel != n:       # (not `in (1, n)`: Dynamo mis-evaluates that with symbolic n)
        raise ValueError(f"{name} must be a scalar or have {n} elements ({what}), got shape {tuple(s.shape)}")
    if s.dtype == torch.float32 and s.dim() == 1 and s.is_contiguous():
        return s, 1.0                   # already flat fp32 (the usual per-channel weight scale): no copies
    return s.reshape(-1).to(torch.float32).contiguous(), 1.0


def _check_epilogue(bias, activation, out_dtype, N, ref):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if out_dtype is not None and out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of float16, bfloat16, float32, got {out_dtype}")
    if bias is not None:
        check_tensor("bias", bias, dtypes=OUT_DTYPES)
        check_same_device("a", ref, bias=bias)
        if bias.numel() != N or bias.dim() != 1:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    return bias


def _check_k(kind: str, K: int) -> None:
    if kind == "int8" and K > MAX_K_INT8:
        raise ValueError(f"K={K} is too deep for exact int32 accumulation (K * 128 * 128 must stay below 2**31: "
                         f"K <= {MAX_K_INT8}); split the product along K")


def _matmul(kind, a, b, scale_a, scale_b, scale_c, bias, activation, out_dtype, scaled):
    dt = (torch.int8,) if kind == "int8" else (torch.float8_e4m3fn,)
    check_tensor("a", a, dtypes=dt, ndim_min=1)
    check_tensor("b", b, dtypes=dt)
    check_kernel_device("a", a)
    check_same_device("a", a, b=b)
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D [K, N], got shape {tuple(b.shape)}")
    K = a.shape[-1]
    if b.shape[0] != K:
        raise ValueError(f"b must have K={K} rows to match a's last dim, got b.shape={tuple(b.shape)}")
    _check_k(kind, K)
    M = math.prod(a.shape[:-1])
    N = b.shape[1]
    a2 = a.reshape(M, K)
    if a2.stride(-1) != 1 and a2.stride(0) != 1:
        a2 = a2.contiguous()
    sa, fa = _flat_scale("scale_a", scale_a, M, a, f"one per row of a, M={M}")
    sb, fb = _flat_scale("scale_b", scale_b, N, a, f"one per column of b, N={N}")
    bias = _check_epilogue(bias, activation, out_dtype, N, a)
    scaled = scaled or sa is not None or sb is not None or fa != 1.0 or fb != 1.0 or scale_c != 1.0 \
        or bias is not None or activation is not None or out_dtype is not None
    if scaled:
        one = None
        if sa is None or sb is None:
            one = torch.ones(1, dtype=torch.float32, device=a.device)
        sa = sa if sa is not None else one
        sb = sb if sb is not None else one
        out_dtype = out_dtype or torch.float16
    out = call_op(_scaled_mm_op, _scaled_mm_impl, a2, b, sa, sb, float(scale_c) * fa * fb, bias,
                  activation or "", out_dtype if scaled else None, kind)
    return out.reshape(*a.shape[:-1], N)


# ---------------------------------------------------------------------------------------------
# public API


def int8_matmul(a: torch.Tensor, b: torch.Tensor, scale_a=None, scale_b=None, scale_c: float = 1.0, *,
                bias: torch.Tensor | None = None, activation: str | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """int8 a [..., K] @ int8 b [K, N] (any strides; `w.t()` of an [N, K] weight is the fast case).

    With no scales, bias, activation or out_dtype: the exact int32 product. Otherwise
    out = (a @ b) * scale_a * scale_b * scale_c (+ bias), then activation ("relu", "gelu" (tanh),
    "silu"), computed in fp32 in the epilogue and written as out_dtype (default fp16).
    scale_a: scalar or one per row ([M] / [M, 1]); scale_b: scalar or one per column ([N] / [1, N]).
    Accumulation is int32 and exact; K above 131071 (where K * 128 * 128 reaches 2**31) is refused.
    """
    return _matmul("int8", a, b, scale_a, scale_b, scale_c, bias, activation, out_dtype, False)


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, *, bias: torch.Tensor | None = None,
               activation: str | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """float8_e4m3fn a [..., K] @ b [K, N] with fp32 accumulation and the int8_matmul epilogue.
    Without FP8 tensor cores (compute capability < 8.9) its pure-torch twin runs instead (one warning)."""
    return _matmul("fp8", a, b, scale_a, scale_b, 1.0, bias, activation, out_dtype, True)


def int4_matmul(a_packed: torch.Tensor, b_packed: torch.Tensor, k: int) -> torch.Tensor:
    """Exact int32 product of signed int4 matrices packed two per byte along K (as pack_int4 packs):
    a_packed [M, k/2] (uint8), b_packed [N, k/2] (uint8, nn.Linear-style) -> [M, N] int32."""
    check_tensor("a_packed", a_packed, dtypes=(torch.uint8,), ndim_min=1)
    check_tensor("b_packed", b_packed, dtypes=(torch.uint8,))
    check_kernel_device("a_packed", a_packed)
    check_same_device("a_packed", a_packed, b_packed=b_packed)
    if not isinstance(k, int) or k < 0 or k % 2:
        raise ValueError(f"k must be a non-negative even int (two int4 per byte), got {k!r}")
    if a_packed.shape[-1] != k // 2:
        raise ValueError(f"a_packed's last dim must be k/2={k // 2}, got {a_packed.shape[-1]}")
    if b_packed.dim() != 2 or b_packed.shape[1] != k // 2:
        raise ValueError(f"b_packed must be [N, k/2={k // 2}], got shape {tuple(b_packed.shape)}")
    if k > 8 * MAX_K_INT8:   # |int4 * int4| <= 64
        raise ValueError(f"k={k} is too deep for exact int32 accumulation of int4 products (k <= {8 * MAX_K_INT8})")
    M = math.prod(a_packed.shape[:-1])
    a2 = a_packed.reshape(M, k // 2)
    out = call_op(_scaled_mm_op, _scaled_mm_impl, a2, b_packed.t(), None, None, 1.0, None, "", None, "int4")
    return out.reshape(*a_packed.shape[:-1], b_packed.shape[0])


_W8A8_CODES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
_X_FLOAT = (torch.float16, torch.bfloat16)


def _w8a8_call(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, dtype: str) -> torch.Tensor:
    """w8a8_linear's common call (validated by the caller: float x [..., K], no bias, flat fp32 per-channel scales),
    out shaped like x. An eager call replays the launches of the first call like it (ops/_eager.py), the plans kept
    on the weight tensor w_q; the first call on a weight tensor records nothing (a fresh view of the weight per call
    never pays for a recording), the second records."""
    def run():
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        y = call_op(_w8a8_dynamic_op, _w8a8_dynamic, x2, w_q, w_scale, 1.0, None, dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], w_q.shape[0])
    if torch.compiler.is_compiling() or not x.is_cuda:     # (Dynamo cannot trace a tensor's __dict__)
        return run()
    attrs = getattr(w_q, "__dict__", None)      # None: a tensor type that keeps no attributes (no plans then)
    if attrs is None:
        return run()
    store = attrs.get("_eager_plans")
    if store is None:
        plans_of(w_q)
        return run()
    # the scales by address and size: the plan holds the tensor it recorded, so an equal address is the same memory
    return planned(store, (x.shape, x.dtype, x.device, dtype), x, run, (w_q, w_scale),
                   (_FORCED_CONFIG[0], w_scale.data_ptr(), w_scale.numel()))


def w8a8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None, *,
                act_scale=None, dtype: str = "int8", x_scale: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """y = x @ dequant(w_q).T + bias with 8-bit activations: x (fp16/bf16 [..., K]) is quantized per
    token in one fused pass (or per tensor with a static `act_scale`), then the int8 / fp8 GEMM applies
    act_scale * w_scale (+ bias) in its epilogue. w_q: [N, K] int8 or float8_e4m3fn; w_scale: [N]
    (per output channel) or scalar. Output dtype = x.dtype.

    Pre-quantized input: x may instead be the codes (int8 / float8_e4m3fn, matching `dtype`) with
    their per-row scales `x_scale` ([..., 1] or [M], e.g. from rms_norm(..., quantize="int8") or
    silu_and_mul(..., quantize=...)); the output is then `out_dtype` (default float16)."""
    want = _W8A8_CODES.get(dtype) if dtype.__class__ is str else None
    if (want is not None and act_scale is None and x_scale is None and out_dtype is None and bias is None
            and x.__class__ is torch.Tensor and x.dtype in _X_FLOAT and x.dim() >= 1 and (x.is_cuda or is_interpreter())
            and w_q.__class__ is torch.Tensor and w_q.dtype == want and w_q.dim() == 2 and w_q.shape[1] == x.shape[-1]
            and w_q.device == x.device and w_scale.__class__ is torch.Tensor and w_scale.dtype == torch.float32
            and w_scale.dim() == 1 and w_scale.shape[0] == w_q.shape[0] and w_scale.device == x.device
            and w_scale.is_contiguous() and (dtype == "fp8" or x.shape[-1] <= MAX_K_INT8)):
        # the common call (a float x on a GPU, per-channel fp32 weight scales, no bias) validated in a few checks;
        # anything else goes through the full checks below, which name what is wrong
        return _w8a8_call(x, w_q, w_scale, dtype)
    if dtype not in ("int8", "fp8"):
        raise ValueError(f"dtype must be 'int8' or 'fp8', got {dtype!r}")
    want = torch.int8 if dtype == "int8" else torch.float8_e4m3fn
    prequantized = isinstance(x, torch.Tensor) and x.dtype in (torch.int8, torch.float8_e4m3fn)
    if prequantized:
        check_tensor("x", x, dtypes=(want,), ndim_min=1)
        if x_scale is None:
            raise ValueError(f"x holds {x.dtype} codes: pass their per-row scales as x_scale")
        if act_scale is not None:
            raise ValueError("act_scale quantizes a float x; with pre-quantized x pass x_scale only")
        if out_dtype is not None and out_dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"out_dtype must be float16 or bfloat16, got {out_dtype}")
    else:
        check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16), ndim_min=1)
        if x_scale is not None:
            raise ValueError(f"x_scale goes with pre-quantized x (int8 / float8_e4m3fn codes), got x of {x.dtype}")
        if out_dtype is not None and out_dtype != x.dtype:
            raise TypeError(f"out_dtype must be None or x's dtype {x.dtype} for a float x, got {out_dtype}")
    check_tensor("w_q", w_q, dtypes=(want,))
    if w_q.dim() != 2 or w_q.shape[1] != x.shape[-1]:
        raise ValueError(f"w_q must be [N, K={x.shape[-1]}], got shape {tuple(w_q.shape)}")
    fmt = "int8" if dtype == "int8" else "fp8_e4m3"
    # 2-D: per-row scales are then plainly [M, 1] (also under torch.compile)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    mm = int8_matmul if dtype == "int8" else fp8_matmul
    if prequantized:
        M = x2.shape[0]
        check_tensor("x_scale", x_scale, dtypes=(torch.float32,))
        if x_scale.numel() != M:
            raise ValueError(f"x_scale must hold one fp32 scale per row of x (M={M}), got shape {tuple(x_scale.shape)}")
        y = mm(x2, w_q.t(), x_scale.reshape(M, 1), w_scale, bias=bias, out_dtype=out_dtype or torch.float16)
    elif act_scale is None:
        # dynamic per-token quantization and the GEMM: one custom op (quantize(x2, fmt, "row") then int8_matmul /
        # fp8_matmul, or at decode sizes one GEMV that quantizes x itself), one check of each argument
        N, K = w_q.shape
        check_kernel_device("x", x)
        check_same_device("x", x, w_q=w_q)
        _check_k(dtype, K)
        ws, factor = _flat_scale("w_scale", w_scale, N, x, f"one per output channel, N={N}")
        bias = _check_epilogue(bias, None, None, N, x)
        if ws is None:
            ws = torch.ones(1, dtype=torch.float32, device=x.device)
        y = call_op(_w8a8_dynamic_op, _w8a8_dynamic, x2, w_q, ws, factor, bias, dtype)
    else:
        qt = quantize(x2, fmt, "tensor", scale=act_scale)
        y = mm(qt.data, w_q.t(), qt.scale, w_scale, bias=bias, out_dtype=x.dtype)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], w_q.shape[0])

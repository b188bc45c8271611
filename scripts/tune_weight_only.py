"""Pick the weight-only (W4A16 / W8A16) path and kernel config per M bucket on this GPU and write them
into src/qkernels/configs/<gpu>.json ("w4a16" / "w8a16"). Each candidate is timed with CUDA-graph
replay on the three Llama-3-8B shapes; the score is the geometric mean of time / best time per shape.
Usage: PYTHONPATH=src python3 scripts/tune_weight_only.py [--bits 4 8] [--buckets 1 16 ...]
           [--chain [--models llama3-8b qwen3-1.7b] [--tp 2]] [--shapes NxK ...] [--paths gv gvt ...]

--shapes NxK ... (one-call graphs, as the default; chained with --chain): time these shapes instead of Llama-3-8B's
and write only shape overrides against the buckets' configs, which stay as they are (another model's shapes at its
prefill sizes: a vision encoder's linears at M = 256-1024, say). --tp N (with --chain) does the same for the shapes
one rank of a tensor-parallel runtime runs in its decode step (rank_shapes: --models' q|k|v and gate|up split along
N, o and down along K), e.g. `--chain --tp 2 --buckets 1 16 --models llama3-8b`.

--chain (decode buckets, M <= 256: batched decode included): each candidate is timed as a decode step runs it
instead, on the decode shapes of --models (Llama-3-8B's by default; its lm_head aside), separate (a Hugging Face
model's) and merged (the runtime's): one CUDA graph
calling it on weight copies spanning >= 256 MB (bench.decode_gemv's method: no weight is in L2 when its call runs,
and a call overlaps the previous one's tail under programmatic dependent launch). One-call graphs time a
cold start after an L2 flush and pick other configs there. A chain of one shape's calls still misses how a kernel
meets the different ones around it in a decode step: check the new table against the old in the runtime's step
(scripts/table_ab.py) before keeping it."""
import argparse
import ast
import itertools
import json
import math
import re
import time
from pathlib import Path

import torch

import qkernels as qk
from qkernels import configs
from qkernels._runtime import device_name, gpu_slug
from qkernels.bench.decode_gemv import chain_copies, chain_us
from qkernels.bench.harness import time_us
from qkernels.ops import weight_only as WO

BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048, 4096]
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]


def chain_shapes(models: list) -> list:
    """The shapes --chain times: each model's decode layers (bench.decode_gemv.SHAPES) but its lm_head, in order,
    each shape once."""
    from qkernels.bench.decode_gemv import SHAPES as DECODE
    out = []
    for model in models:
        if model not in DECODE:
            raise ValueError(f"models: expected names of bench.decode_gemv.SHAPES ({', '.join(DECODE)}), got {model!r}")
        out += [(n, k) for n, k, layer in DECODE[model] if layer != "lm_head" and (n, k) not in out]
    return out


CHAIN_SHAPES = chain_shapes(["llama3-8b"])
# the runtime's projections under tensor parallelism (models.parallel), by bench.decode_gemv.SHAPES's layer names:
# (name, the dimension split over the ranks): column-parallel ones N, row-parallel ones K ("q, o" is o's shape: q is
# in q|k|v)
TP_SPLIT = {"q|k|v": ("q|k|v", "N"), "gate|up": ("gate|up", "N"), "q, o": ("o", "K"), "down": ("down", "K")}


# models that run only split over ranks (one GPU does not hold them in fp16), by their decode layers as
# bench.decode_gemv.SHAPES names a model's: Llama-3-70B's merged projections, o and down
TP_ONLY = {"llama3-70b": [(10240, 8192, "q|k|v"), (57344, 8192, "gate|up"), (8192, 8192, "q, o"),
                          (8192, 28672, "down")]}


def rank_shapes(models: list, tp: int) -> list:
    """The weight shapes one of `tp` ranks runs in the runtime's decode step of each model (its lm_head aside),
    each shape once."""
    from qkernels.bench.decode_gemv import SHAPES
    DECODE = {**SHAPES, **TP_ONLY}
    out = []
    for model in models:
        if model not in DECODE:
            raise ValueError(f"models: expected names of bench.decode_gemv.SHAPES or TP_ONLY ({', '.join(DECODE)}), "
                             f"got {model!r}")
        for n, k, layer in DECODE[model]:
            if layer not in TP_SPLIT:
                continue
            name, dim = TP_SPLIT[layer]
            if (n if dim == "N" else k) % tp:
                raise ValueError(f"tp: {model}'s {name} ({n}x{k}) does not split {tp} ways along {dim}")
            shape = (n // tp, k) if dim == "N" else (n, k // tp)
            if shape not in out:
                out.append(shape)
    return out


def gemv(bn, bk, w, s, min_programs=0):
    c = dict(path="gemv", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)
    return c if not min_programs else dict(c, SPLIT_K=4, MIN_PROGRAMS=min_programs)


def mm(bm, bn, bk, w, s, g=8, split=1, min_programs=None):
    """split > 1: K split `split` ways, or with min_programs only while the grid has fewer tiles than that."""
    c = dict(path="mm", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_N=g, num_warps=w, num_stages=s)
    c = c if split == 1 else dict(c, SPLIT_K=split)
    return c if min_programs is None or split == 1 else dict(c, MIN_PROGRAMS=min_programs)


def tc(bn, bm, w, split=1, min_programs=0, stages=1):
    c = dict(path="tc", BLOCK_N=bn, BLOCK_M=bm, num_warps=w)
    c = c if stages == 1 else dict(c, STAGES=stages)
    return c if split == 1 else dict(c, SPLIT_K=split, MIN_PROGRAMS=min_programs or 1 << 30)


def gv(bn, bk, wpt, w, stages=1, split=1, min_programs=0, persistent=0):
    """The Gluon paired-fp16 GEMV (fp16 x, 4-bit; others fall back): a thread holds all BLOCK_N rows and WPT words
    of a chunk, so BLOCK_K is a multiple of 256 x WPT x warps; persistent: that many programs per SM, each an equal
    run of (row block, step) units."""
    c = dict(path="gv", BLOCK_N=bn, BLOCK_K=bk, WPT=wpt, num_warps=w)
    if persistent:
        return dict(c, PERSISTENT=persistent)
    c = c if stages == 1 else dict(c, STAGES=stages)
    return c if split == 1 else dict(c, SPLIT_K=split, MIN_PROGRAMS=min_programs)


def gvt(tiles, wpt, w, split=1, min_programs=0, pairs=False, stages=1):
    """The Gluon tensor-core GEMV (fp16 x, 4- or 8-bit with integer zero points, M <= 16; others fall back): TILES
    16-row tiles per program (a multiple of the warps), WPT / 4 blocks of 128 k per step; pairs: two steps per
    loop iteration (fewer instructions, more registers); stages > 1: the codes through a ring of async copies
    stages - 1 steps ahead (more bytes in flight for the same registers)."""
    c = dict(path="gvt", TILES=tiles, WPT=wpt, num_warps=w)
    c = dict(c, PAIRS=True) if pairs else c
    c = dict(c, STAGES=stages) if stages > 1 else c
    return c if split == 1 else dict(c, SPLIT_K=split, MIN_PROGRAMS=min_programs)


def wg(bm, bn, w, stages, g=8, split=1, min_programs=264, kc=1, tail=1, per_sm=1, ws=False, maxnreg=None,
       xbar=False):
    """split > 1: K split up to `split` ways while the grid has fewer than min_programs tiles (264: two per SM
    on the H100 / H200's 132 SMs); kc: 64-k chunks per ring stage (one barrier and one refill per stage); tail > 1:
    the last, partial wave's tiles (SMs x per_sm programs a wave) split along K up to `tail` ways; ws: a producer
    warp issues the ring's copies (warp-specialized); maxnreg: registers per thread capped (more programs per SM);
    xbar: the x tiles on barriers of their own (one CTA barrier fewer per refill, a second mbarrier wait)."""
    c = dict(path="wg", BLOCK_M=bm, BLOCK_N=bn, GROUP_M=g, STAGES=stages, num_warps=w, **({"WS": True} if ws else {}),
             **({"maxnreg": maxnreg} if maxnreg else {}), **({"XBAR": True} if xbar else {}))
    c = c if kc == 1 else dict(c, KC=kc)
    c = c if tail == 1 else dict(c, TAIL=tail, **({"PER_SM": per_sm} if per_sm > 1 else {}))
    return c if split == 1 else dict(c, SPLIT_K=split, MIN_PROGRAMS=min_programs)


def dq(bn, bk, w):
    return dict(path="dequant", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=1)


def candidates(m: int) -> list[dict]:
    """Tensor-core (mm) candidates from M = 1 up: BLOCK_N weight rows are the MMA's M side, BLOCK_M x rows
    its N side. tl.dot pads small N itself, so BLOCK_M = 8 serves M <= 8 with half the x tile of 16
    (mma.sync m16n8k16; 4 warps with BLOCK_M = 16 pick wgmma with the dequantized tile as register A)."""
    c = []
    if m <= 32:
        # the Gluon tensor-core kernel (4-bit, K % 128 == 0; others fall back): BLOCK_N = 16 x warps x reps
        bm = 8 if m <= 8 else 16
        c += [tc(bn, bm, w, sp, mp) for bn, w in [(64, 4), (128, 4), (32, 2), (64, 2), (128, 8)]
              for sp, mp in [(1, 0), (4, 1024), (8, 2048), (16, 4096), (8, 4096), (16, 8192)]]
        c += [tc(bn, bm, w, sp, mp, stages=st) for bn, w in [(64, 4), (32, 2), (128, 4), (128, 8)]
              for sp, mp in [(1, 0), (4, 1024), (8, 2048)] for st in (3, 5, 8)]
    if m <= 16:
        # the tensor-core GEMV: one warp per 1-2 tiles, and K split until the grid has thousands of warps (one
        # 16-row tile per warp leaves too few loads in flight otherwise)
        c += [gvt(t, wpt, 1, sp, mp) for t in (1, 2) for wpt in (4, 8, 16)
              for sp, mp in [(1, 0), (4, 2048), (8, 4096), (16, 8192)]]
        c += [gvt(2, 4, 1, sp, mp, pairs=True) for sp, mp in [(1, 0), (8, 4096)]]
        c += [gvt(1, wpt, 1, sp, mp, stages=st) for wpt in (4, 8) for st in (3, 4) for sp, mp in [(1, 0), (4, 2048)]]
        if m > 8:
            # two x tiles: each warp reads x for 16 rows per step, from L2 unless the warps of a program (same k
            # at the same time) share it in L1; more tiles per warp or per program spread that over more weights
            c += [gvt(t, wpt, w, sp, mp) for t, w in [(4, 2), (8, 4), (8, 8)] for wpt in (4, 8)
                  for sp, mp in [(1, 0), (4, 2048)]]
            # the code ring with several tiles per program (6144x4096 at M = 16 on the H100: docs/design/weight-only.md)
            c += [gvt(t, wpt, w, 4, 2048, stages=3) for t, wpt, w in [(2, 4, 1), (4, 4, 2), (2, 8, 1), (4, 4, 1)]]
    small_mm = [(64, 128, 2, 4), (128, 128, 4, 4), (128, 64, 4, 6), (128, 128, 4, 3), (256, 128, 8, 4),
                (64, 64, 2, 6)]
    if m <= 2:
        # GEMV tiles are [BLOCK_K / 64, BLOCK_N, 32]: 32 threads span 16 chunks x 2, so BLOCK_N = 2 x warps
        # gives each thread two rows at the same k (x converted once for both)
        c += [gemv(*p, mp) for p in [(8, 1024, 4, 1), (16, 512, 4, 1), (16, 1024, 8, 1), (8, 512, 2, 1),
                                     (4, 1024, 4, 1), (4, 2048, 4, 1), (8, 2048, 8, 1), (2, 2048, 2, 1),
                                     (4, 4096, 8, 1)] for mp in (0, 1024, 2048)]
        # the paired-fp16 GEMV: the configs that won somewhere in the H100 / H200 decode-chain sweeps
        c += [gv(8, 1024, 4, 1), gv(8, 1024, 4, 1, stages=3), gv(16, 1024, 4, 1), gv(8, 2048, 2, 4), gv(8, 4096, 4, 4),
              gv(16, 2048, 4, 2), gv(8, 1024, 2, 2), gv(8, 1024, 4, 1, split=4, min_programs=1024),
              # two warps of WPT 4 on 2048 k (the H100's 6144 / 28672-row entries, the lm_head with a 2-stage ring)
              gv(8, 2048, 4, 2), gv(8, 2048, 4, 2, stages=2), gv(4, 512, 2, 1)]
        # the same on a persistent grid (no wave ends part full): level with the tables' configs on the served shapes
        # in the H100 decode chain, ahead on weights the tables have no override for
        # (docs/design/weight-only.md, "The persistent GEMV")
        c += [gv(bn, bk, wpt, w, persistent=p) for bn, bk, wpt, w, p in
              [(8, 1024, 4, 1, 16), (8, 1024, 4, 1, 12), (8, 512, 2, 1, 16), (16, 1024, 4, 1, 8), (8, 2048, 4, 2, 8)]]
    if m <= 32:
        bms = [8] if m <= 8 else [m // 2, m]     # M = 16 as two 8-row blocks (weights re-read from L2) or one
        c += [mm(bm, bn, bk, w, s, split=sp) for bm in bms for bn, bk, w, s in small_mm for sp in (1, 2, 4, 8)]
        # one config for few-tile and many-tile weights (4096 x 14336 and the 28672-row gate|up): split while the
        # grid has fewer than two tiles per SM
        c += [mm(bm, bn, bk, w, s, split=8, min_programs=264) for bm in bms for bn, bk, w, s in small_mm]
    elif m <= 64:
        c += [mm(64, bn, bk, 4, s) for bn, bk, s in itertools.product((64, 128), (64, 128), (3, 4, 5))]
        c += [mm(64, bn, bk, w, s, split=sp) for bn, bk, w, s in [(64, 64, 4, 4), (64, 128, 4, 4), (128, 64, 8, 3),
                                                                  (32, 128, 2, 4)] for sp in (2, 4, 8)]
    elif m <= 256:
        c += [mm(bm, bn, bk, w, s) for bm, bn, bk, w, s in
              [(64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3),
               (64, 128, 128, 4, 3), (128, 128, 64, 4, 4), (64, 64, 128, 4, 4), (128, 128, 128, 8, 3),
               (64, 256, 64, 8, 3), (128, 256, 64, 8, 3)]]
        c += [mm(bm, bn, bk, w, s, split=sp) for bm, bn, bk, w, s in
              [(64, 64, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4),
               (128, 128, 64, 8, 4), (64, 128, 64, 8, 4)] for sp in (2, 3, 4, 8)]
    else:
        c += [mm(bm, bn, bk, w, s) for bm, bn, bk, w, s in
              [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3), (128, 256, 64, 8, 3),
               (128, 128, 128, 8, 3), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (256, 128, 64, 8, 4),
               (128, 256, 64, 8, 4), (256, 256, 64, 8, 3)]]
        c += [dq(32, 128, 4), dq(16, 256, 4)]
    # the Gluon wgmma kernel (Hopper; others fall back): BLOCK_M x rows (8-256, the wgmma's n), BLOCK_N
    # weight rows (16 x warps x a power of two); split-K where the grid is small
    if m <= 32:
        bm = max(8, m)
        c += [wg(bm, bn, w, st, split=sp, min_programs=mp) for bn, w, st, sp, mp in
              [(64, 4, 8, 8, 264), (64, 4, 6, 8, 264), (128, 4, 8, 8, 264), (64, 4, 8, 16, 528), (128, 8, 8, 4, 264),
               (64, 4, 8, 1, 0)]]
    if 8 < m <= 64:
        # batched decode: more weight rows per x tile (x is read once per program from L2: at BLOCK_N = 64 and M = 32
        # that is twice the code bytes) and stages of several chunks (fewer, larger copies; fewer barriers). BLOCK_N
        # 256 (two warpgroups of 128 rows) won no shape in three H200 sweeps (logs/tune_weight_only_chain_wg*_h200.log)
        bm = m
        c += [wg(bm, bn, w, st, split=sp, min_programs=mp, kc=kc) for bn, w, st, kc, sp, mp in
              [(64, 4, 3, 4, 8, 264), (64, 4, 4, 4, 4, 264), (128, 4, 4, 2, 4, 264), (128, 4, 3, 4, 4, 264),
               (128, 8, 4, 2, 4, 264), (128, 8, 3, 4, 8, 528), (128, 8, 6, 1, 4, 264)]]
        # occupancy: few chunks in flight per program (shared memory for 6-9 programs per SM) and K split until the
        # grid has 6-8 programs per SM (one warpgroup each is latency-bound; ncu, H200, M = 32: 3.2 warps per
        # scheduler, issuing on half the cycles)
        c += [wg(bm, 64, 4, st, split=sp, min_programs=mp, kc=kc) for st, kc, sp, mp in
              [(4, 1, 4, 792), (3, 1, 4, 792), (4, 1, 8, 1056), (2, 2, 4, 792), (3, 1, 8, 1056)]]
        # the same warp-specialized (a producer warp issues the copies: no TMA issue and half the barriers on the
        # warpgroup that multiplies, the loop's latency-bound part)
        c += [wg(bm, 64, 4, st, split=sp, min_programs=mp, kc=kc, ws=True) for st, kc, sp, mp in
              [(4, 1, 4, 792), (3, 1, 8, 1056), (2, 2, 4, 792)]]
        # WS compiles at 255 registers for its 8 warps (one program per SM): capped, several programs per SM
        # (logs/pdl_decode_step_h200.log: 28672x4096 at M = 16 64.7 -> 37.7 µs with maxnreg 64; no spills at 64
        # up to 32 x rows, at 80 for 64)
        c += [wg(bm, 64, 4, st, split=4, min_programs=792, ws=True, maxnreg=64 if bm <= 32 else 80) for st in (4, 6)]
        # the same with the x tiles on barriers of their own (XBAR: 3 CTA barriers per chunk instead of 4 in the
        # loop's SASS, 361 instructions per two chunks instead of 355). Registers capped (maxnreg 64 / 80 / 96) won
        # no bucket or shape in an H200 sweep at M = 16-64 (logs/pdl_decode_step_h200.log): no longer tried
        c += [wg(bm, 64, 4, st, split=sp, min_programs=mp, kc=kc, xbar=True) for st, kc, sp, mp in
              [(4, 1, 4, 792), (3, 1, 8, 1056), (2, 2, 4, 792)]]
    if 64 <= m <= 256:
        c += [wg(bm, bn, w, st, split=4) for bm, bn, w, st in
              [(64, 64, 4, 6), (128, 64, 4, 4), (128, 64, 4, 6), (128, 128, 8, 4)]]
        # few tiles (4096 rows: 64 of 128 x 64): two slices of two-chunk stages
        c += [wg(bm, 64, 4, st, split=2, min_programs=1 << 30, kc=2) for bm, st in [(128, 4), (64, 4), (128, 3)]]
    if m >= 64:
        c += [wg(bm, bn, w, st) for bm, bn, w, st in
              [(256, 128, 8, 4), (256, 128, 8, 3), (256, 128, 8, 5), (128, 128, 8, 4), (128, 256, 8, 3),
               (256, 64, 4, 4), (128, 64, 4, 4), (64, 64, 4, 4), (64, 128, 8, 4)]]
    if m >= 256:
        # wave quantization (14336 rows at M = 1024: 448 tiles of 256 x 128 on 132 SMs, 3.4 waves): the last wave's
        # tiles split along K over the idle SMs
        c += [wg(256, 128, 8, st, tail=t) for st in (4, 3) for t in (2, 4)]
        c += [wg(128, 128, 8, 4, tail=t, per_sm=2) for t in (2, 4)]
        # warp-specialized: a producer warp issues the copies, the warpgroups only dequantize and multiply
        c += [wg(256, 128, 8, st, tail=t, ws=True) for st in (4, 3) for t in (1, 2)]
    return c


def from_log(log: Path, table: dict, bits_list: list, chain_set: list = CHAIN_SHAPES) -> None:
    """Shape overrides from an earlier sweep's log (per-shape times), against the table's bucket configs. A line
    with a time per shape of chain_set (the sweep's --models) is a --chain sweep's: its overrides take that sweep's
    gain; one with a time per SHAPES is a plain sweep's."""
    pat = re.compile(r"^(w\da16) M=\s*(\d+) (\{.*\}) (\[.*\])$")
    runs = {False: {}, True: {}}       # by whether the line is a --chain sweep's
    for line in log.read_text().splitlines():
        mt = pat.match(line.strip())
        if mt and int(mt.group(1)[1]) in bits_list:
            times = [float(t) for t in ast.literal_eval(mt.group(4))]
            if len(times) not in (len(SHAPES), len(chain_set)):
                raise ValueError(f"{log}: a line times {len(times)} shapes, expected {len(SHAPES)} (a plain sweep) or "
                                 f"{len(chain_set)} (a --chain sweep of these --models): {line.strip()[:120]}")
            chain = len(times) == len(chain_set)
            runs[chain].setdefault((mt.group(1), int(mt.group(2))), []).append((times, ast.literal_eval(mt.group(3))))
    configs.overrides_from_runs(table, runs[False], SHAPES, log.name)
    configs.overrides_from_runs(table, runs[True], chain_set, log.name, configs.CHAIN_OVERRIDE_GAIN)
    for kind in [k for k in ("w4a16", "w8a16") if k in table]:
        tab = table[kind]      # the overrides take their bucket's fallback (or the bucket's config itself)
        for bucket in [k for k in tab if ":" not in k]:
            fb = tab[bucket].get("fallback") or (tab[bucket] if tab[bucket]["path"] not in WO.SUPPORTED else None)
            if fb is not None:
                _attach_fallback(tab, bucket, fb)


def overrides_only(tab: dict, kind: str, bucket, shapes: list, results: list, score,
                   gain: float = configs.OVERRIDE_GAIN) -> bool:
    """--shapes / --tp: the shape overrides of `shapes` against the bucket's config in tab (which stays), from one
    bucket's results [(time per shape, config)], where one beats it by `gain`; Gluon-path overrides take the
    bucket's fallback (or the best other config's). False (nothing written) where the bucket's config is not among
    the results."""
    bucket_cfg = {k: v for k, v in tab[str(bucket)].items() if k != "fallback"}
    if not any(r[1] == bucket_cfg for r in results):
        print(f"{kind} M={bucket}: the bucket's config failed on these shapes; no overrides", flush=True)
        return False
    configs.set_shape_overrides(tab, kind, bucket, shapes, results, bucket_cfg, gain)
    others = [r for r in results if r[1]["path"] not in WO.SUPPORTED]
    fb = tab[str(bucket)].get("fallback") or (min(others, key=score)[1] if others else None)
    if fb is not None:
        _attach_fallback(tab, bucket, fb)
    return True


def _attach_fallback(tab: dict, bucket, fallback: dict) -> None:
    """Gluon-path configs (tc, wg) of a bucket and its shape overrides carry `fallback`, which runs where their
    kernels do not (GPU, group size, K)."""
    fallback = {k: v for k, v in fallback.items() if k != "fallback"}
    for k in [k for k in tab if k.split(":")[0] == str(bucket) and tab[k]["path"] in WO.SUPPORTED]:
        tab[k] = dict(tab[k], fallback=fallback)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--buckets", type=int, nargs="+", default=BUCKETS)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new buckets after this long")
    ap.add_argument("--from-log", type=Path, nargs="+", help="no timing: shape overrides from earlier sweeps' logs")
    ap.add_argument("--gpu", help="with --from-log: the table to update (slug, e.g. h200)")
    ap.add_argument("--paths", nargs="+", help="only candidates of these paths (and the table's current config)")
    ap.add_argument("--chain", action="store_true",
                    help="decode buckets (M <= 256: batched decode too) timed over weight copies as a decode step "
                         "runs them (above)")
    ap.add_argument("--models", nargs="+", default=["llama3-8b"],
                    help="--chain (or --from-log of such a sweep): the decode shapes of these models but their "
                         "lm_heads (bench.decode_gemv.SHAPES); the bucket configs are chosen over all of them")
    ap.add_argument("--shapes", nargs="+", metavar="NxK",
                    help="time these shapes (not with --from-log): only shape overrides are written, against the "
                         "buckets' configs in the table")
    ap.add_argument("--tp", type=int, default=1,
                    help="with --chain: the shapes of one of this many tensor-parallel ranks of --models, as --shapes "
                         "(overrides only)")
    args = ap.parse_args()
    if args.chain and (args.from_log or max(args.buckets) > 256):
        ap.error("--chain times decode buckets (--buckets of 256 or less) and cannot replay logs (--from-log)")
    if args.shapes and args.from_log:
        ap.error("--shapes times shapes against the table's bucket configs: not with --from-log")
    if args.tp != 1 and (not args.chain or args.shapes or args.tp < 1):
        ap.error(f"--tp: expected a rank count > 1 with --chain (decode shapes) and without --shapes, got --tp "
                 f"{args.tp}{'' if args.chain else ' without --chain'}{' with --shapes' if args.shapes else ''}")
    try:
        chain_set = chain_shapes(args.models)
        own = [tuple(int(v) if v.isdigit() else 0 for v in s.lower().split("x")) for s in args.shapes or []]
        if any(len(t) != 2 or min(t) < 1 for t in own):
            raise ValueError(f"--shapes: expected NxK pairs such as 4096x2048, got {args.shapes}")
        if args.tp > 1:
            own = rank_shapes(args.models, args.tp)
    except ValueError as e:
        ap.error(str(e))
    shapes = own or (chain_set if args.chain else SHAPES)
    if args.from_log:
        path = Path(configs.__file__).parent / f"{args.gpu}.json"
        table = json.loads(path.read_text())
        for log in args.from_log:
            from_log(log, table, args.bits, chain_set)
        for kind in table:
            table[kind] = dict(sorted(table[kind].items(), key=lambda kv: (int(kv[0].split(":")[0]), kv[0])))
        path.write_text(json.dumps(table, indent=1) + "\n")
        return
    dev = torch.device("cuda")
    slug = gpu_slug(device_name(dev))
    path = Path(configs.__file__).parent / f"{slug}.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    weights = {}      # (bits, N, K) -> the weight, or its copies with --chain
    for bits in args.bits:
        for N, K in shapes:
            w = torch.randn(N, K, device=dev, dtype=torch.float16) / K ** 0.5
            make = (lambda: qk.PackedWeight.from_float(w, 4, 128, symmetric=False)) if bits == 4 else \
                (lambda: qk.PackedWeight.from_float(w, 8, -1, symmetric=True))
            pw = make()
            copies = chain_copies(pw.qweight.nbytes + pw.scale_zero.nbytes) if args.chain else 1
            weights[bits, N, K] = [pw] + [make() for _ in range(copies - 1)]
    t0 = time.time()
    wrote = False
    for bits in args.bits:
        key = f"w{bits}a16"
        tab = dict(table.get(key) or {})
        for m in args.buckets:
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: {key} M={m} and later keep their configs", flush=True)
                break
            results = []
            # tc, gv: 4-bit only
            cands = [c for c in candidates(m) if bits == 4 or c["path"] not in ("tc", "gv")]
            bucket = {k: v for k, v in (tab.get(str(m)) or {}).items() if k != "fallback"}
            if own:         # --shapes / --tp: overrides against the bucket's own config, which must be timed too
                if not bucket:
                    print(f"{key} M={m}: no bucket config in the table to set overrides against; skipped", flush=True)
                    continue
                if bucket not in cands:
                    cands.insert(0, bucket)
            if args.paths:
                cands = [c for c in cands if c["path"] in args.paths]
                # the table's bucket config, its fallback and its shape overrides compete too
                mine = [tab[k] for k in tab if k.split(":")[0] == str(m)]
                mine += [c["fallback"] for c in mine if "fallback" in c]
                for c in mine:
                    c = {k: v for k, v in c.items() if k != "fallback"}
                    if c not in cands:
                        cands.insert(0, c)
            for cfg in cands:
                times = []
                try:
                    for N, K in shapes:
                        pws = weights[bits, N, K]
                        x = torch.randn(m, K, device=dev, dtype=torch.float16)
                        calls = [lambda pw=pw: WO._weight_only(x, pw, None, bits, "tune") for pw in pws]
                        with WO.use_config(cfg):
                            times.append(chain_us(calls, True) if args.chain else
                                         time_us(calls[0], mode="graph", rep_ms=25, warmup_ms=5))
                except Exception as e:   # e.g. out of shared memory or registers
                    print(f"{key} M={m} {cfg} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                results.append((times, cfg))
                print(f"{key} M={m:5d} {cfg} {['%.2f' % t for t in times]}", flush=True)
            best_per_shape = [min(r[0][i] for r in results) for i in range(len(shapes))]
            score = lambda r: math.exp(sum(math.log(t / b) for t, b in zip(r[0], best_per_shape)) / len(shapes))  # noqa
            if own:
                if not overrides_only(tab, key, m, shapes, results, score,
                                      configs.CHAIN_OVERRIDE_GAIN if args.chain else configs.OVERRIDE_GAIN):
                    continue
                table[key] = dict(sorted(tab.items(), key=lambda kv: (int(kv[0].split(":")[0]), kv[0])))
                path.write_text(json.dumps(table, indent=1) + "\n")
                wrote = True
                continue
            times, cfg = min(results, key=score)
            tab[str(m)] = cfg
            configs.set_shape_overrides(tab, key, m, shapes, results, cfg,
                                        configs.CHAIN_OVERRIDE_GAIN if args.chain else configs.OVERRIDE_GAIN)
            others = [r for r in results if r[1]["path"] not in WO.SUPPORTED]
            if others:
                _attach_fallback(tab, m, min(others, key=score)[1])
            print(f"==> {key} M<={m}: {cfg} {['%.2f' % t for t in times]} (score {score((times, cfg)):.3f}, "
                  f"{time.time() - t0:.0f} s)", flush=True)
            # after every bucket: a job cut off by its time limit keeps the buckets it finished
            table[key] = dict(sorted(tab.items(), key=lambda kv: (int(kv[0].split(":")[0]), kv[0])))
            path.write_text(json.dumps(table, indent=1) + "\n")
            wrote = True
    print(f"wrote {path}" if wrote else f"{path} unchanged: no bucket was timed")


if __name__ == "__main__":
    main()

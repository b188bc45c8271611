"""Pick per-M-bucket GEMM configs on this GPU and write src/qkernels/configs/<gpu>.json.
Each candidate is timed on the Llama-3-8B shapes (geometric mean; at M <= 16 also the k / v, q|k|v and gate|up
projections and the lm_head a decode step runs, where tile configs may split K: SPLIT_K / MIN_PROGRAMS); a shape for which
another candidate is clearly faster gets an override entry "<bucket>:N<N>:K<K>" (configs.lookup). Kinds "w8a8" /
"w8a8-fp8" are the W8A8 linear with dynamic per-token activations at decode sizes: at M = 1 the GEMVs that quantize x
themselves (the 8-bit GEMV, the tensor-core one), at M = 2..16 the tensor-core one (it reads each weight once for all
rows), against the quantize kernel + the GEMM its table picks ("path": "quantize", also every bucket above), whose
two launches count as TWO_LAUNCHES times their time; at M = 1 the linear is one launch (ONE_LAUNCH), quantize + GEMM
timed for the log only. --chain times the decode buckets as a
decode step runs them (weight copies in one CUDA graph) instead of one-call graphs: in those chains the W8A8 GEMV
quantizing x fares worse than the one-call graphs show (docs/design/gemm.md); int8 / fp8 at M = 17..256 are timed
there as the W8A8 linear (the quantize kernel, then the GEMM), and the candidates close to the best once more with
"PDL": false (launched without programmatic dependent launch). Usage:
PYTHONPATH=src python3 scripts/tune_gemm.py [--kinds int8 fp8 w8a8 w8a8-fp8] [--buckets 16 1 ...] [--chain]"""
import argparse
import ast
import json
import math
import re
import time
from pathlib import Path

import torch

from qkernels import configs
from qkernels._runtime import device_name, gpu_slug
from qkernels.bench.decode_gemv import chain_copies, chain_us
from qkernels.bench.harness import time_us
from qkernels.ops import gemm as G

C = lambda bm, bn, bk, w, s, g=8: dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, num_warps=w, num_stages=s)  # noqa


def S(cfg, split, min_programs):
    """cfg with K split up to `split` ways while the grid has fewer than min_programs tiles."""
    return dict(cfg, SPLIT_K=split, MIN_PROGRAMS=min_programs)


CANDIDATES = {
    "16": [C(16, 32, 256, 4, 4), C(16, 64, 256, 4, 4), C(16, 64, 128, 4, 5), C(16, 128, 128, 4, 4),
           C(16, 32, 512, 4, 3), C(16, 64, 512, 4, 3), C(32, 64, 256, 4, 4),
           # few output tiles at small M (1024 rows: 16 tiles of 64): K split so that every SM streams weight
           S(C(16, 64, 256, 4, 4), 4, 264), S(C(16, 64, 256, 4, 4), 8, 528), S(C(16, 64, 512, 4, 3), 4, 264),
           S(C(16, 32, 256, 4, 4), 4, 528), S(C(16, 64, 128, 4, 5), 8, 528), S(C(16, 128, 128, 4, 4), 8, 264)],
    "128": [C(64, 64, 128, 4, 4), C(64, 128, 128, 4, 4), C(128, 64, 128, 4, 4), C(128, 128, 128, 8, 3),
            C(64, 128, 256, 4, 3), C(128, 128, 64, 4, 4), C(64, 32, 256, 4, 4), C(128, 32, 128, 4, 4),
            C(64, 64, 256, 4, 3), C(128, 32, 256, 4, 3), C(64, 32, 128, 2, 5)],
    # Triton keeps an int32-accumulating wgmma synchronous (wait 0 after each step; only fp32 accumulators
    # are pipelined): configs that fit two CTAs per SM let one CTA's MMAs cover the other's bubble
    "1024": [C(128, 128, 128, 8, 3), C(128, 256, 128, 8, 3), C(128, 128, 128, 4, 4), C(128, 256, 64, 8, 4),
             C(256, 128, 128, 8, 3), C(128, 128, 256, 8, 3), C(128, 128, 128, 4, 3), C(128, 128, 64, 4, 4),
             C(64, 128, 128, 4, 4), C(64, 256, 128, 4, 3)],
    "4096": [C(128, 256, 128, 8, 3), C(128, 256, 64, 8, 4), C(256, 128, 128, 8, 3), C(128, 128, 128, 8, 4),
             C(128, 256, 128, 8, 4, 16), C(256, 256, 64, 8, 3), C(128, 128, 128, 4, 3), C(128, 128, 64, 4, 4),
             C(128, 256, 64, 8, 3), C(64, 256, 128, 4, 3), C(128, 128, 128, 4, 3, 16), C(256, 128, 64, 8, 3)],
}
# M = 1: the 8-bit GEMV (dp4a / fp8 decode, no tensor cores); each candidate carries the tuned "16" config as its
# fallback (cases the GEMV does not run), so "1" is tuned after "16"
GEMV = [dict(path="gemv", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, SPLIT_K=sp, MIN_PROGRAMS=1024)
        for bn, bk, w, sp in [(2, 2048, 2, 4), (2, 1024, 1, 4), (2, 1024, 2, 4), (4, 2048, 4, 4), (4, 1024, 2, 4),
                              (8, 2048, 8, 1), (2, 4096, 2, 1), (4, 512, 2, 1)]]
# beside them the tensor-core tile kernel with K split (x's row padded to a 16-row tile: few instructions per weight,
# which the fp8 GEMV's decode to fp32 is not)
CANDIDATES["1"] = GEMV + [S(C(16, 64, 256, 4, 4), 4, 264), S(C(16, 64, 512, 4, 3), 8, 528),
                          S(C(16, 32, 256, 4, 4), 4, 528), S(C(16, 128, 128, 4, 4), 8, 528)]
# the W8A8 linear at M = 1: x is quantized per step in every program (amortized over BLOCK_N rows) and each program
# reads the row's absmax over all of K first, so wider row blocks and fewer slices than the plain GEMV's
FUSED = [dict(path="gemv", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, SPLIT_K=sp, MIN_PROGRAMS=mp)
         for bn, bk, w, sp, mp in [(16, 1024, 4, 1, 0), (16, 1024, 4, 2, 512), (4, 4096, 4, 1, 0),
                                   (4, 1024, 2, 2, 1024), (8, 512, 2, 4, 1024),      # the H100 / H200 sweeps' best
                                   (8, 1024, 2, 2, 1024), (8, 1024, 4, 1, 0), (8, 2048, 4, 2, 1024),
                                   # fp8 x codes kept in registers (warps all along k: no shared-memory layout change
                                   # per step in the offline SASS, unlike 8 x 1024 on 4 warps)
                                   (4, 2048, 4, 2, 1024), (4, 512, 1, 4, 1024)]]
QUANTIZE = dict(path="quantize")
# ... against which a second launch per call counts as this much slower: two launches double an eager call's host cost
# (scripts/profile_host.py --trace), and the decode tables aim at one launch per call
TWO_LAUNCHES = 1.06
# ... and at M = 1 not a candidate at all: one launch per call there is a target of the decode tables, and an eager
# call of two launches cannot meet the host-cost target (1.3x F.linear); timed all the same, for the log (the H200's
# chains had quantize + GEMV 10% ahead of the best one-launch GEMV: benchmarks/logs/tune_decode_h200.log)
ONE_LAUNCH = ("1",)
# the tensor-core GEMV (kernels/_gemv_mma.py: 16-row tiles, TILES per program, WPT / 4 blocks of 64 k per step), for
# the W8A8 linear quantizing x itself and for the int8 / fp8 GEMMs on codes at M <= 16: the H100 sweep's best (K
# split 4 ways), and K split finer into slices of one or two steps (every program's codes in flight at once)
GVT = [dict(path="gvt", TILES=t, WPT=wpt, num_warps=w, SPLIT_K=sp, MIN_PROGRAMS=mp)
       for t, wpt, w, sp, mp in [(4, 8, 4, 4, 1024), (1, 16, 1, 16, 4096), (1, 8, 1, 8, 4096), (2, 16, 2, 8, 2048)]]
W8A8_KINDS = {"w8a8": "int8", "w8a8-fp8": "fp8"}
CANDIDATES["16384"] = CANDIDATES["4096"]
# batched decode (M = 17..256; --chain): tiles of the bucket's rows with K split while the grid is small (N = 4096
# rows at M <= 128 make 32-128 tiles on 132 SMs), wider and unsplit tiles beside them
for _b in ("32", "64"):
    _m = int(_b)
    CANDIDATES[_b] = [C(_m, 64, 256, 4, 4), C(_m, 64, 128, 4, 5), C(_m, 128, 128, 4, 4), C(_m, 32, 256, 4, 4),
                      S(C(_m, 64, 256, 4, 4), 4, 264), S(C(_m, 64, 256, 4, 4), 8, 528), S(C(_m, 64, 128, 4, 5), 4, 528),
                      S(C(_m, 128, 128, 4, 4), 4, 264), S(C(_m, 32, 256, 4, 4), 4, 528), S(C(_m, 64, 512, 4, 3), 4, 264)]
CANDIDATES["128"] = CANDIDATES["128"] + [S(C(64, 64, 256, 4, 3), 4, 264), S(C(128, 64, 128, 4, 4), 4, 264),
                                         S(C(64, 128, 128, 4, 4), 4, 264), S(C(128, 32, 256, 4, 3), 4, 528)]
CANDIDATES["256"] = [C(128, 128, 128, 8, 3), C(128, 64, 128, 4, 4), C(64, 128, 128, 4, 4), C(128, 128, 64, 4, 4),
                     C(64, 64, 256, 4, 3), C(128, 32, 256, 4, 3), S(C(128, 128, 128, 8, 3), 2, 264),
                     S(C(128, 64, 128, 4, 4), 2, 264), S(C(64, 64, 256, 4, 3), 4, 264)]


def W(bm, bn, bk, s, w, g=8):
    return dict(path="wg", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, STAGES=s, num_warps=w)


# int8 on Hopper: the Gluon kernel (kernels/_gemm_wg.py, wgmma kept in flight), each with the bucket's best tile
# config as its fallback (calls it does not take), timed after the tile configs
WG = [W(256, 128, 128, 4, 8), W(256, 128, 128, 3, 8), W(256, 128, 128, 4, 8, 16), W(128, 128, 128, 4, 4),
      W(128, 128, 128, 3, 4), W(256, 128, 64, 6, 8), W(128, 128, 128, 4, 8)]
WG_BUCKETS = ("1024", "4096", "16384")
M_OF = {"16": [2, 16], "1": [1],       # the M <= 16 bucket serves M = 2..16 (M = 1 has its own)
         "32": [32], "64": [64], "128": [128], "256": [256], "1024": [1024], "4096": [4096], "16384": [16384]}
CHAIN_MAX = 256         # --chain: the buckets a decode step runs (batches up to 256 sequences)
# --chain, buckets 32-256 (int8 / fp8 timed as the W8A8 linear: quantize kernel + GEMM): the candidates within this
# factor of the best are timed once more launched without programmatic dependent launch
PDL_OFF_WITHIN = 1.15
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]
# decode sizes: also the small and merged projections a decode step runs (k / v, q|k|v, gate|up) and the lm_head
# (the runtime quantizes it on request; bench decode-gemv times it)
DECODE_SHAPES = [(1024, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336),
                 (128256, 4096)]


def tile_of(cfg: dict) -> dict:
    """The tile config at the end of cfg's fallbacks (cfg itself when it is one)."""
    while "path" in cfg:
        cfg = cfg["fallback"]
    return cfg


# the batched-decode buckets (17..256) in a chain: the four Llama-3-8B projections a decode step runs
BATCH_SHAPES = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]


def shapes_of(bucket: str) -> list:
    if int(bucket) <= 16:
        return DECODE_SHAPES
    return BATCH_SHAPES if args.chain and int(bucket) <= CHAIN_MAX else SHAPES



def per_shape(times: list, bucket: str) -> list:
    """Sweep times (M-major over the bucket's shapes, or their first ones in logs from before the lm_head joined
    them) -> one time per shape, summed over the bucket's M values."""
    n = len(times) // len(M_OF[bucket])
    return [sum(times[mi * n + si] for mi in range(len(M_OF[bucket]))) for si in range(n)]


def from_log(log: Path, table: dict, kinds: list) -> None:
    """Shape overrides from an earlier sweep's log (its per-shape times), against the table's bucket configs."""
    pat = re.compile(r"^(\w+) M<=(\d+)\s+(\{.*\})\s+geomean\s+[\d.]+ us\s+(\[.*\])$")
    runs = {}
    for line in log.read_text().splitlines():
        m = pat.match(line.strip())
        if m and m.group(1) in kinds:
            times = per_shape([float(t) for t in ast.literal_eval(m.group(4))], m.group(2))
            cfg = ast.literal_eval(m.group(3))
            if m.group(1) in W8A8_KINDS and cfg == QUANTIZE:      # as the sweep compared it
                if m.group(2) in ONE_LAUNCH:
                    continue
                times = [t * TWO_LAUNCHES for t in times]
            runs.setdefault((m.group(1), m.group(2)), []).append((times, cfg))
    for bucket in sorted({b for _, b in runs}, key=int):
        of_bucket = {kb: r for kb, r in runs.items() if kb[1] == bucket}
        n = min(len(t) for r in of_bucket.values() for t, _ in r)
        configs.overrides_from_runs(table, of_bucket, shapes_of(bucket)[:n], log.name)


_WEIGHTS: dict = {}     # (code, N, K) -> the weights timed (--chain: copies over 256 MB, chain_copies), made once


def weights(code: str, N: int, K: int) -> list:
    key = (code, N, K)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()        # one shape at a time: copies of the large shapes take 256 MB
        n = chain_copies(N * K) if args.chain else 1
        ws = []
        for _ in range(n):
            w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
            if code == "fp8":
                w = w.view(torch.float8_e4m3fn).float().clamp(-400, 400).to(torch.float8_e4m3fn)
            ws.append(w)
        _WEIGHTS[key] = ws
    return _WEIGHTS[key]


def timed(calls: list) -> float:
    """Time per call: one-call CUDA graphs of the first call, or with --chain all calls (one per weight copy) back to
    back in one graph (bench.decode_gemv's method)."""
    if args.chain:
        return chain_us(calls, True)
    return time_us(calls[0], mode="graph", rep_ms=40, warmup_ms=10)


def time_w8a8(cfg: dict, code: str, M: int, N: int, K: int) -> float:
    """Time of the W8A8 linear (fp16 x) with `cfg` forced, or for "quantize" the quantize kernel and the GEMM as the
    shipped tables pick it."""
    x = torch.randn(M, K, dtype=torch.float16, device=dev)
    ws = torch.rand(N, device=dev) * 0.01
    if cfg is QUANTIZE:
        fmt = "int8" if code == "int8" else "fp8_e4m3"

        def fn(w):
            data, xs, _ = G._quantize_dynamic(x, fmt, "row", 0, True)
            return G._scaled_mm_impl(data, w.t(), xs, ws, 1.0, None, "", x.dtype, code)
        return timed([lambda w=w: fn(w) for w in weights(code, N, K)])
    with G.use_config(cfg):
        return timed([lambda w=w: G.w8a8_linear(x, w, ws, dtype=code) for w in weights(code, N, K)])


ap = argparse.ArgumentParser()
ap.add_argument("--kinds", nargs="+", default=["int8", "fp8"])
ap.add_argument("--buckets", nargs="+", default=["16", "1", "128", "1024", "4096", "16384"],
                help="M buckets to tune (others keep their configs)")
ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new buckets after this long")
ap.add_argument("--from-log", type=Path, help="no timing: set shape overrides from an earlier sweep's log")
ap.add_argument("--gpu", help="with --from-log: the table to update (slug, e.g. h200)")
ap.add_argument("--chain", action="store_true",
                help="decode buckets (1 to 256): time each candidate as a decode step runs it, on weight copies "
                     "spanning >= 256 MB in one CUDA graph (bench.decode_gemv's method: no weight in L2, each call "
                     "overlapping the previous one's tail under programmatic dependent launch); buckets 32-256 on "
                     "the four Llama-3-8B projections (BATCH_SHAPES)")
args = ap.parse_args()
if args.chain and (args.from_log or any(int(b) > CHAIN_MAX for b in args.buckets)):
    ap.error(f"--chain times the decode buckets (1 to {CHAIN_MAX}) and cannot replay logs (--from-log)")
t0 = time.time()
dev = torch.device("cuda")
if args.from_log:
    path = Path(configs.__file__).parent / f"{args.gpu}.json"
    table = json.loads(path.read_text())
    from_log(args.from_log, table, args.kinds)
    path.write_text(json.dumps(table, indent=1) + "\n")
    raise SystemExit(0)
slug = gpu_slug(device_name(dev))
path = Path(configs.__file__).parent / f"{slug}.json"
table = json.loads(path.read_text()) if path.exists() else {}
for kind in args.kinds:
    table[kind] = dict(table.get(kind) or {})
    for bucket in args.buckets:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: {kind} M<={bucket} and later keep their configs", flush=True)
            break
        if kind in W8A8_KINDS and bucket not in ("1", "16"):
            continue
        cands = CANDIDATES[bucket]
        if kind in W8A8_KINDS:     # the 8-bit GEMV quantizing x reads the weights once per row: M = 1 only; at
            # M = 2..16 the tensor-core GEMV's best config alone (H200 chains: every gvt config 1.4-10x slower than
            # quantize + GEMM there, benchmarks/logs/tune_decode_h200.log: each program quantizes all its rows)
            gvt = GVT if bucket == "1" else GVT[:1]
            cands = (FUSED if bucket == "1" else []) + [dict(c, fallback=QUANTIZE) for c in gvt] + [QUANTIZE]
        elif bucket == "1":      # a GEMV config carries a tile config for the calls the GEMV does not take
            cands = [dict(c, fallback=tile_of(table[kind].get("16") or configs.DEFAULT_GEMM["16"]))
                     if c.get("path") == "gemv" else c for c in cands]
        best = None
        results = []     # (times, cfg); times ordered M-major over the bucket's shapes

        def time_config(cfg):
            times = []
            for M in M_OF[bucket]:
                for N, K in shapes_of(bucket):
                    if kind in W8A8_KINDS:
                        times.append(time_w8a8(cfg, W8A8_KINDS[kind], M, N, K))
                        continue
                    if args.chain and int(bucket) > 16:       # batched decode: as the W8A8 linear runs it
                        times.append(time_w8a8(cfg, kind, M, N, K))
                        continue
                    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, device=dev)
                    if kind == "fp8":
                        a = a.view(torch.float8_e4m3fn).float().clamp(-400, 400).to(torch.float8_e4m3fn)
                    sa, sb = torch.rand(M, device=dev), torch.rand(N, device=dev)
                    fn = (lambda w: G.int8_matmul(a, w.t(), sa, sb, out_dtype=torch.float16)) if kind == "int8" else \
                         (lambda w: G.fp8_matmul(a, w.t(), sa, sb, out_dtype=torch.bfloat16))
                    with G.use_config(cfg):
                        times.append(timed([lambda w=w: fn(w) for w in weights(kind, N, K)]))
            return times

        for cfg in cands:
            try:
                times = time_config(cfg)
            except Exception as e:   # e.g. out of shared memory
                print(f"{kind} {bucket} {cfg} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            gm = math.exp(sum(map(math.log, times)) / len(times))
            print(f"{kind} M<={bucket:5s} {cfg}  geomean {gm:8.2f} us  {['%.1f' % t for t in times]}", flush=True)
            if kind in W8A8_KINDS and cfg is QUANTIZE:      # compared as if slower (TWO_LAUNCHES), or not at all
                if bucket in ONE_LAUNCH:
                    print(f"{kind} M<={bucket:5s} quantize + GEMM: two launches, logged only (ONE_LAUNCH)", flush=True)
                    continue
                times, gm = [t * TWO_LAUNCHES for t in times], gm * TWO_LAUNCHES
            results.append((times, cfg))
            if best is None or gm < best[0]:
                best = (gm, cfg)
        paths = []
        if args.chain and int(bucket) > 16:
            # the close candidates again launched without programmatic dependent launch ("PDL": false): behind the
            # quantize kernel an early start can cost more than it hides (docs/design/gemm.md)
            paths = [dict(c, PDL=False) for t, c in results
                     if math.exp(sum(map(math.log, t)) / len(t)) < PDL_OFF_WITHIN * best[0]]
        if kind == "fp8" and bucket != "1":      # cuBLAS (torch._scaled_mm) where it is faster, our best as fallback
            paths += [dict(path="cublas", fallback=best[1])]
        if kind == "int8" and bucket in WG_BUCKETS and torch.cuda.get_device_capability(dev) == (9, 0):
            paths += [dict(c, fallback=best[1]) for c in WG]
        if kind in ("int8", "fp8") and bucket == "16":    # a tile config as the fallback
            paths += [dict(c, fallback=tile_of(best[1])) for c in GVT[:2]]
        for cfg in paths:
            try:
                times = time_config(cfg)
            except Exception as e:
                print(f"{kind} {bucket} {cfg} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            results.append((times, cfg))
            gm = math.exp(sum(map(math.log, times)) / len(times))
            print(f"{kind} M<={bucket:5s} {cfg}  geomean {gm:8.2f} us  {['%.1f' % t for t in times]}", flush=True)
            if gm < best[0]:
                best = (gm, cfg)
        table[kind][bucket] = best[1]
        if kind in W8A8_KINDS:
            table[kind]["65536"] = QUANTIZE
        print(f"==> {kind} M<={bucket}: {best[1]} ({best[0]:.2f} us, {time.time() - t0:.0f} s)", flush=True)
        configs.set_shape_overrides(table[kind], kind, bucket, shapes_of(bucket),
                                    [(per_shape(t, bucket), c) for t, c in results], best[1],
                                    configs.CHAIN_OVERRIDE_GAIN if args.chain else configs.OVERRIDE_GAIN)
        path.write_text(json.dumps(table, indent=1) + "\n")     # after every bucket: a cut-off run keeps its work
print(f"wrote {path}")

"""Pick per-M-bucket GEMM configs on this GPU and write src/qkernels/configs/<gpu>.json.
Each candidate is timed on the Llama-3-8B shapes (geometric mean). Usage:
PYTHONPATH=src python3 scripts/tune_gemm.py [--kinds int8 fp8]"""
import argparse
import json
import math
import time
from pathlib import Path

import torch

from qkernels import configs
from qkernels._runtime import device_name, gpu_slug
from qkernels.bench.harness import time_us
from qkernels.ops import gemm as G

C = lambda bm, bn, bk, w, s, g=8: dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, num_warps=w, num_stages=s)  # noqa
CANDIDATES = {
    "16": [C(16, 32, 256, 4, 4), C(16, 64, 256, 4, 4), C(16, 64, 128, 4, 5), C(16, 128, 128, 4, 4),
           C(16, 32, 512, 4, 3), C(16, 64, 512, 4, 3), C(32, 64, 256, 4, 4)],
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
M_OF = {"16": [1, 16], "128": [128], "1024": [1024], "4096": [4096]}
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]

ap = argparse.ArgumentParser()
ap.add_argument("--kinds", nargs="+", default=["int8", "fp8"])
ap.add_argument("--buckets", nargs="+", default=list(CANDIDATES), help="M buckets to tune (others keep their configs)")
ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new buckets after this long")
args = ap.parse_args()
t0 = time.time()
dev = torch.device("cuda")
slug = gpu_slug(device_name(dev))
path = Path(configs.__file__).parent / f"{slug}.json"
table = json.loads(path.read_text()) if path.exists() else {}
for kind in args.kinds:
    table[kind] = dict(table.get(kind) or {})
    for bucket in args.buckets:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: {kind} M<={bucket} and later keep their configs", flush=True)
            break
        cands = CANDIDATES[bucket]
        best = None
        for cfg in cands:
            G._gemm_config = lambda k, M, d, cfg=cfg: cfg
            times = []
            try:
                for M in M_OF[bucket]:
                    for N, K in SHAPES:
                        a = torch.randint(-128, 128, (M, K), dtype=torch.int8, device=dev)
                        w = torch.randint(-128, 128, (N, K), dtype=torch.int8, device=dev)
                        if kind == "fp8":
                            a, w = a.view(torch.float8_e4m3fn), w.view(torch.float8_e4m3fn)
                            a, w = a.float().clamp(-400, 400).to(torch.float8_e4m3fn), w.float().clamp(-400, 400).to(torch.float8_e4m3fn)
                        sa, sb = torch.rand(M, device=dev), torch.rand(N, device=dev)
                        fn = (lambda: G.int8_matmul(a, w.t(), sa, sb, out_dtype=torch.float16)) if kind == "int8" else \
                             (lambda: G.fp8_matmul(a, w.t(), sa, sb, out_dtype=torch.bfloat16))
                        times.append(time_us(fn, mode="graph", rep_ms=40, warmup_ms=10))
            except Exception as e:   # e.g. out of shared memory
                print(f"{kind} {bucket} {cfg} failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            gm = math.exp(sum(map(math.log, times)) / len(times))
            print(f"{kind} M<={bucket:5s} {cfg}  geomean {gm:8.2f} us  {['%.1f' % t for t in times]}", flush=True)
            if best is None or gm < best[0]:
                best = (gm, cfg)
        table[kind][bucket] = best[1]
        print(f"==> {kind} M<={bucket}: {best[1]} ({best[0]:.2f} us, {time.time() - t0:.0f} s)", flush=True)
        path.write_text(json.dumps(table, indent=1) + "\n")     # after every bucket: a cut-off run keeps its work
print(f"wrote {path}")

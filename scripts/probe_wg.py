"""Side-by-side timing of the "wg" weight-only kernel (kernels/_weight_only_wg.py) against fp16 cuBLAS and the
table's current config, at large M on the three Llama-3-8B shapes (CUDA-graph replay, one call, L2 flushed).
Usage: PYTHONPATH=src python3 scripts/probe_wg.py [--m 1024 4096] [--cfg BM,BN,WARPS,STAGES[,SPLIT_K[,PER_SM]] ...]
       [--sym]"""
import argparse

import torch

import qkernels as qk
from qkernels.bench.harness import time_us
from qkernels.ops import weight_only as WO

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--cfg", nargs="+", default=["256,128,8,4", "256,128,8,3"])
    ap.add_argument("--sym", action="store_true", help="symmetric weights (integer zero points)")
    ap.add_argument("--dtype", default="float16")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    dev = torch.device("cuda")
    table_cfg = WO.config_for
    for N, K in SHAPES:
        w = torch.randn(N, K, device=dev, dtype=dt) / K ** 0.5
        pw = qk.PackedWeight.from_float(w, 4, 128, symmetric=a.sym)
        for M in a.m:
            x = torch.randn(M, K, device=dev, dtype=dt)
            fp = time_us(lambda: torch.nn.functional.linear(x, w), mode="graph", rep_ms=50)
            cols = [f"N={N:5d} K={K:5d} M={M:5d} fp16 {fp:7.1f}"]
            t = time_us(lambda: WO._weight_only(x, pw, None, 4, "probe"), mode="graph", rep_ms=50)
            cols.append(f"table {t:7.1f} ({fp / t:.2f}x)")
            ref = WO._weight_only(x, pw, None, 4, "probe")
            for spec in a.cfg:
                bm, bn, nw, st, *split = (int(v) for v in spec.split(","))
                cfg = dict(path="wg", BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=st, num_warps=nw)
                if split:       # K split up to SPLIT_K ways while the grid has fewer than PER_SM (2) programs per SM
                    sms = torch.cuda.get_device_properties(0).multi_processor_count
                    cfg.update(SPLIT_K=split[0], MIN_PROGRAMS=(split[1] if len(split) > 1 else 2) * sms)
                WO.config_for = lambda *args, cfg=cfg: cfg
                got = WO._weight_only(x, pw, None, 4, "probe")
                err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                t = time_us(lambda: WO._weight_only(x, pw, None, 4, "probe"), mode="graph", rep_ms=50)
                cols.append(f"wg{spec} {t:7.1f} ({fp / t:.2f}x, err {err:.1e})")
            WO.config_for = table_cfg
            print(" | ".join(cols), flush=True)


if __name__ == "__main__":
    main()

"""Workloads for Nsight Compute: compile / warm up every case, then run each once between
cudaProfilerStart / Stop, so `ncu --profile-from-start off` sees exactly one launch of each kernel.

  ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats python3 scripts/profile_ncu.py [case ...]

Cases: wo1 (W4A16 g128 M=1), wo2, wo16, wo32, wo64 (M=2, 16, 32, 64), w8-32 (W8A16 M=32), tc1 / tc1-nosplit (the
tc kernel at M=1), gv1 / gv1-ring (the paired-fp16 GEMV at M=1: its default config; one warp per program with a
3-stage async-copy ring), gvt1 / gvt16
(the tensor-core GEMV at M=1, 16), gvt16-ring / gvt16-cta (its code ring, one warp a program and four),
gvt8 (its 8-bit codes at M=1), wo128, w8 (W8A16 M=1),
wg1024 / fp16-1024 (the wg kernel and cuBLAS at M=1024), fp16-1 / fp16-16 / fp16-32 / fp16-64 (cuBLAS), int8 (core
GEMM M=4096 4096x4096, ours and torch._int_mm), w8a8 (w8a8_linear M=4096), w4a8-16 / w4a8-64 / w4a8-128
(w4a8_linear at those M), marlin-16 / marlin-32 (Marlin's layer, built by scripts/build_marlin.sh and on
PYTHONPATH). Shape N x K: 14336 x 4096
unless --nk says otherwise.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import qkernels  # noqa: E402
from qkernels.ops import w4a8  # noqa: E402
from qkernels.ops import weight_only as WO  # noqa: E402


def _with_config(cfg, fn):
    with WO.use_config(cfg):
        return fn()


def _forced(path, x, pw):
    with WO.force_path(path):
        return WO._weight_only(x, pw, None, pw.bits, path)


def cases(n: int, k: int, dev: str = "cuda"):
    w = torch.randn(n, k, device=dev, dtype=torch.float16) / k ** 0.5
    pw4 = qkernels.PackedWeight.from_float(w, bits=4, group_size=128, symmetric=False)
    pw8 = qkernels.PackedWeight.from_float(w, bits=8, group_size=-1, symmetric=True)
    xs = {m: torch.randn(m, k, device=dev, dtype=torch.float16) for m in (1, 2, 16, 32, 64, 128, 1024, 4096)}
    a8 = torch.randint(-128, 128, (4096, k), device=dev, dtype=torch.int8)
    w8 = torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8)
    ws = torch.rand(n, device=dev) / 100
    return {
        "wo1": lambda: qkernels.w4a16_linear(xs[1], pw4),
        "wo2": lambda: qkernels.w4a16_linear(xs[2], pw4),
        "wo16": lambda: qkernels.w4a16_linear(xs[16], pw4),
        # batched decode, the table's configs (W4A16 and W8A16), and cuBLAS at the same M
        "wo32": lambda: qkernels.w4a16_linear(xs[32], pw4),
        "wo64": lambda: qkernels.w4a16_linear(xs[64], pw4),
        "w8-32": lambda: qkernels.w8a16_linear(xs[32], pw8),
        "fp16-32": lambda: torch.nn.functional.linear(xs[32], w),
        "fp16-64": lambda: torch.nn.functional.linear(xs[64], w),
        # the Gluon tc kernel at M = 1: its default config (split-K) and one program column per row block
        "tc1": lambda: _forced("tc", xs[1], pw4),
        "tc1-nosplit": lambda: _with_config(dict(path="tc", BLOCK_N=32, BLOCK_M=8, num_warps=2),
                                            lambda: qkernels.w4a16_linear(xs[1], pw4)),
        "gv1": lambda: _forced("gv", xs[1], pw4),
        "gv1-ring": lambda: _with_config(dict(path="gv", BLOCK_N=8, BLOCK_K=1024, WPT=4, num_warps=1, STAGES=3),
                                         lambda: qkernels.w4a16_linear(xs[1], pw4)),
        # the tensor-core GEMV at M = 1 and 16 (its default config)
        "gvt1": lambda: _forced("gvt", xs[1], pw4),
        "gvt16": lambda: _forced("gvt", xs[16], pw4),
        # gvt at M = 16 as the H200 sweeps have it: one warp of four row tiles over a three-stage code ring, K split 4
        # (the table's 14336x4096 entry), and on Marlin's schedule (four warps of four tiles, six stages, K split 2)
        "gvt16-ring": lambda: _with_config(dict(path="gvt", TILES=4, WPT=4, num_warps=1, STAGES=3, SPLIT_K=4,
                                                MIN_PROGRAMS=2048), lambda: qkernels.w4a16_linear(xs[16], pw4)),
        "gvt16-cta": lambda: _with_config(dict(path="gvt", TILES=16, WPT=4, num_warps=4, STAGES=6, SPLIT_K=2,
                                               MIN_PROGRAMS=264), lambda: qkernels.w4a16_linear(xs[16], pw4)),
        "gvt8": lambda: _forced("gvt", xs[1], pw8),
        # the TMA-ring GEMV at M = 1 and 16 (its default config)
        "wo128": lambda: qkernels.w4a16_linear(xs[128], pw4),
        "w8": lambda: qkernels.w8a16_linear(xs[1], pw8),
        # the Gluon wgmma kernel (WG_DEFAULT tiles) and cuBLAS at M = 1024
        "wg1024": lambda: _forced("wg", xs[1024], pw4),
        "fp16-1024": lambda: torch.nn.functional.linear(xs[1024], w),
        "fp16-1": lambda: torch.nn.functional.linear(xs[1], w),
        "fp16-16": lambda: torch.nn.functional.linear(xs[16], w),
        "int8": lambda: (qkernels.int8_matmul(a8, w8.t()), torch._int_mm(a8, w8.t())),
        "w8a8": lambda: qkernels.w8a8_linear(xs[4096], w8, ws),
        # W4A8-FP8 (the op: this GPU's table config for the shape, or its M bucket's) at batched decode
        "w4a8-16": lambda: w4a8.w4a8_linear(xs[16], pw4),
        "w4a8-64": lambda: w4a8.w4a8_linear(xs[64], pw4),
        "w4a8-128": lambda: w4a8.w4a8_linear(xs[128], pw4),
        # Marlin (scripts/build_marlin.sh, its site on PYTHONPATH), made as bench decode-gemv makes it
        "marlin-16": lambda: _marlin(w)(xs[16]),
        "marlin-32": lambda: _marlin(w)(xs[32]),
    }


_MARLIN = {}


def _marlin(w):
    """Marlin's layer of w (built once: its packing runs on the host)."""
    if id(w) not in _MARLIN:
        import marlin
        from qkernels.bench.peers import _marlin_maker
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        lin.weight.data = w
        _MARLIN[id(w)] = _marlin_maker(marlin, lin, w.device)()
    return _MARLIN[id(w)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--nk", default="14336x4096")
    ap.add_argument("--cpu-check", action="store_true", help="run each case once on the CPU (interpreter)")
    a = ap.parse_args()
    n, k = (int(v) for v in a.nk.split("x"))
    table = cases(n, k, "cpu" if a.cpu_check else "cuda")
    if a.cpu_check:
        for name in a.cases or [n for n in table if not n.startswith("marlin")]:     # Marlin: GPU only
            table[name]()
        print("cpu check ok")
        return
    names = a.cases or list(table)
    for name in names:       # compile and warm up outside the profiled range
        table[name]()
        table[name]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name in names:
        table[name]()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", " ".join(names), f"N x K = {n} x {k}")


if __name__ == "__main__":
    main()

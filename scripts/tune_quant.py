"""Sweep the tile sizes of the memory-bound quantize kernels on a GPU (qkernels.ops.quant.TILES)
and print % of the copy bandwidth per setting. Usage: PYTHONPATH=src python3 scripts/tune_quant.py"""
import itertools

import torch

import qkernels as qk
from qkernels.bench.harness import copy_bandwidth_gbps, time_us
from qkernels.ops import quant as Q

dev = torch.device("cuda")
bw = copy_bandwidth_gbps(dev)
print(f"copy bandwidth {bw:.0f} GB/s")


def measure(name, fn, nbytes, settings):
    for st in settings:
        with Q.tiles(**st):
            us = time_us(fn)
        print(f"{name:34s} {str(st):60s} {us:8.2f} us  {100 * nbytes / (us * 1e-6) / 1e9 / bw:5.1f}%")


x = torch.randn(50_000_000, device=dev)
s, z = torch.tensor(0.03, device=dev), torch.tensor(128, dtype=torch.int32, device=dev)
measure("static int8 50M", lambda: qk.quantize(x, "int8", symmetric=False, scale=s, zero_point=z), x.numel() * 5,
        [dict(flat_min=b, flat_max=b, flat_warps=w) for b, w in itertools.product([2048, 4096, 8192, 16384], [4, 8, 16])])
del x
for (M, K) in [(16384, 4096), (4096, 14336)]:
    x = torch.randn(M, K, device=dev, dtype=torch.float16)
    measure(f"int4 g128 dyn {M}x{K}", lambda: qk.quantize(x, "int4", "group", group_size=128), M * K * 2.5 + M * K // 32,
            [dict(seg_tile_group=t, seg_warps=w) for t, w in itertools.product([2048, 4096, 8192], [2, 4, 8])])
    measure(f"int8 row dyn {M}x{K}", lambda: qk.quantize(x, "int8", "row"), M * K * 3 + M * 4,
            [dict(seg_tile_row=t, seg_warps=w, seg_warps_max=w) for t, w in itertools.product([4096, 8192, 16384], [4, 8, 16])])

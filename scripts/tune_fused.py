"""Sweep the tiles of the fused norm / SwiGLU / softmax kernels on a GPU (qkernels.ops.fused.TILES)
and print time and % of the copy bandwidth per setting, best first per case.
Usage: PYTHONPATH=src python3 scripts/tune_fused.py"""
import itertools

import torch

import qkernels as qk
from qkernels.bench.harness import copy_bandwidth_gbps, time_us
from qkernels.ops.fused import tiles

dev = torch.device("cuda")
bw = copy_bandwidth_gbps(dev)
print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
dt = torch.bfloat16
ROWS = [dict(elems_per_warp=e, elems_per_warp_quant=e, rows_tile=r, max_warps=mw)
        for e, r, mw in itertools.product([256, 512, 1024, 2048], [4096, 8192, 16384], [16, 32])]
LONG = [dict(max_block=mb, loop_block=lb, elems_per_warp_quant=e)
        for mb, lb, e in itertools.product([8192, 16384], [2048, 4096, 8192], [256, 512, 1024])]
SILU = [dict(silu_block=b, rows_tile=r, elems_per_warp=e)
        for b, r, e in itertools.product([512, 1024, 2048, 4096], [4096, 8192, 16384], [256, 512, 1024])]


def measure(name, fn, nbytes, settings, mode="eager"):
    res = []
    for st in settings:
        with tiles(**st):
            try:
                us = time_us(fn, mode=mode, rep_ms=100)
            except Exception as e:       # e.g. out of registers / shared memory
                print(f"{name} {st}: {type(e).__name__}")
                continue
        res.append((us, st))
    res.sort(key=lambda r: r[0])
    for us, st in res[:4]:
        print(f"{name:30s} {str(st):70s} {us:8.2f} us {100 * nbytes / (us * 1e-6) / 1e9 / bw:5.1f}%", flush=True)
    print(f"{name:30s} worst {res[-1][0]:.2f} us", flush=True)


T, H = 16384, 4096
x = torch.randn(T, H, device=dev, dtype=dt)
w = torch.rand(H, device=dev, dtype=dt) + 0.5
import sys
QUICK = "--quant" in sys.argv      # only the quantizing kernels
if not QUICK:
    measure("rms_norm 16384x4096", lambda: qk.rms_norm(x, w), 2 * T * H * 2, ROWS)
measure("rms_norm int8 16384x4096", lambda: qk.rms_norm(x, w, quantize="int8"), T * H * 3 + 4 * T, ROWS)
if not QUICK:
    measure("softmax 16384x4096", lambda: qk.softmax(x), 2 * T * H * 2, ROWS)
    x1 = x[:1].clone()
    measure("rms_norm 1x4096 graph", lambda: qk.rms_norm(x1, w), 0, ROWS[:12], mode="graph")
del x
for (T, I) in [(16384, 4096), (4096, 14336)]:
    gu = torch.randn(T, 2 * I, device=dev, dtype=dt)
    if not QUICK:
        measure(f"silu {T}x{I}", lambda: qk.silu_and_mul(gu), 3 * T * I * 2, SILU)
    measure(f"silu int8 {T}x{I}", lambda: qk.silu_and_mul(gu, quantize="int8"), T * I * 5 + 4 * T,
            ROWS if I <= 4096 else LONG + ROWS[:12])
    del gu

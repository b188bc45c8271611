"""Host cost of eager calls (no GPU waiting; `qkernels bench host`'s calls and more): our ops and layers with the
direct launch (_runtime.launch's cache; layers and weight-only ops then replay their first call's launches:
ops/_eager.py) and through Triton's own launch path (QKERNELS_FAST_LAUNCH=0 behaviour), against torch calls on the
same host, then a cProfile of the w4a16 and w8a8 eager calls and of F.linear.
Usage: PYTHONPATH=src python3 scripts/profile_host.py [CALL ...]   (CALL: cProfile only these calls, by name)"""
import cProfile
import pstats
import sys

import torch

import qkernels as qk
from qkernels import _runtime as R
from qkernels.bench.harness import host_us
from qkernels.bench.host import cases

dev = torch.device("cuda")
K = N = 4096
calls = {name: fn for name, (_, fn) in cases(dev, N, K).items()}     # what `qkernels bench host` times
x = torch.randn(1, K, device=dev, dtype=torch.float16)
x16 = torch.randn(16, K, device=dev, dtype=torch.float16)
w = torch.randn(N, K, device=dev, dtype=torch.float16)
pw4 = qk.PackedWeight.from_float(w, 4, 128)
wq = qk.quantize(w, "int8", "row")
xq = qk.quantize(x16, "int8", "row")
ws = wq.scale.reshape(-1)
wf8 = qk.quantize(w, "fp8_e4m3", "row")
wf8s = wf8.scale.reshape(-1)
calls.update({
    "torch.add (one tiny kernel)": lambda: torch.add(x, x),
    "w4a16_linear M=16": lambda: qk.w4a16_linear(x16, pw4),
    "w8a8_linear M=16": lambda: qk.w8a8_linear(x16, wq.data, ws),
    "fp8_matmul M=1 scaled": lambda: qk.fp8_matmul(wf8.data[:1], wf8.data.t(), wf8s[:1], wf8s,
                                                   out_dtype=torch.float16),
    "int8_matmul M=16 (exact)": lambda: qk.int8_matmul(xq.data, wq.data.t()),
    "int8_matmul M=16 scaled": lambda: qk.int8_matmul(xq.data, wq.data.t(), xq.scale, ws),
    "quantize row int8 M=16": lambda: qk.quantize(x16, "int8", "row"),
    "rms_norm M=1": lambda: qk.rms_norm(x, w[0]),
})
profiled = sys.argv[1:] or ["w4a16_linear", "QuantizedLinear w8a8", "QuantizedLinear w8a8-fp8", "F.linear fp16"]
print(f"{'call':32s} {'direct launch':>14s} {'triton launch':>14s}  (host us / call)")
for name, fn in calls.items():
    if sys.argv[1:] and name not in profiled + ["F.linear fp16"]:
        continue
    with R.fast_launch(True):
        fast = host_us(fn)
    with R.fast_launch(False):
        slow = host_us(fn)
    print(f"{name:32s} {fast:14.1f} {slow:14.1f}", flush=True)
for name in profiled:
    fn = calls[name]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(2000):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    print(f"\n==== cProfile: {name}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)

"""Host cost of eager calls (no GPU waiting): our ops against a bare Triton launch and torch, and a
cProfile of the w4a16 eager call. Usage: PYTHONPATH=src python3 scripts/profile_host.py"""
import cProfile
import pstats

import torch
import torch.nn.functional as F

import qkernels as qk
from qkernels.bench.harness import host_us

dev = torch.device("cuda")
K = N = 4096
x = torch.randn(1, K, device=dev, dtype=torch.float16)
w = torch.randn(N, K, device=dev, dtype=torch.float16)
pw4 = qk.PackedWeight.from_float(w, 4, 128)
pw8 = qk.PackedWeight.from_float(w, 8, -1, symmetric=True)
wq = qk.quantize(w, "int8", "row")
xq = qk.quantize(x, "int8", "row")
calls = {
    "F.linear fp16": lambda: F.linear(x, w),
    "torch.add (one tiny kernel)": lambda: torch.add(x, x),
    "w4a16_linear": lambda: qk.w4a16_linear(x, pw4),
    "w8a16_linear": lambda: qk.w8a16_linear(x, pw8),
    "w8a8_linear": lambda: qk.w8a8_linear(x, wq.data, wq.scale.reshape(-1)),
    "int8_matmul": lambda: qk.int8_matmul(xq.data, wq.data.t()),
    "quantize row int8": lambda: qk.quantize(x, "int8", "row"),
    "rms_norm": lambda: qk.rms_norm(x, w[0]),
}
for name, fn in calls.items():
    print(f"{name:32s} host {host_us(fn):7.1f} us / call", flush=True)
fn = calls["w4a16_linear"]
pr = cProfile.Profile()
pr.enable()
for _ in range(2000):
    fn()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)

"""Host cost of eager calls (no GPU waiting; `qkernels bench host`'s calls and more): our ops and layers with the
direct launch (_runtime.launch's cache; linears then replay their earlier calls' launches: ops/_eager.py) and
through Triton's own launch path (QKERNELS_FAST_LAUNCH=0 behaviour), against torch calls on the same host, then a
cProfile of chosen calls. Under torch.inference_mode, as `bench host` times them.
--trace: where each chosen call's time goes instead: the host time of back-to-back calls, the GPU time per call
(CUDA events around back-to-back calls), a waited-for call, the direct-launch cache entries the calls added (0: every
launch hit) and the launches replayed from eager plans per call, each with and without programmatic dependent
launch; then torch.profiler's CPU-side table of 20 calls.
Usage: PYTHONPATH=src python3 scripts/profile_host.py [--trace] [CALL ...]   (CALL: only these calls, by name)"""
import cProfile
import pstats
import sys
import time

import torch

import qkernels as qk
from qkernels import _runtime as R
from qkernels.bench.harness import host_us
from qkernels.bench.host import cases
from qkernels.ops import _eager

torch.inference_mode().__enter__()      # the whole script, as `bench host` times its calls
trace = "--trace" in sys.argv[1:]
names = [a for a in sys.argv[1:] if a != "--trace"]
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
    "quantize row fp8 M=1": lambda: qk.quantize(x, "fp8_e4m3", "row"),
    "torch.empty [1, N]": lambda: torch.empty((1, N), dtype=torch.float16, device=dev),
})
profiled = names or ["w4a16_linear", "QuantizedLinear w8a8", "QuantizedLinear w8a8-fp8", "F.linear fp16"]


def gpu_us(fn, n=200):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / n * 1e3


def waited_us(fn, n=100):
    t = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    return sorted(t)[n // 2] * 1e6


def replays_per_call(fn, n=50):
    real, count = _eager.replay, [0]
    _eager.replay = lambda rec, args: (count.__setitem__(0, count[0] + 1), real(rec, args))
    try:
        for _ in range(n):
            fn()
    finally:
        _eager.replay = real
    return count[0] / n


if trace:
    print(f"{'call':32s} {'pdl':>5s} {'host us':>8s} {'gpu us':>8s} {'waited':>8s} {'new cache entries':>18s} "
          f"{'replayed launches':>18s}")
    for name in profiled + (["F.linear fp16"] if "F.linear fp16" not in profiled else []):
        fn = calls[name]
        for pdl in (True, False):
            with R.pdl(pdl):
                fn()
                fn()                # w8a8_linear records on a weight's second call
                torch.cuda.synchronize()
                n0 = len(R._LAUNCHES)
                host = host_us(fn)
                grown = len(R._LAUNCHES) - n0
                print(f"{name:32s} {str(pdl):>5s} {host:8.1f} {gpu_us(fn):8.1f} {waited_us(fn):8.1f} {grown:18d} "
                      f"{replays_per_call(fn):18.1f}", flush=True)
    for name in profiled:
        fn = calls[name]
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(f"\n==== torch.profiler: {name}, 20 calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=50))
    raise SystemExit(0)
print(f"{'call':32s} {'direct launch':>14s} {'triton launch':>14s}  (host us / call)")
for name, fn in calls.items():
    if names and name not in profiled + ["F.linear fp16"]:
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

"""Where an eager call's time goes at decode size (M = 1, weight 4096x4096), under torch.inference_mode as
`qkernels bench host` times it. Per call: the host time of back-to-back calls (harness.host_us), the GPU time per call
(CUDA events around back-to-back calls), the time of a call that is waited for, and the direct-launch cache entries
the calls added (0: every launch hit), each with and without programmatic dependent launch. Then each layer's eager
plan (ops/_eager.py: kept or not, its allocations and launches, the replay alone) and torch.profiler's CPU-side
and GPU-side tables of 20 calls.
Usage: PYTHONPATH=src python3 scripts/trace_eager.py [CALL ...]   (CALL: names below; default all)"""
import sys
import time

import torch
import torch.nn.functional as F

import qkernels as qk
from qkernels import _runtime as R
from qkernels.bench.harness import host_us


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
    torch.cuda.synchronize()
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    return sorted(t)[n // 2] * 1e6


def main():
    dev = torch.device("cuda")
    K = N = 4096
    x = torch.randn(1, K, device=dev, dtype=torch.float16)
    x3 = x.reshape(1, 1, K)
    lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
    w = lin.weight.detach()
    wq = qk.quantize(w, "int8", "row")
    wf = qk.quantize(w, "fp8_e4m3", "row")
    pw4 = qk.PackedWeight.from_float(w, 4, 128)
    layers = {s: qk.QuantizedLinear.from_linear(lin, s) for s in ("w4a16", "w8a8", "w8a8-fp8")}
    calls = {
        "F.linear": lambda: F.linear(x, w),
        "torch.empty": lambda: torch.empty((1, N), dtype=torch.float16, device=dev),
        "w8a8 int8": lambda: qk.w8a8_linear(x, wq.data, wq.scale.reshape(-1)),
        "w8a8 fp8": lambda: qk.w8a8_linear(x, wf.data, wf.scale.reshape(-1), dtype="fp8"),
        "quantize fp8 row": lambda: qk.quantize(x, "fp8_e4m3", "row"),
        "w4a16": lambda: qk.w4a16_linear(x, pw4),
        **{f"layer {s}": (lambda m=m: m(x3)) for s, m in layers.items()},
    }
    names = sys.argv[1:] or list(calls)
    print(f"{'call':20s} {'pdl':>5s} {'host us':>8s} {'gpu us':>8s} {'waited':>8s} {'new cache entries':>18s}")
    for name in names:
        fn = calls[name]
        for pdl in (True, False):
            with R.pdl(pdl):
                fn()
                torch.cuda.synchronize()
                n0 = len(R._LAUNCHES)
                host = host_us(fn)
                grown = len(R._LAUNCHES) - n0
                print(f"{name:20s} {str(pdl):>5s} {host:8.1f} {gpu_us(fn):8.1f} {waited_us(fn):8.1f} {grown:18d}",
                      flush=True)
    print(f"replay_state(): {host_us(R.replay_state):.2f} us")
    for s, m in layers.items():
        m(x3)
        m(x3)           # w8a8 layers record from the second call on their weight tensor
        owner = m.packed_weight() if m.scheme.weight_only else m.weight
        store = owner.__dict__.get("_eager_plans")
        for key, plan in (store or {}).items():
            print(f"layer {s}: {type(plan).__name__} allocs={getattr(plan, 'allocs', None)} "
                  f"launches={len(getattr(plan, 'launches', ()))} temp_bytes={getattr(plan, 'temp_bytes', None)}")
            if plan:
                print(f"   the replay alone: {host_us(lambda: plan(x3)):.1f} us")
    for name in names:
        fn = calls[name]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(f"\n==== {name}: 20 calls")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10, max_name_column_width=50))


if __name__ == "__main__":
    with torch.inference_mode():
        main()

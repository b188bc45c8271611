"""`qkernels bench host`: the host cost of one eager call of a linear at decode size (M = 1), for every scheme, as
a user calls it: the layer (`QuantizedLinear`, what `quantize_` puts in a model) and the functional op, beside
`F.linear` and `nn.Linear` in fp16 on the same host, in the same run.

Method: wall time per call of 100 back-to-back eager calls that are not waited for, median over 20 such batches
per provider, the providers timed in turns (harness.host_us_interleaved: one batch of each per round, the order
rotating, so a drift of the host's speed during the run falls on all of them alike). Each provider is called once
before (a linear's eager plan is recorded by its first call, or its weight tensor's second for `w8a8_linear`:
ops/_eager.py). Under torch.inference_mode; weight 4096 x 4096, x [1, 4096] fp16 (the layer gets [1, 1, 4096], as
a decoder passes it). The GPU's own time per call is not in it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import qkernels as qk

from .harness import Row, format_table, host_us_interleaved, method_text, on_gpu, write_json

SCHEMES = ("w4a16", "w8a16", "w8a8", "w8a8-fp8")
TARGET = 1.3        # an eager call of any quantized linear: at most this many times F.linear's host cost
BASELINE = "F.linear fp16"


def cases(dev: torch.device, N: int, K: int) -> dict:
    """{provider: (scheme, call)} of the eager calls timed: fp16 baselines, then per scheme the layer and the
    functional op on the same weight (also scripts/profile_host.py's)."""
    torch.manual_seed(0)
    x = torch.randn(1, K, device=dev, dtype=torch.float16)
    x3 = x.reshape(1, 1, K)
    lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
    w = lin.weight.detach()
    out = {BASELINE: ("fp16", lambda: F.linear(x, w)),
           "nn.Linear fp16": ("fp16", lambda: lin(x3))}
    fp8 = not on_gpu() or torch.cuda.get_device_capability(dev) >= (8, 9)
    for s in SCHEMES:
        if s == "w8a8-fp8" and not fp8:
            continue
        m = qk.QuantizedLinear.from_linear(lin, s)
        out[f"QuantizedLinear {s}"] = (s, lambda m=m: m(x3))
    pw4 = qk.PackedWeight.from_float(w, 4, 128, symmetric=False)
    pw8 = qk.PackedWeight.from_float(w, 8, -1, symmetric=True)
    wq = qk.quantize(w, "int8", "row")
    out["w4a16_linear"] = ("w4a16", lambda: qk.w4a16_linear(x, pw4))
    out["w8a16_linear"] = ("w8a16", lambda: qk.w8a16_linear(x, pw8))
    out["w8a8_linear int8"] = ("w8a8", lambda: qk.w8a8_linear(x, wq.data, wq.scale.reshape(-1)))
    if fp8:
        wf = qk.quantize(w, "fp8_e4m3", "row")
        out["w8a8_linear fp8"] = ("w8a8-fp8", lambda: qk.w8a8_linear(x, wf.data, wf.scale.reshape(-1), dtype="fp8"))
    return out


def run(out_root: str = "benchmarks/results") -> list[Row]:
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    N = K = 4096 if gpu else 128
    timing = {} if gpu else {"batch": 1, "batches": 3}     # the interpreter: a few calls show the path works
    rows = []
    with torch.inference_mode():       # as inference runs: no autograd bookkeeping in any provider's call
        calls = cases(dev, N, K)
        us = host_us_interleaved({prov: fn for prov, (_, fn) in calls.items()}, **timing)
        for prov, (scheme, _) in calls.items():
            rows.append(Row("linear_host", prov, us[prov], "eager", {"M": 1, "N": N, "K": K}, {"scheme": scheme}))
    base = next(r.median_us for r in rows if r.provider == BASELINE)
    for r in rows:
        r.extra["x_F.linear"] = r.median_us / base
    path = write_json("host", rows, out_root, {"method": method_text(__doc__, gpu, f"weight {N} x {K}")})
    print(format_table(rows, ["provider", "scheme", "M", "N", "K", "median_us", "x_F.linear"]))
    print(f"wrote {path}")
    return rows

"""`qkernels bench weight-only`: W4A16 / W8A16 linears on Llama-3-8B shapes against fp16 and bf16
cuBLAS, PyTorch's tinygemm int4 (`aten._weight_int4pack_mm`, bf16, group 128) and the weight-only peers installed
(gemlite w4a16 g128 and w8a16, bitsandbytes nf4: bench/peers.py), at every M from decode to prefill, in one run.

Reports GPU time (CUDA-graph replay, L2 flushed; "graph8" for M <= 16: per call of 8 calls on 8 weight
copies in one graph, as a model's decode graph runs its layers), the plain eager call, the host cost of one call
(`host_us`, measured apart from GPU time), GB/s of weight bytes, and speedup over fp16. "sm_80 paths": the same
w4a16 layer with the kernels a GPU of compute capability 8.0 gets (simulated: no wgmma kernel), on this GPU.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

import qkernels as qk

from .harness import (Row, format_table, host_us, merge_results, on_gpu, plot, read_results, results_doc, time_us,
                      write_json)
from .peers import peers, try_tinygemm

SHAPES_GPU = [(4096, 4096), (14336, 4096), (4096, 14336)]   # (N, K)
MS_GPU = [1, 2, 4, 8, 16, 32, 64, 128, 1024, 4096]
# mode "graph8" (decode sizes): 8 calls in one CUDA graph, each on its own copy of the weight (as 8 layers of a
# model: no copy is in L2 when its call runs), time per call. Plain "graph" replays one call per graph: its time
# holds the replay's launch latency and follows do_bench's L2 flush (3-11 us more per call on the H100).
LAYERS = 8
LAYERS_MAX_M = 16
SHAPES_CPU = [(64, 128)]
MS_CPU = [1, 16]


def _copy(v):
    """A separate copy (distinct memory, same values) of a provider's weight."""
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, tuple):      # tinygemm (packed, scales_and_zeros, bytes)
        return (v[0].clone(), v[1].clone(), v[2])
    return dataclasses.replace(v, qweight=v.qweight.clone(), scale_zero=v.scale_zero.clone())


def _cycling(op, copies: list):
    """op on the next of the weight copies per call (LAYERS consecutive calls: every copy once)."""
    state = [0]

    def fn():
        state[0] += 1
        return op(copies[state[0] % len(copies)])
    return fn


def _as_sm80(op, *args):
    """op(*args) choosing its kernels as on a GPU of compute capability 8.0 (programmatic dependent launch, decided
    once per device, stays as this GPU has it)."""
    from .._runtime import simulate_capability
    with simulate_capability((8, 0)):
        return op(*args)


def run(out_root: str = "benchmarks/results", ms=None) -> list[Row]:
    """ms: only these M of the grid (default all); their rows then replace those of the GPU's earlier
    weight_only.json and its other rows stay (harness.merge_results), so a long run can be split into parts."""
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    grid = MS_GPU if gpu else MS_CPU
    if ms:
        ms = [int(m) for m in ms]
        if not set(ms) <= set(grid):
            raise ValueError(f"ms must be among the grid's M {list(grid)}, got {ms}")
    shapes = [(M, N, K) for (N, K) in (SHAPES_GPU if gpu else SHAPES_CPU) for M in grid if not ms or M in ms]
    rows: list[Row] = []
    packed = {}
    missing: list = []
    for M, N, K in shapes:
        if (N, K) not in packed:
            w = torch.randn(N, K, device=dev, dtype=torch.float16) / K ** 0.5
            packed = {(N, K): dict(
                w=w, wb=w.bfloat16(),
                w4g128a=qk.PackedWeight.from_float(w, 4, 128, symmetric=False),
                w4g128s=qk.PackedWeight.from_float(w, 4, 128, symmetric=True),
                w4g64a=qk.PackedWeight.from_float(w, 4, 64, symmetric=False),
                w4g64s=qk.PackedWeight.from_float(w, 4, 64, symmetric=True),
                w8=qk.PackedWeight.from_float(w, 8, -1, symmetric=True),
                tiny=try_tinygemm(w) if gpu else None)}
            if gpu:     # the peers' layers, made from an fp16 linear of the same weight
                lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16).requires_grad_(False)
                lin.weight.copy_(w)
                found, missing = peers(lin, dev, kinds=("w4a16", "w8a16", "nf4"))
                packed[(N, K)]["makers"] = {name: make for name, (make, _) in found.items()}
                for name, (make, nbytes) in found.items():
                    packed[(N, K)][name] = make()
                    packed[(N, K)][name + " bytes"] = nbytes
        P = packed[(N, K)]
        x = torch.randn(M, K, device=dev, dtype=torch.float16)
        xb = x.bfloat16()
        fp16_bytes = N * K * 2
        # (provider, weight key in P, weight bytes, call on a weight)
        cases = []
        if gpu:
            cases += [("fp16 cuBLAS", "w", fp16_bytes, lambda w: F.linear(x, w)),
                      ("bf16 cuBLAS", "wb", fp16_bytes, lambda w: F.linear(xb, w))]
            if P["tiny"] is not None:
                cases.append(("tinygemm int4 g128 (bf16)", "tiny", P["tiny"][2],
                              lambda w: torch.ops.aten._weight_int4pack_mm(xb, w[0], 128, w[1])))
        for key, name in (("w4g128a", "qkernels w4a16 g128 asym"), ("w4g128s", "qkernels w4a16 g128 sym"),
                          ("w4g64a", "qkernels w4a16 g64 asym"), ("w4g64s", "qkernels w4a16 g64 sym")):
            cases.append((name, key, P[key].nbytes, lambda w: qk.w4a16_linear(x, w)))
        cases.append(("qkernels w8a16 per-channel", "w8", P["w8"].nbytes, lambda w: qk.w8a16_linear(x, w)))
        if gpu:     # the kernels an sm_80 GPU (A100) gets on the same shapes: no wgmma kernel, its tables' fallbacks
            cases.append(("qkernels w4a16 g128 asym, sm_80 paths", "w4g128a", P["w4g128a"].nbytes,
                          lambda w: _as_sm80(qk.w4a16_linear, x, w)))
        for name in P.get("makers", {}):
            cases.append((name, name, P[name + " bytes"], lambda layer: layer(x)))
        modes = ("graph", "eager") if gpu else ("eager",)
        if gpu and M <= LAYERS_MAX_M:
            modes = ("graph", "graph8", "eager")
            layers = P.setdefault("layers", {k: [P["makers"][k]() if k in P.get("makers", {}) else _copy(P[k])
                                                 for _ in range(LAYERS)] for _, k, _, _ in cases})
        for prov, key, nbytes, op in cases:
            fn = functools.partial(op, P[key])
            for mode in modes:
                try:
                    with torch.inference_mode():
                        if mode == "graph8":
                            us = time_us(_cycling(op, layers[key]), mode="graph", calls=LAYERS, rep_ms=60,
                                         warmup_ms=15)
                        else:
                            us = time_us(fn, mode=mode, rep_ms=60 if mode == "graph" else 30, warmup_ms=15)
                except Exception as e:      # a peer that cannot run this case: say so, go on
                    print(f"{N}x{K} M={M} {prov} {mode}: failed: {type(e).__name__}: {str(e)[:160]}")
                    continue
                extra = {"shape": f"{N}x{K}", "weight_gbps": nbytes / (us * 1e-6) / 1e9, "weight_bytes": nbytes}
                if mode == "eager" and M == 1 and gpu:
                    with torch.inference_mode():
                        extra["host_us"] = host_us(fn)
                rows.append(Row("weight_only_linear", prov, us, mode, {"M": M, "N": N, "K": K}, extra))
        del x, xb
    base = {(r.sizes["M"], r.sizes["N"], r.sizes["K"], r.mode): r.median_us for r in rows if r.provider == "fp16 cuBLAS"}
    tiny = {(r.sizes["M"], r.sizes["N"], r.sizes["K"], r.mode): r.median_us for r in rows
            if r.provider.startswith("tinygemm")}
    for r in rows:
        key = (r.sizes["M"], r.sizes["N"], r.sizes["K"], r.mode)
        if key in base:
            r.extra["speedup_vs_fp16"] = base[key] / r.median_us
        if key in tiny:
            r.extra["speedup_vs_tinygemm"] = tiny[key] / r.median_us
    doc = results_doc(rows, {"peers_missing": missing if gpu else []})
    if ms:
        doc = merge_results(read_results("weight_only", out_root), doc, lambda r: r.get("M") in ms)
    path = write_json("weight_only", doc, out_root)
    print(format_table(rows, ["provider", "mode", "M", "N", "K", "median_us", "weight_gbps", "speedup_vs_fp16",
                              "speedup_vs_tinygemm", "host_us"]))
    print(f"wrote {path}")
    png = plot(path, x="M", y="speedup_vs_fp16" if gpu else "median_us", group=("provider", "mode"), facet="shape")
    if png:
        print(f"wrote {png}")
    return rows

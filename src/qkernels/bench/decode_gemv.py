"""`qkernels bench decode-gemv`: quantized linears at decode sizes (M = 1 to 256: one sequence to a batch of
serving) on the layer shapes of the models the runtime serves, separate and merged (q|k|v, gate|up) plus the
lm_head, against fp16 `F.linear`, PyTorch's int4 kernel (tinygemm, what torchao's int4 weight-only runs) and, for
W8A8 at M > 16, torch.compile'd per-token quantization + `torch._int_mm` / `torch._scaled_mm` (rowwise FP8), in
one run.

Method: each provider inside one CUDA graph that calls it on enough copies of its weight to span >= 256 MB, as a
decode graph walks its layers (no copy is in L2 when its call runs; the same copies for every M); time per call =
the replay's median (triton.testing.do_bench) / calls. Weight bytes/s = the provider's weight bytes / time;
`share_of_fp16_bw` = that over fp16 `F.linear`'s bytes/s on the same shape and M (the bandwidth fp16 reaches, the
ceiling a weight-only kernel can hope for). `kernels_per_call`: GPU kernels one call launches (torch.profiler over
one replay), counted after every timing of the run (a profiler session may leave the profiling library attached,
slowing what follows). Our layers are `QuantizedLinear.from_linear(linear, scheme)` as `quantize_` makes them
(w4a16 and w4a8-fp8: group 128, asymmetric; w8a16: per channel; w8a8 / w8a8-fp8: per-channel weights; the A8
schemes quantize activations per token inside the call). Peers (gemlite, bitsandbytes) as bench/peers.py builds
them, with their nominal weight bytes; peers not installed on the machine are listed in the JSON as missing. The
torch.compile peers (bench.gemm's `_torch_w8a8` / `_torch_fp8_rowwise`, compiled once with dynamic shapes) run
where `torch._int_mm` does, M > 16.

`--models` / `--shapes` (N x K) / `--ms` / `--providers` naming a part of the grid (a time-limited job may not hold it
all) merge its rows into this GPU's decode_gemv.json: the rows of the (layer, M, provider) measured again are
replaced, the others kept with their dates (a peer not installed for this run keeps its earlier rows). fp16 runs in
every run: each row's ratio is to the fp16 time of its own run.
"""
from __future__ import annotations

import copy
import functools
import math

import torch
import torch.nn.functional as F

from .gemm import _torch_fp8_rowwise, _torch_w8a8
from .harness import Row, merge_results, method_text, on_gpu, read_results, results_doc, write_json
from .peers import peers, try_tinygemm

SHAPES = {   # (N, K, layer)
    "llama3-8b": [(1024, 4096, "k, v"), (4096, 4096, "q, o"), (6144, 4096, "q|k|v"), (14336, 4096, "gate, up"),
                  (28672, 4096, "gate|up"), (4096, 14336, "down"), (128256, 4096, "lm_head")],
    "qwen3-1.7b": [(1024, 2048, "k, v"), (2048, 2048, "q, o"), (4096, 2048, "q|k|v"), (6144, 2048, "gate, up"),
                   (12288, 2048, "gate|up"), (2048, 6144, "down"), (151936, 2048, "lm_head")],
}
MS = (1, 16, 32, 64, 128, 256)
MS_CPU = (1, 16)         # the interpreter's run: the path, not the speed
COMPILED_MIN_M = 17      # torch._int_mm takes M > 16
# peers built for one sequence, timed up to this M: above it they ran at 0.05-0.15x fp16 (tinygemm at M = 64-256,
# H200), minutes of a time-limited job for no comparison a user would make
SMALL_M_PEERS = {"tinygemm": 16, "bitsandbytes": 16}
SCHEMES = ("w4a16", "w8a16", "w8a8", "w8a8-fp8", "w4a8-fp8")
SPAN = 256 << 20
TINY = {"llama3-8b": [(64, 128, "tiny")]}


def _nbytes(m) -> int:
    """Bytes of a layer's parameters and buffers (the codes, scales and zero points of a quantized one)."""
    return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in
                                                        list(m.parameters()) + list(m.buffers())}.values())


def chain_copies(nbytes: int) -> int:
    """How many copies of a weight of `nbytes` a chain calls so that they span SPAN bytes (at least two): no weight
    is in L2 when its call runs."""
    return max(2, math.ceil(SPAN / nbytes))


def chain_graph(calls: list):
    """`calls` run back to back, captured in one CUDA graph (after a run on a side stream: lazy allocations and
    compilations outside the capture)."""
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    torch.cuda.synchronize()
    return g


def chain_us(calls: list, gpu: bool) -> float:
    """Time per call of `calls` run back to back, captured in one CUDA graph (GPU) or eager (CPU)."""
    import time
    for c in calls:
        c()
    if not gpu:
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) * 1e6 / len(calls)
    import triton.testing
    g = chain_graph(calls)
    return triton.testing.do_bench(g.replay, warmup=20, rep=80, return_mode="median") * 1e3 / len(calls)


def chain_timeline(calls: list) -> dict:
    """One replay of the chain's graph under torch.profiler (GPU): medians over its kernels of their duration (start
    to end), of the period (start to the next kernel's start) and of the gap (end to the next start: negative where
    the next started before this one ended, under programmatic dependent launch), in µs, and the kernels per call.
    Tells a per-call cost inside the kernels (duration ~ period) from one between them (gap > 0)."""
    import statistics
    from torch.profiler import ProfilerActivity, profile
    g = chain_graph(calls)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ks = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
    if len(ks) < 2:
        raise RuntimeError(f"the profiler saw {len(ks)} kernels in the chain's replay: no timeline")
    return dict(kernel_us=statistics.median(e - s for s, e in ks),
                period_us=statistics.median(b[0] - a[0] for a, b in zip(ks, ks[1:])),
                gap_us=statistics.median(b[0] - a[1] for a, b in zip(ks, ks[1:])),
                kernels_per_call=len(ks) / len(calls))


@functools.cache
def _compiled(name: str):
    """The torch.compile'd W8A8 peer `name` (compiled once, dynamic shapes: one function serves every M and shape)."""
    return torch.compile({"int8": _torch_w8a8, "fp8": _torch_fp8_rowwise}[name], dynamic=True)


def _call(prov: str, w, x, xb):
    """One call of provider `prov` on its layer (or weight) w: tinygemm on bf16 x, F.linear on the fp16 weight, the
    torch.compile peers on their (codes, scales), the module otherwise."""
    if prov.startswith("torch.compile"):
        fn = _compiled("fp8" if "fp8" in prov else "int8")
        return lambda: fn(x, *w)
    if prov.startswith("tinygemm"):
        return lambda: torch.ops.aten._weight_int4pack_mm(xb, w[0], 128, w[1])
    if prov.startswith("fp16"):
        return lambda: F.linear(x, w)
    return lambda: w(x)


def _kernels_per_call(fn) -> float:
    """GPU kernels (and memsets / copies) one eager call launches."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            fn()
        torch.cuda.synchronize()
    n = sum(e.count for e in prof.key_averages() if (getattr(e, "device_time_total", 0) or 0) > 0)
    return n / 4


def _compiled_peers(lin, dev) -> dict:
    """The torch.compile W8A8 peers of `lin` (GPU): name -> (make its (codes, scales), weight bytes)."""
    from ..nn.linear import QuantizedLinear
    N, K = lin.weight.shape
    q8 = QuantizedLinear.from_linear(lin, "w8a8")
    out = {"torch.compile w8a8 (_int_mm)": (lambda: (q8.weight.clone(), q8.weight_scale.clone()), N * K + 4 * N)}
    if torch.cuda.get_device_capability(dev) >= (8, 9):
        qf = QuantizedLinear.from_linear(lin, "w8a8-fp8")
        out["torch.compile w8a8-fp8 (_scaled_mm)"] = (
            lambda: (qf.weight.clone(), qf.weight_scale.float().view(1, -1).clone()), N * K + 4 * N)
    return out


def run(out_root: str = "benchmarks/results", models=None, shapes=None, ms=None, providers=None) -> list[Row]:
    """models: names of SHAPES (default all); shapes: "NxK" strings (default all of theirs); ms: M values (default
    MS); providers: only the providers whose names hold one of these strings (fp16 F.linear always: the others are
    compared with it)."""
    from ..nn.linear import QuantizedLinear
    gpu = on_gpu()
    default = MS if gpu else MS_CPU
    ms = tuple(sorted({int(m) for m in ms})) if ms else default
    if any(m < 1 for m in ms):
        raise ValueError(f"ms must be positive batch sizes, got {list(ms)}")
    dev = torch.device("cuda" if gpu else "cpu")
    wanted = tuple(providers or ())
    grid = SHAPES if gpu else TINY
    if models:
        unknown = sorted(set(models) - set(grid))
        if unknown:
            raise ValueError(f"models must be among {sorted(grid)}, got {unknown}")
        grid = {k: v for k, v in grid.items() if k in models}
    if shapes:
        grid = {k: [s for s in v if f"{s[0]}x{s[1]}" in shapes] for k, v in grid.items()}
        if not any(grid.values()):
            raise ValueError(f"shapes must name NxK layer shapes of {sorted(grid)}, got {list(shapes)}")
    prev = read_results("decode_gemv", out_root) if models or shapes or providers or ms != default else None
    missing: list = []
    rows: list[Row] = []
    to_count: list = []         # (row, make a layer, provider, x, bf16 x): kernels per call, counted at the end
    measured: set = set()       # (model, "NxK") timed so far
    for model, layer_shapes in grid.items():
        for N, K, layer in layer_shapes:
            torch.manual_seed(0)
            lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
            torch.nn.init.normal_(lin.weight, std=K ** -0.5)
            lin.requires_grad_(False)
            # name -> (make one copy of the layer, weight bytes); fp16 first: the others are compared with it
            providers = {"fp16 F.linear": (lambda lin=lin: lin.weight.detach().clone(), N * K * 2)}
            for scheme in SCHEMES:
                if "fp8" in scheme and gpu and torch.cuda.get_device_capability(dev) < (8, 9):
                    continue
                q = QuantizedLinear.from_linear(lin, scheme)
                providers[f"qkernels {scheme}"] = (lambda q=q: copy.deepcopy(q), _nbytes(q))
            tiny = (try_tinygemm(lin.weight.detach()) if gpu and K % 128 == 0
                    and min(ms) <= SMALL_M_PEERS["tinygemm"] else None)
            if tiny is not None:
                providers["tinygemm int4 g128 (bf16)"] = (lambda t=tiny: (t[0].clone(), t[1].clone()), tiny[2])
            if gpu:
                found, missing = peers(lin, dev)
                providers.update({k: v for k, v in found.items()
                                  if not any(k.startswith(p) and min(ms) > m for p, m in SMALL_M_PEERS.items())})
                if max(ms) >= COMPILED_MIN_M:
                    providers.update(_compiled_peers(lin, dev))
            if wanted:
                providers = {k: v for k, v in providers.items() if k.startswith("fp16") or any(p in k for p in wanted)}
            xs = {M: torch.randn(M, K, device=dev, dtype=torch.float16) for M in ms}
            fp16 = {}         # M -> fp16's (µs, GB/s): fp16 runs first, the others are compared with it
            for prov, (make, nbytes) in providers.items():
                n_copies = chain_copies(nbytes) if gpu else 2
                ws = None
                for M, x in xs.items():          # one set of copies serves every M, as a model's layers do
                    if prov.startswith("torch.compile") and M < COMPILED_MIN_M:
                        continue
                    if any(prov.startswith(p) and M > m for p, m in SMALL_M_PEERS.items()):
                        continue
                    xb = x.bfloat16()
                    try:
                        with torch.inference_mode():
                            ws = ws or [make() for _ in range(n_copies)]
                            us = chain_us([_call(prov, w, x, xb) for w in ws], gpu)
                    except Exception as e:       # a peer that cannot run this shape: say so, go on
                        print(f"{model} {layer} {N}x{K} M={M} {prov}: failed: {type(e).__name__}: {str(e)[:160]}")
                        continue
                    gbps = nbytes / (us * 1e-6) / 1e9
                    if prov.startswith("fp16"):
                        fp16[M] = us, gbps
                    fp16_us, fp16_gbps = fp16[M]
                    extra = {"weight_bytes": nbytes, "weight_gbps": gbps, "copies": n_copies,
                             "kernels_per_call": float("nan"), "speedup_vs_fp16": fp16_us / us,
                             "share_of_fp16_bw": gbps / fp16_gbps}
                    rows.append(Row("decode_linear", prov, us, "graph-chain" if gpu else "eager",
                                    {"model": model, "layer": layer, "shape": f"{N}x{K}", "M": M, "N": N, "K": K},
                                    extra))
                    if gpu:
                        to_count.append((rows[-1], make, prov, x, xb))
                    print(f"{model} {layer:8s} {N}x{K} M={M:2d} {prov:26s} {us:8.1f} us {gbps:6.0f} GB/s "
                          f"{fp16_us / us:5.2f}x fp16, {100 * gbps / fp16_gbps:3.0f}% of fp16 B/s", flush=True)
                del ws
                if gpu:
                    torch.cuda.empty_cache()
            # the rows so far (kernel counts still NaN), merged in: a job cut off keeps its finished layers
            measured.add((model, f"{N}x{K}"))
            _write(rows, missing, gpu, read_results("decode_gemv", out_root), grid, out_root, measured)
    # kernels per call, after every timing: a profiler session must not run before a timed one
    for row, make, prov, x, xb in to_count:
        try:
            with torch.inference_mode():
                row.extra["kernels_per_call"] = _kernels_per_call(_call(prov, make(), x, xb))
        except Exception as e:       # the row keeps its time; its count stays NaN
            print(f"{row.sizes['shape']} M={row.sizes['M']} {prov}: kernel count failed: {type(e).__name__}: {e}")
            continue
        print(f"{row.sizes['shape']} M={row.sizes['M']:2d} {prov:26s} {row.extra['kernels_per_call']:.0f} kernels")
    _write(rows, missing, gpu, prev, grid, out_root)
    return rows


def _write(rows: list, missing: list, gpu: bool, prev, grid: dict, out_root: str,
           measured: set | None = None):
    """The results file: `rows`, with the (layer, M, provider) measured replacing theirs in `prev` (the GPU's earlier
    results; the others kept), or alone without `prev`. measured: the (model, "NxK") timed yet (default: the whole
    grid)."""
    meta = {"peers_missing": missing, "span_bytes": SPAN,
            "method": method_text(__doc__, gpu, "tiny shape")}
    doc = results_doc(rows, meta)
    if prev:
        if measured is None:
            measured = {(m, f"{n}x{k}") for m, shapes in grid.items() for n, k, _ in shapes}
        ran = {(r["model"], r["shape"], r["M"], r["provider"]) for r in doc["rows"]
               if (r["model"], r["shape"]) in measured}
        doc = merge_results(prev, doc,
                            lambda r: (r.get("model"), r.get("shape"), r.get("M"), r.get("provider")) in ran)
    path = write_json("decode_gemv", doc, out_root)
    print(f"wrote {path}")

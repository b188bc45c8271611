"""`qkernels bench quantize`: the seed scenario (fp32 -> int8 static, 500K..50M elements) and dynamic
per-row / per-group quantization of LLM-sized activations, against torch eager and torch.compile of
the reference expression, in one run, with the copy-bandwidth ceiling measured in the same run.

Every provider is timed the same ways and compared only within a way: "eager" (the Python call), "graph" (one call
in a CUDA graph, L2 flushed before each replay: the data comes from memory) and, for the seed sizes whose bytes fit
in half the L2, an "(L2-hot)" op: HOT_CALLS back-to-back calls in one graph on the same tensors, time per call
(what a kernel on data a previous kernel just wrote sees)."""
from __future__ import annotations

import torch

import qkernels as qk
from qkernels import reference as ref

from .harness import Row, copy_bandwidth_gbps, format_table, host_us, on_gpu, plot, time_us, write_json

SEED_SIZES_GPU = [500_000, 1_000_000, 5_000_000, 10_000_000, 50_000_000]
SEED_SIZES_CPU = [4_096, 16_384]
DYN_SHAPES_GPU = [(16384, 4096), (4096, 14336)]
DYN_SHAPES_CPU = [(16, 256)]
DYN_CASES = [("int8", "row", 0), ("int4", "group", 128), ("fp8_e4m3", "row", 0)]


HOT_CALLS = 20


def _providers(ref_fn, ours_fn, gpu: bool):
    """(provider, mode, call): torch eager, torch.compile (GPU runs) and ours, each eager and (GPU) in a graph."""
    fns = [("torch", ref_fn)] + ([("torch.compile", torch.compile(ref_fn))] if gpu else []) + [("qkernels", ours_fn)]
    return [(prov, mode, fn) for prov, fn in fns for mode in (("eager", "graph") if gpu else ("eager",))]


def _l2_bytes() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size


def run(out_root: str = "benchmarks/results") -> list[Row]:
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    copy_bw = copy_bandwidth_gbps(dev)
    print(f"device-to-device copy bandwidth (read + write): {copy_bw:.0f} GB/s")
    rows: list[Row] = []

    def add(op, provider, mode, fn, sizes, nbytes, numel, calls=1):
        try:
            us = time_us(fn, mode=mode, calls=calls)
        except Exception as e:      # a peer that cannot be captured in a graph: say so, go on
            print(f"{op} {sizes} {provider} {mode}: failed: {type(e).__name__}: {str(e)[:160]}")
            return
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append(Row(op, provider, us, mode, sizes, {"gbps": gbps, "pct_copy_bw": 100 * gbps / copy_bw,
                                                         "gelem_s": numel / (us * 1e-6) / 1e9}))

    # seed scenario: fp32 -> int8 static, per-tensor, with scale and zero point
    for n in SEED_SIZES_GPU if gpu else SEED_SIZES_CPU:
        x = torch.randn(n, device=dev) * 4
        scale = torch.tensor(8.0 / 255, device=dev)
        zp = torch.tensor(128, dtype=torch.int32, device=dev)

        def ref_fn(x=x, scale=scale, zp=zp):
            return ref.quantize(x, "int8", "tensor", 0, False, scale, zp)[0]

        def ours(x=x, scale=scale, zp=zp):
            return qk.quantize(x, "int8", "tensor", symmetric=False, scale=scale, zero_point=zp).data

        assert torch.equal(ref_fn(), ours())
        provs = _providers(ref_fn, ours, gpu)
        for prov, mode, fn in provs:
            add("quantize_int8_static", prov, mode, fn, {"numel": n}, n * 5, n)
            if mode == "graph" and 2 * n * 5 <= _l2_bytes():
                add("quantize_int8_static (L2-hot)", prov, mode, fn, {"numel": n}, n * 5, n, calls=HOT_CALLS)
        if n == min(SEED_SIZES_GPU if gpu else SEED_SIZES_CPU):
            for prov, mode, fn in provs:     # host cost per call, apart from GPU time
                if mode == "eager":
                    rows.append(Row("host_overhead_quantize_static", prov, host_us(fn), "host", {"numel": n}))

    # dynamic: fp16 activations, scales computed in the kernel
    for (M, K) in DYN_SHAPES_GPU if gpu else DYN_SHAPES_CPU:
        x = torch.randn(M, K, device=dev, dtype=torch.float16)
        for dtype, gran, gs in DYN_CASES:
            fmt = qk.FORMATS[dtype]
            nseg = M if gran == "row" else M * K // gs
            nbytes = M * K * 2 + M * K * fmt.bits // 8 + nseg * 4

            def ref_fn(x=x, dtype=dtype, gran=gran, gs=gs):
                return ref.quantize(x, dtype, gran, gs, True)[:2]

            def ours(x=x, dtype=dtype, gran=gran, gs=gs):
                qt = qk.quantize(x, dtype, gran, group_size=gs or 128)
                return qt.data, qt.scale

            got, want = ours(), ref_fn()
            assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
            op = f"quantize_{dtype}_{gran}{gs or ''}_dynamic"
            for prov, mode, fn in _providers(ref_fn, ours, gpu):
                add(op, prov, mode, fn, {"M": M, "K": K}, nbytes, M * K)

    # speedups against torch.compile (torch eager where compile was not run), timed the same way
    base = {}
    for r in rows:
        if r.provider in ("torch.compile", "torch"):
            key = (r.op, r.mode, tuple(r.sizes.items()))
            if r.provider == "torch.compile" or key not in base:
                base[key] = r.median_us
    for r in rows:
        key = (r.op, r.mode, tuple(r.sizes.items()))
        if r.mode != "host" and key in base:
            r.extra["speedup_vs_compile" if gpu else "speedup_vs_torch"] = base[key] / r.median_us

    path = write_json("quantize", rows, out_root, {"copy_bw_gbps": copy_bw})
    cols = ["op", "provider", "mode", "numel", "M", "K", "median_us", "gbps", "pct_copy_bw",
            "speedup_vs_compile" if gpu else "speedup_vs_torch"]
    print(format_table(rows, cols))
    print(f"wrote {path}")
    png = plot(path, x="numel", y="pct_copy_bw")
    if png:
        print(f"wrote {png}")
    return rows

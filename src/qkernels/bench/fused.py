"""`qkernels bench fused`: RMSNorm / LayerNorm (+ residual, + int8 quantization), SwiGLU (+ int8
quantization) and softmax on LLM activation shapes, against torch eager and torch.compile of the
same expression, with the copy bandwidth measured in the same run as the ceiling.

Byte counts are the bytes that must move (inputs read once, outputs written once). Small shapes
(decode) are timed both as CUDA-graph replays and as plain eager calls.
"""
from __future__ import annotations

import torch
import torch._dynamo
import torch.nn.functional as F

import qkernels as qk

from .harness import Row, copy_bandwidth_gbps, format_table, on_gpu, time_us, write_json

HIDDEN = 4096
TOKENS_GPU = [1, 32, 4096, 16384]
TOKENS_CPU = [1, 8]
SWIGLU_EXTRA_GPU = [(4096, 14336)]     # [tokens, intermediate] of Llama-3-8B's MLP
GRAPH_MAX_TOKENS = 32                  # shapes up to here are also timed as CUDA-graph replays
CHAIN = 20                             # "graph_x20": per call of 20 calls captured in one graph
EPS = 1e-6
DTYPE = torch.bfloat16


# the peers: the expressions a model runs (Hugging Face's Llama RMSNorm and SwiGLU), eager and compiled

def hf_rms_norm(x, w):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * y.to(x.dtype)


def hf_add_rms_norm(x, r, w):
    h = x + r
    return hf_rms_norm(h, w), h


def torch_layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def hf_swiglu(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def torch_row_quant(y):
    yf = y.float()
    s = yf.abs().amax(-1, keepdim=True).div(127.0).clamp_min(2 ** -126)
    return torch.round(yf / s).clamp(-128, 127).to(torch.int8), s


def hf_rms_norm_quant(x, w):
    return torch_row_quant(hf_rms_norm(x, w))


def hf_swiglu_quant(gu):
    return torch_row_quant(hf_swiglu(gu))


def torch_softmax(x):
    return torch.softmax(x, dim=-1)


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def run(out_root: str = "benchmarks/results") -> list[Row]:
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    if gpu:   # one compiled graph per (function, shape)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    copy_bw = copy_bandwidth_gbps(dev)
    print(f"device-to-device copy bandwidth (read + write): {copy_bw:.0f} GB/s")
    rows: list[Row] = []
    c = {f.__name__: (_compiled(f) if gpu else f) for f in
         (hf_rms_norm, hf_add_rms_norm, torch_layer_norm, hf_swiglu, hf_rms_norm_quant, hf_swiglu_quant,
          torch_softmax)}

    if gpu:   # the single-replay floor: a graph holding one 1-element kernel, timed the same way
        one = torch.zeros(1, device=dev)
        rows.append(Row("graph_replay_floor", "torch", time_us(lambda: one.add_(1), mode="graph"), "graph",
                        {"M": 1, "N": 1}, {"gbps": 0.0, "pct_copy_bw": 0.0}))

    def add(op, provider, fn, T, H, nbytes):
        modes = ("graph", f"graph_x{CHAIN}", "eager") if gpu and T <= GRAPH_MAX_TOKENS else ("eager",)
        for mode in modes:
            us = time_us(fn, mode="graph", calls=CHAIN) if mode.startswith("graph_x") else time_us(fn, mode=mode)
            gbps = nbytes / (us * 1e-6) / 1e9
            rows.append(Row(op, provider, us, mode, {"M": T, "N": H},
                            {"gbps": gbps, "pct_copy_bw": 100 * gbps / copy_bw}))

    def check(got, want, what, tol):
        err = ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()
        assert err < tol, f"{what}: relative error {err:.3g} against the eager peer"

    B = DTYPE.itemsize
    shapes = [(T, HIDDEN) for T in (TOKENS_GPU if gpu else TOKENS_CPU)]
    for T, H in shapes:
        x = torch.randn(T, H, device=dev, dtype=DTYPE)
        r = torch.randn(T, H, device=dev, dtype=DTYPE)
        w = torch.rand(H, device=dev, dtype=DTYPE) + 0.5
        b = torch.randn(H, device=dev, dtype=DTYPE)
        norm_bytes, q_bytes = 2 * T * H * B, T * H * (B + 1) + 4 * T

        check(qk.rms_norm(x, w, EPS), hf_rms_norm(x, w), "rms_norm", 1e-2)
        for name, fn in (("torch", lambda: hf_rms_norm(x, w)), ("torch.compile", lambda: c["hf_rms_norm"](x, w)),
                         ("qkernels", lambda: qk.rms_norm(x, w, EPS))):
            add("rms_norm", name, fn, T, H, norm_bytes)
        for name, fn in (("torch", lambda: hf_add_rms_norm(x, r, w)),
                         ("torch.compile", lambda: c["hf_add_rms_norm"](x, r, w)),
                         ("qkernels", lambda: qk.rms_norm(x, w, EPS, residual=r))):
            add("add_rms_norm", name, fn, T, H, 2 * norm_bytes)
        check(qk.layer_norm(x, w, b, EPS), torch_layer_norm(x, w, b), "layer_norm", 1e-2)
        for name, fn in (("torch", lambda: torch_layer_norm(x, w, b)),
                         ("torch.compile", lambda: c["torch_layer_norm"](x, w, b)),
                         ("qkernels", lambda: qk.layer_norm(x, w, b, EPS))):
            add("layer_norm", name, fn, T, H, norm_bytes)
        for name, fn in (("torch", lambda: hf_rms_norm_quant(x, w)),
                         ("torch.compile", lambda: c["hf_rms_norm_quant"](x, w)),
                         ("torch.compile norm + qkernels quantize",
                          lambda: qk.quantize(c["hf_rms_norm"](x, w), "int8", "row")),
                         ("qkernels", lambda: qk.rms_norm(x, w, EPS, quantize="int8"))):
            add("rms_norm_quant_int8", name, fn, T, H, q_bytes)
        check(qk.softmax(x), torch_softmax(x), "softmax", 1e-2)
        for name, fn in (("torch", lambda: torch_softmax(x)), ("torch.compile", lambda: c["torch_softmax"](x)),
                         ("qkernels", lambda: qk.softmax(x))):
            add("softmax", name, fn, T, H, norm_bytes)
        del x, r

    for T, I in shapes + (SWIGLU_EXTRA_GPU if gpu else []):
        gu = torch.randn(T, 2 * I, device=dev, dtype=DTYPE)
        check(qk.silu_and_mul(gu), hf_swiglu(gu), "silu_and_mul", 1e-2)
        for name, fn in (("torch", lambda: hf_swiglu(gu)), ("torch.compile", lambda: c["hf_swiglu"](gu)),
                         ("qkernels", lambda: qk.silu_and_mul(gu))):
            add("silu_and_mul", name, fn, T, I, 3 * T * I * B)
        for name, fn in (("torch", lambda: hf_swiglu_quant(gu)),
                         ("torch.compile", lambda: c["hf_swiglu_quant"](gu)),
                         ("torch.compile swiglu + qkernels quantize",
                          lambda: qk.quantize(c["hf_swiglu"](gu), "int8", "row")),
                         ("qkernels", lambda: qk.silu_and_mul(gu, quantize="int8"))):
            add("silu_and_mul_quant_int8", name, fn, T, I, T * I * (2 * B + 1) + 4 * T)
        del gu

    # speedups over torch.compile (and over "compile + our quantize" for the fused quantizations)
    base = {}
    for rr in rows:
        base[(rr.op, rr.provider, rr.mode, rr.sizes["M"], rr.sizes["N"])] = rr.median_us
    for rr in rows:
        key = (rr.op, rr.mode, rr.sizes["M"], rr.sizes["N"])
        ref = base.get((key[0], "torch.compile" if gpu else "torch", *key[1:]))
        if ref:
            rr.extra["speedup_vs_compile" if gpu else "speedup_vs_torch"] = ref / rr.median_us
        split = [p for (o, p, *_rest) in base if o == rr.op and p.endswith("qkernels quantize")]
        if split and rr.provider == "qkernels":
            rr.extra["speedup_vs_split"] = base[(rr.op, split[0], *key[1:])] / rr.median_us

    path = write_json("fused", rows, out_root, {"copy_bw_gbps": copy_bw, "dtype": str(DTYPE).replace("torch.", ""),
                                                "hidden": HIDDEN})
    cols = ["op", "provider", "mode", "M", "N", "median_us", "gbps", "pct_copy_bw",
            "speedup_vs_compile" if gpu else "speedup_vs_torch", "speedup_vs_split"]
    print(format_table(rows, cols))
    if gpu:
        print(summary(rows))
    print(f"wrote {path}")
    png = plot_fused(path)
    if png:
        print(f"wrote {png}")
    return rows


def summary(rows: list[Row]) -> str:
    """The issue's targets, each with its measured figure."""
    out = ["targets:"]
    big = [r for r in rows if r.provider == "qkernels" and r.mode == "eager" and r.sizes["M"] == 16384
           or r.provider == "qkernels" and r.sizes["N"] == 14336]
    for r in big:
        ok = r.extra["pct_copy_bw"] >= 90 and r.extra.get("speedup_vs_compile", 0) >= 1.1
        out.append(f"  [{r.sizes['M']}, {r.sizes['N']}] {r.op}: {r.extra['pct_copy_bw']:.1f}% of copy bandwidth, "
                   f"{r.extra.get('speedup_vs_compile', float('nan')):.2f}x torch.compile"
                   + (f", {r.extra['speedup_vs_split']:.2f}x compile + our quantize" if "speedup_vs_split" in r.extra
                      else "") + ("  MET" if ok else "  short"))
    floor = next((r.median_us for r in rows if r.op == "graph_replay_floor"), float("nan"))
    out.append(f"  single graph replay floor (one 1-element kernel): {floor:.2f} us")
    for r in rows:
        if r.provider == "qkernels" and r.mode == "graph" and r.sizes["M"] == 1:
            chained = next(x.median_us for x in rows if x.op == r.op and x.provider == r.provider
                           and x.mode == f"graph_x{CHAIN}" and x.sizes == r.sizes)
            out.append(f"  [1, {r.sizes['N']}] {r.op}: {r.median_us:.2f} us single graph replay, {chained:.2f} us per "
                       f"call chained in a graph" + ("  MET" if min(r.median_us, chained) <= 5 else "  short"))
    return "\n".join(out)


def plot_fused(json_path):
    """Percent of copy bandwidth per op and shape, one bar per provider (eager calls)."""
    import json
    from pathlib import Path

    from .harness import pyplot, save_png
    plt = pyplot()
    if plt is None:
        return None
    doc = json.loads(Path(json_path).read_text())
    rows = [r for r in doc["rows"] if r["mode"] == "eager"]
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        sub = [r for r in rows if r["op"] == op]
        shapes = sorted({(r["M"], r["N"]) for r in sub})
        provs = sorted({r["provider"] for r in sub})
        width = 0.8 / len(provs)
        for i, p in enumerate(provs):
            vals = [next((r["pct_copy_bw"] for r in sub if r["provider"] == p and (r["M"], r["N"]) == s), 0)
                    for s in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], vals, width, label=p)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))])
        ax.set_xticklabels([f"{m}x{n}" for m, n in shapes], rotation=30, fontsize=7)
        ax.set_title(op, fontsize=9)
        ax.set_ylabel("% of copy bandwidth")
        ax.legend(fontsize=6)
    return save_png(fig, json_path, f"fused ops on {doc.get('gpu')}")

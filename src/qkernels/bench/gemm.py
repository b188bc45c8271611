"""`qkernels bench gemm`: int8 / fp8 GEMMs and the W8A8 linear on Llama-3-8B shapes against fp16
cuBLAS, torch._int_mm, a torch.compile'd W8A8 pipeline, torch._scaled_mm rowwise FP8 and gemlite's W8A8 layers
(int8 and fp8, dynamic per-token activations: bench/peers.py, where installed), in one run."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import qkernels as qk

from .harness import Row, format_table, on_gpu, plot, time_us, write_json
from .peers import peers

SHAPES_GPU = [(4096, 4096), (14336, 4096), (4096, 14336)]
MS_GPU = [1, 16, 128, 1024, 4096]
SHAPES_CPU = [(64, 128)]
MS_CPU = [1, 16]


def _torch_w8a8(x, w_q, w_scale):
    """torchao-style W8A8: per-token int8 quantization, torch._int_mm, dequantize."""
    s = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 127
    q = torch.clamp(torch.round(x.float() / s), -128, 127).to(torch.int8)
    return (torch._int_mm(q, w_q.t()).float() * s * w_scale).to(x.dtype)


def _torch_fp8_rowwise(x, w_f8, w_scale_row):
    """torch._scaled_mm rowwise FP8 with its own per-token activation quantization."""
    s = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 448
    q = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn)
    return torch._scaled_mm(q, w_f8.t(), scale_a=s, scale_b=w_scale_row, out_dtype=torch.bfloat16)


def run(out_root: str = "benchmarks/results") -> list[Row]:
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    fp8_ok = gpu and torch.cuda.get_device_capability() >= (8, 9)
    shapes = [(M, N, K) for (N, K) in (SHAPES_GPU if gpu else SHAPES_CPU) for M in (MS_GPU if gpu else MS_CPU)]
    if gpu:
        shapes.append((8192, 8192, 8192))
    w8a8_c = torch.compile(_torch_w8a8, dynamic=False) if gpu else None
    fp8_c = torch.compile(_torch_fp8_rowwise, dynamic=False) if fp8_ok else None
    rows: list[Row] = []
    peer_layers: dict = {}       # (N, K) -> {name: layer}: gemlite's W8A8 layers, made once per shape
    missing: list = []
    for M, N, K in shapes:
        x = torch.randn(M, K, device=dev, dtype=torch.float16)
        w = torch.randn(N, K, device=dev, dtype=torch.float16) / K ** 0.5
        lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
        lin.weight.data.copy_(w)
        q8 = qk.QuantizedLinear.from_linear(lin, "w8a8")
        a8 = torch.randint(-128, 128, (M, K), dtype=torch.int8, device=dev)
        sa = torch.rand(M, device=dev)
        cases = []
        if gpu:
            cases.append(("linear", "fp16 cuBLAS", lambda: F.linear(x, w)))
            if M > 16:
                cases.append(("core", "torch._int_mm", lambda: torch._int_mm(a8, q8.weight.t())))
                cases.append(("linear", "torch.compile w8a8 (_int_mm)", lambda: w8a8_c(x, q8.weight, q8.weight_scale)))
        cases.append(("core", "qkernels int8", lambda: qk.int8_matmul(a8, q8.weight.t())))
        cases.append(("core", "qkernels int8 +scales", lambda: qk.int8_matmul(a8, q8.weight.t(), sa, q8.weight_scale,
                                                                              out_dtype=torch.float16)))
        cases.append(("linear", "qkernels w8a8 int8", lambda: q8(x)))
        if fp8_ok:
            qf = qk.QuantizedLinear.from_linear(lin, "w8a8-fp8")
            a_f8 = (torch.randn(M, K, device=dev) * 8).to(torch.float8_e4m3fn)
            sbr = qf.weight_scale.view(1, -1)
            cases.append(("core", "torch._scaled_mm fp8", lambda: torch._scaled_mm(
                a_f8, qf.weight.t(), scale_a=sa.view(-1, 1), scale_b=sbr, out_dtype=torch.bfloat16)))
            cases.append(("linear", "torch._scaled_mm fp8 +act quant", lambda: fp8_c(x.bfloat16(), qf.weight, sbr)))
            cases.append(("core", "qkernels fp8", lambda: qk.fp8_matmul(a_f8, qf.weight.t(), sa, qf.weight_scale,
                                                                         out_dtype=torch.bfloat16)))
            cases.append(("linear", "qkernels w8a8 fp8", lambda: qf(x)))
        if gpu:
            if (N, K) not in peer_layers:
                found, missing = peers(lin, dev, kinds=("w8a8",))
                peer_layers[(N, K)] = {name: make() for name, (make, _) in found.items()}
            for name, layer in peer_layers[(N, K)].items():
                cases.append(("linear", name, lambda layer=layer: layer(x)))
        modes = ("eager", "graph") if gpu else ("eager",)   # graph replay = GPU time; eager adds host cost
        for kind, prov, fn in cases:
            for mode in modes:
                try:
                    with torch.inference_mode():
                        us = time_us(fn, mode=mode, rep_ms=100, warmup_ms=25)
                except Exception as e:      # a peer that cannot run this case: say so, go on
                    print(f"{N}x{K} M={M} {prov} {mode}: failed: {type(e).__name__}: {str(e)[:160]}")
                    continue
                rows.append(Row(f"gemm_{kind}", prov, us, mode, {"M": M, "N": N, "K": K},
                                {"tops": 2 * M * N * K / (us * 1e-6) / 1e12}))
        del x, w, lin, q8
    base = {(r.sizes["M"], r.sizes["N"], r.sizes["K"], r.mode): r.median_us for r in rows if r.provider == "fp16 cuBLAS"}
    for r in rows:
        key = (r.sizes["M"], r.sizes["N"], r.sizes["K"], r.mode)
        if key in base:
            r.extra["speedup_vs_fp16"] = base[key] / r.median_us
    path = write_json("gemm", rows, out_root, {"peers_missing": missing})
    print(format_table(rows, ["op", "provider", "mode", "M", "N", "K", "median_us", "tops", "speedup_vs_fp16"]))
    print(f"wrote {path}")
    png = plot(path, x="M", y="tops", group=("provider",), facet="N")
    if png:
        print(f"wrote {png}")
    return rows

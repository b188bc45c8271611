"""W4A8-FP8 tile configs swept in the decode chain (bench.decode_gemv's method: one CUDA graph calling the linear on
weight copies spanning 256 MB), beside fp16 F.linear, our W4A16 and our W8A8-FP8 on the same shapes, M and run.
First a correctness pass of w4a8_linear against reference.w4a8_linear on the GPU (fp16 / bf16, group 128 / 64 /
per channel, bias, odd M and N).

Usage: python scripts/tune_w4a8.py [--out DIR] [--models llama3-8b qwen3-1.7b] [--ms 16 32 64 128 256]
Writes DIR/w4a8_sweep.json: per (shape, M) each provider's µs and the best W4A8 config.
       python scripts/tune_w4a8.py --apply DIR/w4a8_sweep.json [GPU]   (no GPU needed)
writes each swept (shape, M)'s best config into configs/<gpu>.json (kind "w4a8-fp8", "<bucket>:N<N>:K<K>"),
marked "W4A16": true where our W4A16 linear was faster in the same sweep (the layer then runs it).
"""
import argparse
import copy
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

import qkernels as qk
from qkernels import reference as ref
from qkernels.bench.decode_gemv import SHAPES, _nbytes, chain_copies, chain_us
from qkernels.nn.linear import QuantizedLinear
from qkernels.ops import w4a8


def check(dev):
    torch.manual_seed(1)
    bad = 0
    for (N, K, g, sym, M, dt, bias) in [(4096, 4096, 128, False, 16, torch.float16, False),
                                        (1000, 2048, 64, True, 33, torch.bfloat16, True),
                                        (768, 1024, -1, False, 5, torch.float16, False),
                                        (6144, 4096, 128, False, 256, torch.float16, True),
                                        (4096, 14336, 128, False, 100, torch.bfloat16, False)]:
        w = torch.randn(N, K, device=dev) * K ** -0.5
        pw = qk.PackedWeight.from_float(w.to(dt), bits=4, group_size=g, symmetric=sym)
        x = torch.randn(M, K, device=dev, dtype=dt)
        b = torch.randn(N, device=dev, dtype=dt) if bias else None
        r = ref.w4a8_linear(x, pw.qweight, pw.scales, pw.zeros, pw.group_size, None, b).float()
        for cfg in [None] + list(w4a8.DEFAULT_CONFIGS.values()) + list(w4a8.WG_CONFIGS.values()):
            if cfg is None:
                y = w4a8.w4a8_linear(x, pw, b).float()
            else:
                with w4a8.use_config(cfg):
                    y = w4a8.w4a8_linear(x, pw, b).float()
            rel = ((y - r).norm() / r.norm()).item()
            ok = rel < (2e-3 if dt == torch.float16 else 1e-2) and bool(torch.isfinite(y).all())
            bad += not ok
            if not ok or cfg is None:
                print(f"check N={N} K={K} g={g} sym={sym} M={M} {dt} bias={bias} cfg={cfg}: rel {rel:.2e} "
                      f"{'ok' if ok else 'FAILED'}", flush=True)
    print(f"check: {bad} failed", flush=True)
    return bad


def candidates(M, hopper: bool):
    """Tile configs for an M bucket. Hopper: the wgmma kernel's first (BLOCK_M the bucket, at most 128; 64 weight rows
    a warpgroup, one or two warpgroups; promotion per chunk or per 128-k group (CPG); the copies in the loop or in
    a producer warp (WS, registers capped); 4 or 6 stages; K split while the grid is small). Then the Triton
    kernel's: BLOCK_M near M, 64 / 128 output columns, 3-5 stages, K split or not."""
    bucket = min(max(16, 1 << (M - 1).bit_length()), 256)
    out = []
    if hopper:
        bm = min(bucket, 128)
        splits = [(4, 528), (2, 264), (1, 0)] if bm <= 64 else [(4, 264), (1, 0)]
        # CPG 2 holds two units of two chunks in the ring (6 stages: one unit's loads ahead) and, at 128 tokens a
        # tile, more registers than a thread has (offline sm_90: 255 and spills): 64 tokens a tile there
        for cpg, (bn, warps), (split, mp) in itertools.product([2, 1], [(64, 4), (128, 8)], splits):
            out.append(dict(path="wg", BLOCK_M=min(bm, 64) if cpg == 2 else bm, BLOCK_N=bn, GROUP_M=8,
                            STAGES=6 if cpg == 2 else 4, num_warps=warps, SPLIT_K=split, MIN_PROGRAMS=mp, CPG=cpg))
        # warp-specialized (the producer warp's copies out of the consumers' loop), registers capped
        for (bn, warps), (split, mp) in itertools.product([(64, 4), (128, 8)], splits):
            cap = 96 if bm <= 32 else 168
            out.append(dict(path="wg", BLOCK_M=min(bm, 64), BLOCK_N=bn, GROUP_M=8, STAGES=6, num_warps=warps,
                            SPLIT_K=split, MIN_PROGRAMS=mp, WS=True, maxnreg=cap, CPG=2))
    bms = {16: [16], 32: [32, 16], 64: [64, 32], 128: [64, 128], 256: [128, 64]}[bucket]
    if M <= 64:      # the weight tile as the MMA's M side first
        for bn, split, stages in itertools.product([64, 128], [4, 1], [4, 3]):
            out.append(dict(BLOCK_M=max(16, bms[0]), BLOCK_N=bn, GROUP_M=8, num_warps=4, num_stages=stages,
                            SPLIT_K=split, MIN_PROGRAMS=528, SWAP=True))
    for bm, split, bn, stages in itertools.product(bms, [4, 1], [64, 128], [4, 3, 5]):
        warps = 8 if bm * bn >= 128 * 128 else 4
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=warps, num_stages=stages, SPLIT_K=split,
                        MIN_PROGRAMS=528))
    return out


def apply(sweep_path: str, slug: str | None) -> None:
    """The sweep's winners into the shipped table of its GPU (or `slug`'s)."""
    from pathlib import Path

    from qkernels import configs
    from qkernels._runtime import gpu_slug
    doc = json.load(open(sweep_path))
    path = Path(configs.__file__).with_name(f"{slug or gpu_slug(doc['gpu'])}.json")
    table = json.loads(path.read_text())
    kind = table.setdefault("w4a8-fp8", {})
    for r in doc["rows"]:
        N, K = map(int, r["shape"].split("x"))
        bucket = min(max(16, 1 << (r["M"] - 1).bit_length()), 256)
        cfg = {k: v for k, v in r["w4a8 config"].items() if k not in ("fallback", "W4A16")}
        if r["w4a16"] < r["w4a8 best"]:
            cfg["W4A16"] = True
        kind[f"{bucket}:N{N}:K{K}"] = cfg
        print(f"{bucket}:N{N}:K{K} {r['w4a8 best']:.2f} us (w4a16 {r['w4a16']:.2f}): {cfg}")
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {path}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--apply":
        return apply(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--models", nargs="+", default=["llama3-8b", "qwen3-1.7b"])
    ap.add_argument("--layers", nargs="+", default=["gate|up", "down", "q|k|v", "q, o"])
    ap.add_argument("--ms", nargs="+", type=int, default=[16, 32, 64, 128, 256])
    ap.add_argument("--max-candidates", type=int, default=18)
    ap.add_argument("--show", action="store_true", help="print every candidate's time")
    a = ap.parse_args()
    dev = torch.device("cuda")
    os.makedirs(a.out, exist_ok=True)
    print(torch.cuda.get_device_name(dev), torch.__version__, flush=True)
    failed = check(dev)
    rows = []
    for model in a.models:
        for N, K, layer in SHAPES[model]:
            if layer not in a.layers:
                continue
            torch.manual_seed(0)
            lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
            torch.nn.init.normal_(lin.weight, std=K ** -0.5)
            lin.requires_grad_(False)
            q4 = QuantizedLinear.from_linear(lin, "w4a16")
            q8 = QuantizedLinear.from_linear(lin, "w8a8-fp8")
            pw = qk.PackedWeight.from_float(lin.weight, bits=4, group_size=128)     # w4a16's weight, as quantize_ makes it
            provs = {"fp16": (lambda: lin.weight.clone(), N * K * 2, lambda w, x: (lambda: F.linear(x, w))),
                     "w4a16": (lambda: copy.deepcopy(q4), _nbytes(q4), lambda w, x: (lambda: w(x))),
                     "w8a8-fp8": (lambda: copy.deepcopy(q8), _nbytes(q8), lambda w, x: (lambda: w(x)))}
            w4_bytes = pw.qweight.numel() + pw.scale_zero.numel() * 2
            copies = {}
            for M in a.ms:
                x = torch.randn(M, K, device=dev, dtype=torch.float16)
                row = dict(model=model, layer=layer, shape=f"{N}x{K}", M=M)
                with torch.inference_mode():
                    for name, (make, nbytes, call) in provs.items():
                        ws = copies.setdefault(name, [make() for _ in range(chain_copies(nbytes))])
                        row[name] = chain_us([call(w, x) for w in ws], True)
                    pws = copies.setdefault("w4a8", [copy.deepcopy(pw) for _ in range(chain_copies(w4_bytes))])
                    best = None
                    hopper = torch.cuda.get_device_capability(dev) == (9, 0)
                    for cfg in [w4a8.config_for(M, dev, N, K)] + candidates(M, hopper)[:a.max_candidates]:
                        try:
                            with w4a8.use_config(cfg):
                                us = chain_us([lambda w=w: w4a8.w4a8_linear(x, w) for w in pws], True)
                        except Exception as e:
                            print(f"  {cfg}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                            continue
                        if a.show:
                            print(f"  {us:8.2f} us {cfg}", flush=True)
                        if best is None or us < best[0]:
                            best = (us, cfg)
                        row.setdefault("w4a8 default", us)
                    row["w4a8 best"], row["w4a8 config"] = best
                f = row["fp16"]
                print(f"{model} {layer:8s} {N}x{K} M={M:3d} fp16 {f:7.2f}  w4a16 {row['w4a16']:7.2f} "
                      f"({f / row['w4a16']:.2f}x)  w8a8-fp8 {row['w8a8-fp8']:7.2f} ({f / row['w8a8-fp8']:.2f}x)  "
                      f"w4a8 {row['w4a8 default']:7.2f} / best {row['w4a8 best']:7.2f} ({f / row['w4a8 best']:.2f}x) "
                      f"{row['w4a8 config']}", flush=True)
                rows.append(row)
                doc = dict(gpu=torch.cuda.get_device_name(dev), torch=torch.__version__,
                           triton=__import__("triton").__version__, check_failed=failed, rows=rows)
                with open(os.path.join(a.out, "w4a8_sweep.json"), "w") as fh:     # after each row: a cut run keeps them
                    json.dump(doc, fh, indent=1)
            copies.clear()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

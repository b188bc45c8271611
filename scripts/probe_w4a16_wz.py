"""Probe: W4A16 on the W4A8 wgmma kernel (kernels/_w4a8_wg.py with fp16 x: each code an fp16 A operand u * 2**-24,
-z as a second A tile, the group scale on the fp32 tile), checked against reference.weight_only_linear and timed in
the decode chain (bench.decode_gemv's method) beside our W4A16 layer (its table's config) on the same shapes and M.

Usage: python scripts/probe_w4a16_wz.py [--shapes 28672x4096 ...] [--ms 16 32 64]
"""
import argparse
import copy

import torch

import qkernels as qk
from qkernels import reference as ref
from qkernels.bench.decode_gemv import _nbytes, chain_copies, chain_us
from qkernels.nn.linear import QuantizedLinear
from qkernels.ops import w4a8


def wz(x, pw, cfg, bias=None):
    out = torch.empty(x.shape[0], pw.qweight.shape[0], device=x.device, dtype=x.dtype)
    return w4a8._run_wg(x, None, pw.qweight, pw.scale_zero, bias, pw.group_size, out, cfg)


def configs(M):
    bm = min(max(16, 1 << (M - 1).bit_length()), 64)
    base = dict(path="wg", BLOCK_M=bm, BLOCK_N=64, GROUP_M=8, STAGES=4, num_warps=4)
    for cpg in (1, 2):
        for split, mp in ((1, None), (4, 792), (8, 1056)):
            yield dict(base, CPG=cpg, SPLIT_K=split, **({"MIN_PROGRAMS": mp} if mp else {}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["28672x4096", "4096x14336", "14336x4096", "12288x2048"])
    ap.add_argument("--ms", nargs="+", type=int, default=[16, 32, 64])
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(1)
    bad = 0
    for N, K, M, g, bias in [(4096, 4096, 16, 128, False), (1000, 2048, 33, 64, True), (6144, 4096, 100, 128, False),
                             (768, 1024, 5, -1, False)]:
        w = torch.randn(N, K, device=dev) * K ** -0.5
        pw = qk.PackedWeight.from_float(w.half(), bits=4, group_size=g)
        x = torch.randn(M, K, device=dev, dtype=torch.float16)
        b = torch.randn(N, device=dev, dtype=torch.float16) if bias else None
        r = ref.weight_only_linear(x, pw.qweight, pw.scales, pw.zeros, 4, pw.group_size, None, b).float()
        for cfg in configs(M):
            y = wz(x, pw, cfg, b).float()
            rel = ((y - r).norm() / r.norm()).item()
            ok = rel < 1e-3 and bool(torch.isfinite(y).all())
            bad += not ok
            if not ok:
                print(f"check N={N} K={K} M={M} g={g} bias={bias} {cfg}: rel {rel:.2e} FAILED", flush=True)
        print(f"check N={N} K={K} M={M} g={g} bias={bias}: last rel {rel:.2e}", flush=True)
    print(f"check: {bad} failed", flush=True)
    for shape in a.shapes:
        N, K = map(int, shape.split("x"))
        torch.manual_seed(0)
        lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
        torch.nn.init.normal_(lin.weight, std=K ** -0.5)
        q4 = QuantizedLinear.from_linear(lin, "w4a16")
        pw = qk.PackedWeight.from_float(lin.weight.detach(), bits=4, group_size=128)
        l4 = [copy.deepcopy(q4) for _ in range(chain_copies(_nbytes(q4)))]
        pws = [copy.deepcopy(pw) for _ in range(len(l4))]
        for M in a.ms:
            x = torch.randn(M, K, device=dev, dtype=torch.float16)
            with torch.inference_mode():
                base = chain_us([lambda q=q: q(x) for q in l4], True)
                res = []
                for cfg in configs(M):
                    try:
                        res.append((chain_us([lambda p=p: wz(x, p, cfg) for p in pws], True), cfg))
                    except Exception as e:      # noqa: BLE001 (a probe: report and go on)
                        print(f"  {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
            us, cfg = min(res, key=lambda t: t[0])
            print(f"{shape} M={M:3d} w4a16 table {base:7.2f} us   wz best {us:7.2f} us ({base / us:.2f}x)  "
                  f"CPG {cfg['CPG']} split {cfg['SPLIT_K']}   all: {' '.join(f'{t:.1f}' for t, _ in res)}", flush=True)
        del l4, pws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

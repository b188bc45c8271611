"""Timing probe for the wgmma weight-only kernel (kernels/_weight_only_wg.py): variants built by editing its
source (written to a temp dir and imported), timed side by side with fp16 cuBLAS and dequantize + cuBLAS.
Variants drop one piece at a time (results are then wrong: timing only) to see what bounds the loop.
Usage: PYTHONPATH=src python3 scripts/probe_wg.py [M ...]"""
import importlib.util
import os
import sys
import tempfile

import torch

import qkernels as qk
from qkernels.bench.harness import time_us
from qkernels.kernels import _weight_only_wg as base
from qkernels.ops import weight_only as WO

SRC = open(base.__file__).read()
VARIANTS = {
    "base": [],
    "nodeq": [("        w = _wg_dequant(c_ring.index(stage).load(dl), sz, INT_Z, dt, st)    # overlaps wgmma i - 1\n", ""),
              ("        wb.store(w)\n", "")],
}


def load(name, edits):
    src = SRC.replace("from ._weight_only import", "from qkernels.kernels._weight_only import")
    for a, b in edits:
        assert a in src, (name, a)
        src = src.replace(a, b)
    d = tempfile.mkdtemp()
    path = os.path.join(d, f"wgvar_{name}.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"wgvar_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ms = [int(a) for a in sys.argv[1:]] or [1024, 4096]
    mods = {n: load(n, e) for n, e in VARIANTS.items()}
    dev = torch.device("cuda")
    cfgs = [dict(path="wg", BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=4, WQ=1),
            dict(path="wg", BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=5, num_warps=4, WQ=2),
            dict(path="wg", BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=5, num_warps=8, WQ=2),
            dict(path="wg", BLOCK_M=128, BLOCK_N=256, GROUP_M=8, STAGES=4, num_warps=8, WQ=1),
            dict(path="wg", BLOCK_M=256, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8, WQ=2)]
    for N, K in [(4096, 4096), (14336, 4096)]:
        w = torch.randn(N, K, device=dev, dtype=torch.float16) / K ** 0.5
        pw = qk.PackedWeight.from_float(w, 4, 128, symmetric=False)
        for M in ms:
            x = torch.randn(M, K, device=dev, dtype=torch.float16)
            t16 = time_us(lambda: torch.nn.functional.linear(x, w), mode="graph")
            line = [f"N={N} K={K} M={M} fp16 {t16:.1f}"]
            for cfg in cfgs:
                for name, mod in mods.items():
                    WO._kw_wg = lambda mod=mod: mod
                    WO._PLANS.clear()
                    t = time_us(lambda: WO._run_config(x, pw.qweight, pw.scale_zero, None, 4, 128, False, cfg),
                                mode="graph")
                    line.append(f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']}/{cfg['num_warps']}w/s{cfg['STAGES']}q{cfg['WQ']} {name} {t:.1f} ({t16 / t:.2f}x)")
            print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()

"""Where gvt's time goes at a config: the kernel with parts of its work taken out, each variant timed in the decode
chain (bench.decode_gemv's method, PDL on) beside the kernel as it is. A variant's outputs are wrong by design;
only its time means something: the time a part costs is the kernel's less the variant's, where the rest does not
reorder around the gap.

Variants (joined with "+", e.g. nocodes+nox): base (the kernel as it is), nocodes (the code words made from their
addresses instead of loaded), nox (x's B registers likewise), nosz (the (scale, zero) words likewise), nomma (the
dequantization and MMA asm replaced by an XOR of its inputs), noloop (no step runs: launch, the first step's loads,
the fix-up and the stores), nofix (SPLIT_K's fix-up skipped: every slice stores its partial sums as the output),
unmasked (EVEN_K: the code, (scale, zero) and x loads unpredicated, so the step past a slice's end re-reads its
first one, whose address the kernel already wraps to, and x rows past M read row M - 1, their output columns never
stored; its outputs stay right: no zeros written ahead of predicated loads, which Triton emits with or without
`other`).

Usage: PYTHONPATH=src python3 scripts/ablate_gvt.py --variants base nomma nocodes+nox+nosz noloop nofix \\
           --shapes 14336x4096 4096x14336 [--ms 16] [--config JSON ...]
W4A16 (random 4-bit g128 weights, copies spanning >= 256 MB). Each shape runs the table's config at each M (where
it is gvt) and every --config given (a gvt config; MIN_PROGRAMS decides whether SPLIT_K applies, as in the table).
Variants are Python modules written to a temporary directory (the Gluon compiler reads a kernel's source from its
file). GPU only (Gluon).
"""
import argparse
import copy
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_chain import weights  # noqa: E402

from qkernels._runtime import pdl  # noqa: E402
from qkernels.bench.decode_gemv import chain_us  # noqa: E402
from qkernels.ops import weight_only as WO  # noqa: E402
from qkernels.ops.weight_only import launch  # noqa: E402
import qkernels.kernels.weight_only.gvt as GVT  # noqa: E402

PARTS = ("base", "nocodes", "nox", "nosz", "nomma", "noloop", "nofix", "unmasked")


def _xor_asm(mt: int) -> str:
    """PTX with the MMA asm's operands (4 mt outputs, 16 + 16 mt inputs): the inputs XORed into every output."""
    n_out, ins = 4 * mt, [f"${4 * mt + i}" for i in range(16 + 16 * mt)]
    lines = [".reg .b32 a;", f"xor.b32 a, {ins[0]}, {ins[1]};"]
    lines += [f"lop3.b32 a, a, {ins[i]}, {ins[i + 1]}, 0x96;" for i in range(2, len(ins) - 1, 2)]
    lines += [f"mov.b32 ${i}, a;" for i in range(n_out)]
    return "{\n" + "\n".join(lines) + "\n}"


def _sub(src: str, pattern: str, repl: str, part: str) -> str:
    out, n = re.subn(pattern, lambda _: repl, src)
    if not n:
        raise SystemExit(f"variant {part}: its pattern is not in gvt.py any more ({pattern!r}): update this script")
    return out


def variant_source(parts: list) -> str:
    """gvt.py with the parts taken out."""
    src = Path(GVT.__file__).read_text().replace("from .gluon_shared import",
                                                "from qkernels.kernels.weight_only.gluon_shared import")
    addr = "(p + {}).to(gl.int64, bitcast=True)"
    for part in parts:
        if part == "nocodes":
            src = _sub(src, r"w = gl\.load\(p \+ k0 // \(32 // BITS\),(?: mask=_step_mask\([^)]*\), other=0,)?\s*"
                            r"cache_modifier=\"\.cg\"\)",
                       f"w = {addr.format('k0 // (32 // BITS)')}.to(gl.int32) * 7", part)
        elif part == "nox":
            src = _sub(src, r"lo = gl\.load\(p \+ k0 // 4, mask=ok, other=0\)",
                       f"lo = {addr.format('k0 // 4')} * 3", part)
            src = _sub(src, r"gl\.load\(p \+ k0 // 4 \+ 8, mask=ok, other=0\)",
                       f"{addr.format('k0 // 4 + 8')} * 5", part)
        elif part == "nosz":
            src = _sub(src, r"sz = gl\.load\(p \+ k // GROUP(?:, mask=_step_mask\([^)]*\), other=0)?\)",
                       f"sz = {addr.format('k // GROUP')}.to(gl.int32) & 0x03FF3C00", part)
        elif part == "nomma":
            src = _sub(src, r"_MMA1_C: gl\.constexpr",
                       "".join(f"{n} = gl.constexpr({_xor_asm(mt)!r})\n" for n, mt in
                               (("_MMA1", 1), ("_MMA2", 2), ("_MMA1_W", 1), ("_MMA2_W", 2)))
                       + "_MMA1_C: gl.constexpr", part)
        elif part == "noloop":
            src = _sub(src, r"for k0 in range\(k_lo, k_hi,", "for k0 in range(k_lo, k_lo,", part)
        elif part == "unmasked":
            for load in ('w = gl.load(p + k0 // (32 // BITS), cache_modifier=".cg")', "sz = gl.load(p + k // GROUP)"):
                src = _sub(src, re.escape(f"if EVEN_K and live is None:\n        {load}"),
                           f"if EVEN_K:\n        {load}", part)
            # x: rows past M read row M - 1 (their output columns are never stored), unpredicated
            for t in ("", "8 + "):
                src = _sub(src, re.escape(f"x64 + (m0 + {t}g).to(gl.int64)"), f"x64 + gl.minimum(m0 + {t}g, M - 1)"
                           ".to(gl.int64)", part)
            src = _sub(src, re.escape("    lo = gl.load(p + k0 // 4, mask=ok, other=0)"),
                       "    if EVEN_K:\n        lo = gl.load(p + k0 // 4)\n        hi = gl.load(p + k0 // 4 + 8)\n"
                       "    else:\n        lo = gl.load(p + k0 // 4, mask=ok, other=0)\n"
                       "        hi = gl.load(p + k0 // 4 + 8, mask=ok, other=0)", part)
            src = _sub(src, re.escape("_x_regs(lo, lo1, gl.load(p + k0 // 4 + 8, mask=ok, other=0))"),
                       "_x_regs(lo, lo1, hi)", part)
        elif part == "nofix":
            call = "_tile_sums(acc0, acc1, ws_ptr, cnt_ptr, pid_n, tok, row, ok_row, M, N, MT, "
            src = _sub(src, re.escape(call + "SPLIT_K)"), call + "1)", part)
    return src


def load_variant(name: str, parts: list, tmp: Path):
    path = tmp / f"gvt_{name.replace('+', '_')}.py"
    path.write_text(variant_source(parts))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=["base", "nomma", "nocodes", "nocodes+nox+nosz", "noloop",
                                                       "nofix"])
    ap.add_argument("--shapes", nargs="+", default=["14336x4096"], help="N x K")
    ap.add_argument("--ms", type=int, nargs="+", default=[16])
    ap.add_argument("--config", action="append", default=[], help="a gvt config as JSON (repeatable)")
    a = ap.parse_args()
    for v in a.variants:
        bad = [p for p in v.split("+") if p not in PARTS]
        if bad:
            ap.error(f"--variants {v!r}: unknown part(s) {bad}; expected '+'-joined parts of {PARTS}")
    if not torch.cuda.is_available():
        ap.error("a GPU is needed (gvt is a Gluon kernel: no interpreter)")
    extra = [json.loads(c) for c in a.config]
    dev = torch.device("cuda")
    with tempfile.TemporaryDirectory() as d:
        mods = {v: load_variant(v, [p for p in v.split("+") if p != "base"], Path(d)) for v in a.variants}
        kernel = GVT._wo_gvt_kernel
        try:
            for s in a.shapes:
                n, k = (int(v) for v in s.split("x"))
                pws = weights(4, n, k, dev)
                fns = [lambda x, pw=pw: WO._weight_only(x, pw, None, 4, "w4a16_linear", False) for pw in pws]
                for m in a.ms:
                    x = torch.randn(m, k, device=dev, dtype=torch.float16)
                    for cfg in [WO.dispatch.config_for(4, m, n, k, dev)] + extra:
                        if cfg is None or cfg.get("path") != "gvt":
                            print(f"{s} M={m:2d}: not a gvt config: {cfg}", flush=True)
                            continue
                        cells = []
                        for v, mod in mods.items():
                            GVT._wo_gvt_kernel = mod._wo_gvt_kernel
                            launch._PLANS.clear()          # plans hold the kernel, the layers their replays
                            for pw in pws:
                                pw.__dict__.pop("_eager_plans", None)
                            with pdl(True), WO.use_config(copy.deepcopy(cfg)):
                                cells.append(f"{v} {chain_us([lambda f=f: f(x) for f in fns], True):7.2f}")
                        shown = {key: val for key, val in cfg.items() if key != "fallback"}
                        print(f"{s} M={m:2d} {json.dumps(shown)}\n    " + "  ".join(cells), flush=True)
                del pws, fns
        finally:
            GVT._wo_gvt_kernel = kernel
            launch._PLANS.clear()


if __name__ == "__main__":
    main()

"""Weight-only configs side by side in the decode chain, with programmatic dependent launch on and off: each config
timed as bench.decode_gemv / tune_weight_only.py --chain time it (one CUDA graph calling it on weight copies spanning
>= 256 MB, so no weight is in L2 when its call runs), on the shapes given. For questions the tuner does not ask: how
much a kernel gains or loses from PDL, or from a change to where it lets the next kernel start
(docs/design/weight-only.md, "wg at batched decode").

Usage: PYTHONPATH=src python3 scripts/ab_chain.py --bits 4 --ms 16 32 --shapes 1024x4096 14336x4096 \\
           --config '{"path": "wg", "BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 8, "STAGES": 6, "num_warps": 4}' \\
           [--config ...] [--table]      (--table: also the GPU's table config for each M and shape)
BLOCK_M of a "wg" / "tc" config is set to M where it is smaller than M. --scheme w4a16 | w8a16 | w8a8 | w8a8-fp8
times `QuantizedLinear` layers of that scheme as `quantize_` makes them, through the table (with --table only: the
W8A8 linears take no weight-only config). --swiglu: the weight-only calls as a merged [gate; up] projection with SwiGLU
applied in the call (what a fused MLP runs: QuantizedLinear.forward_swiglu). --maxnreg N [N ...] (with --table): also
each shape's table config with its registers per thread capped at N (ptxas spills the rest), where more programs per
SM might hide more latency. --fp16: also fp16 `F.linear` on copies of an fp16 weight spanning >= 256 MB (the baseline
the decode-GEMV bench divides by), PDL not applying. --timeline (GPU): under each line, per shape, one replay of the
chain under torch.profiler: the median kernel duration, period and gap between kernels (bench.decode_gemv.
chain_timeline), so a per-call cost inside the kernels is told from one between them. Without a GPU it runs eagerly
under the interpreter (TRITON_INTERPRET=1, small shapes): a check of the script, not a timing.
"""
import argparse
import contextlib
import json

import torch

import qkernels as qk
from qkernels._runtime import pdl
from qkernels.bench.decode_gemv import _nbytes, chain_copies, chain_timeline, chain_us
from qkernels.ops import weight_only as WO


def weights(bits: int, n: int, k: int, dev) -> list:
    """Copies of one random weight (4-bit g128 asymmetric or 8-bit per channel) spanning >= 256 MB (two on a
    CPU)."""
    w = torch.randn(n, k, device=dev, dtype=torch.float16) / k ** 0.5
    make = (lambda: qk.PackedWeight.from_float(w, 4, 128, symmetric=False)) if bits == 4 else \
        (lambda: qk.PackedWeight.from_float(w, 8, -1, symmetric=True))
    first = make()
    copies = chain_copies(first.qweight.nbytes + first.scale_zero.nbytes) if dev.type == "cuda" else 2
    return [first] + [make() for _ in range(copies - 1)]


def layers(scheme: str, n: int, k: int, dev) -> list:
    """QuantizedLinear layers of `scheme` from one random fp16 linear, copies spanning >= 256 MB (two on a CPU)."""
    from qkernels.nn.linear import QuantizedLinear
    lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.float16)
    first = QuantizedLinear.from_linear(lin, scheme)
    copies = chain_copies(_nbytes(first)) if dev.type == "cuda" else 2
    return [first] + [QuantizedLinear.from_linear(lin, scheme) for _ in range(copies - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=int, choices=(4, 8), default=4)
    ap.add_argument("--ms", type=int, nargs="+", default=[16])
    ap.add_argument("--shapes", nargs="+", default=["1024x4096", "4096x4096", "14336x4096"], help="N x K")
    ap.add_argument("--config", action="append", default=[], help="a weight-only config as JSON (repeatable)")
    ap.add_argument("--table", action="store_true", help="also the table's config for each M and shape")
    ap.add_argument("--maxnreg", type=int, nargs="+", default=[],
                    help="with --table: also the table's configs capped at these registers per thread")
    ap.add_argument("--swiglu", action="store_true", help="weight-only: silu(gate) * up in the call (N = 2 I)")
    ap.add_argument("--scheme", choices=("w4a16", "w8a16", "w8a8", "w8a8-fp8"),
                    help="QuantizedLinear layers of this scheme through the table (with --table, no --config)")
    ap.add_argument("--fp16", action="store_true", help="also fp16 F.linear in the same chain method (a baseline)")
    ap.add_argument("--timeline", action="store_true",
                    help="GPU: per line and shape the kernels' median duration, period and gap in one profiled replay")
    a = ap.parse_args()
    if not a.config and not a.table:
        ap.error("name at least one --config, or --table")
    if a.scheme and a.config:
        ap.error(f"--scheme {a.scheme} times the table's configs only: drop --config")
    if a.maxnreg and (not a.table or a.scheme):
        ap.error("--maxnreg caps the table's weight-only configs: give --table, without --scheme")
    if a.swiglu and a.scheme in ("w8a8", "w8a8-fp8"):
        ap.error(f"--swiglu applies to the weight-only schemes, got --scheme {a.scheme}")
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes]
    if a.scheme:
        ws = {s: [m.forward_swiglu if a.swiglu else m for m in layers(a.scheme, *s, dev)] for s in shapes}
    else:
        name = f"w{a.bits}a16_linear"
        ws = {s: [lambda x, pw=pw: WO._weight_only(x, pw, None, a.bits, name, a.swiglu)
                  for pw in weights(a.bits, *s, dev)] for s in shapes}
    # a config, None (the table's), or an int (the table's, capped at that many registers per thread)
    cfgs = [json.loads(c) for c in a.config] + ([None] if a.table else []) + a.maxnreg
    print(f"{a.scheme or f'w{a.bits}a16'}{' with SwiGLU' if a.swiglu else ''}, µs per call, shapes "
          f"{' '.join(a.shapes)}", flush=True)
    def measure(calls, lines):
        """µs per call of the chain, and with --timeline on a GPU its kernels' timeline (appended to `lines`)."""
        t = chain_us(calls, gpu)
        if a.timeline and gpu:
            tl = chain_timeline(calls)
            lines.append(f"{tl['kernel_us']:.2f}/{tl['period_us']:.2f}/{tl['gap_us']:.2f}"
                         + (f" x{tl['kernels_per_call']:g}" if tl["kernels_per_call"] != 1 else ""))
        return t

    def show(head, times, name, lines):
        print(f"M={m:3d} {head} {' '.join(f'{t:8.2f}' for t in times)}  {name}", flush=True)
        if lines:
            print(f"       kernel/period/gap µs: {'  '.join(lines)}", flush=True)

    if a.timeline and not gpu:
        print("--timeline: no GPU, no profile (times only)", flush=True)
    for m in a.ms:
        if a.fp16:
            times, lines = [], []
            for n, k in shapes:
                w = torch.randn(n, k, device=dev, dtype=torch.float16) / k ** 0.5
                copies = [w] + [w.clone() for _ in range(chain_copies(w.nbytes) - 1 if gpu else 1)]
                x = torch.randn(m, k, device=dev, dtype=torch.float16)
                times.append(measure([lambda c=c: torch.nn.functional.linear(x, c) for c in copies], lines))
                del w, copies
            show("fp16  ", times, "F.linear", lines)
        for cfg in cfgs:
            if isinstance(cfg, dict) and cfg.get("path") in ("wg", "tc") and cfg.get("BLOCK_M", m) < m:
                cfg = dict(cfg, BLOCK_M=m)
            for on in (True, False):
                times, lines = [], []
                for (n, k), fns in ws.items():
                    x = torch.randn(m, k, device=dev, dtype=torch.float16)
                    calls = [lambda f=f: f(x) for f in fns]
                    run = cfg
                    if isinstance(cfg, int):
                        base = WO.dispatch.config_for(a.bits, m, n, k, dev)
                        if base is None:
                            raise SystemExit(f"--maxnreg: no config table for {n}x{k} at M={m} on this GPU")
                        run = dict(base, maxnreg=cfg)
                    with pdl(on), (WO.use_config(run) if run is not None else contextlib.nullcontext()):
                        times.append(measure(calls, lines))
                name = "table" if cfg is None else f"table, maxnreg={cfg}" if isinstance(cfg, int) else json.dumps(cfg)
                show("PDL   " if on else "no PDL", times, name, lines)

if __name__ == "__main__":
    main()

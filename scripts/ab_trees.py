"""Two (or more) source trees side by side in the decode chain: each tree's kernels, with its own config tables,
timed as bench.decode_gemv times a provider (one CUDA graph calling the layer on weight copies spanning >= 256 MB,
PDL on) for every scheme, M and shape given. For a change to the kernels' code (a cache hint, a loop) that the
config tuners cannot see: the tree before it against the tree after it, in the same run on the same GPU.
--step MODEL: instead, the runtime's captured decode step of that model (scripts/table_ab.py's child: bench.runtime's
method, each tree with its own shipped tables) per scheme and batch (--batches), for a change outside the GEMVs.

Usage: PYTHONPATH=src python3 scripts/ab_trees.py --tree OLD_SRC --tree here [--schemes w4a16 w8a16 w8a8]
           [--ms 1 8 16] [--shapes 1024x4096 14336x4096 ...] [--rounds 2]
       PYTHONPATH=src python3 scripts/ab_trees.py --tree OLD_SRC --tree here --step llama3-8b [--schemes fp16 w4a16]
           [--batches 1 32] [--rounds 2]
A tree is a directory holding the qkernels package (e.g. `git archive HEAD src/qkernels | tar x -C /tmp/old
--strip-components=1` gives /tmp/old/qkernels); "here" names this checkout's src. Each tree runs in its own
process, once per round, the trees alternating (old, new, old, new, ...), so a difference is told from the
run-to-run spread. Prints µs per call per tree and round, and the ratio of the trees' best times to the first
tree's. Without a GPU: small shapes under the interpreter, eagerly (a check of the script, not a timing).
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"


def one(schemes: list, ms: list, shapes: list) -> None:
    """In the child: one JSON line per (scheme, M, shape) with µs per call."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ab_chain import layers
    from qkernels._runtime import pdl
    from qkernels.bench.decode_gemv import chain_us
    import qkernels
    print(json.dumps({"package": str(Path(qkernels.__file__).resolve().parent)}), flush=True)
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    for scheme in schemes:
        for n, k in shapes:
            ls = layers(scheme, n, k, dev)
            for m in ms:
                x = torch.randn(m, k, device=dev, dtype=torch.float16)
                with pdl(True):
                    us = chain_us([lambda l=l: l(x) for l in ls], gpu)
                print(json.dumps({"case": f"{scheme} M={m} {n}x{k}", "us": us}), flush=True)
            del ls
            if gpu:
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], help='a directory holding qkernels/, or "here"')
    ap.add_argument("--schemes", nargs="+", default=["w4a16", "w8a16", "w8a8"],
                    choices=("fp16", "w4a16", "w8a16", "w8a8", "w8a8-fp8", "w4a16+head"), help="fp16, +head: --step")
    ap.add_argument("--step", metavar="MODEL", help="time the runtime's decode step of MODEL instead of the chain")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="--step: the batch sizes")
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--shapes", nargs="+", default=["1024x4096", "4096x4096", "6144x4096", "14336x4096",
                                                    "28672x4096", "4096x14336"], help="N x K")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes]
    except ValueError:
        ap.error(f"--shapes: expected N x K pairs such as 4096x4096, got {a.shapes}")
    if a.one:
        return one(a.schemes, a.ms, shapes)
    if a.rounds < 1 or min(a.ms) < 1 or min(a.batches) < 1:
        ap.error(f"--rounds, --ms and --batches: expected positive integers, got {a.rounds}, {a.ms} and {a.batches}")
    if not a.step and any(s in ("fp16", "w4a16+head") for s in a.schemes):
        ap.error(f"--schemes {a.schemes}: fp16 and w4a16+head are for --step")
    if a.step:
        child = [str(Path(__file__).resolve().parent / "table_ab.py"), "--one", "--model", a.step, "--schemes",
                 *a.schemes, "--batches", *map(str, a.batches)]
    else:
        child = [__file__, "--one", "--schemes", *a.schemes, "--ms", *map(str, a.ms), "--shapes", *a.shapes]
    if len(a.tree) < 2:
        ap.error("name at least two --tree (a directory holding qkernels/, or 'here')")
    paths = [HERE if t == "here" else Path(t).resolve() for t in a.tree]
    for t, p in zip(a.tree, paths):
        if not (p / "qkernels" / "__init__.py").is_file():
            ap.error(f"--tree {t!r}: expected a directory holding the qkernels package (qkernels/__init__.py)")
    times: dict = {}           # (tree index, case) -> [µs per round]
    cases: list = []
    for _ in range(a.rounds):
        for i, p in enumerate(paths):
            env = dict(os.environ, PYTHONPATH=str(p))
            env.pop("QKERNELS_CONFIG_DIR", None)         # each tree's own tables
            run = subprocess.run([sys.executable, *child], env=env, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"tree {a.tree[i]}: the timing failed\n{run.stderr[-3000:]}")
            for line in run.stdout.splitlines():
                if line.startswith("{"):
                    r = json.loads(line)
                    if "package" in r:       # the child imported this tree's package, not another on its path
                        if Path(r["package"]) != (p / "qkernels").resolve():
                            sys.exit(f"tree {a.tree[i]}: the timing imported qkernels from {r['package']}")
                        continue
                    if a.step:
                        r = {"case": f"{a.step} {r['scheme']} batch {r['batch']} step", "us": r["us"]}
                    if r["case"] not in cases:
                        cases.append(r["case"])
                    times.setdefault((i, r["case"]), []).append(r["us"])
    import torch
    print("µs per call, each tree's rounds" + ("" if torch.cuda.is_available() else
                                                " (interpreter, eager: not a timing)"))
    print("trees: " + "  ".join(f"[{i}] {t}" for i, t in enumerate(a.tree)))
    for c in cases:
        row = [times[(i, c)] for i in range(len(paths))]
        cells = "   ".join(f"[{i}] " + " ".join(f"{v:8.2f}" for v in r) for i, r in enumerate(row))
        ratios = " ".join(f"{min(r) / min(row[0]):.3f}" for r in row[1:])
        print(f"{c:{max(28, len(c))}s} {cells}   best / [0]: {ratios}", flush=True)


if __name__ == "__main__":
    main()

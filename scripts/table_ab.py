"""Config tables side by side in the decode step they serve: the runtime's captured step (bench.runtime's method: a
128-token context in a 2112-position cache, one decode step for the whole batch as a CUDA graph, median replay
time) per table, scheme and batch. A decode-chain sweep (tune_*.py --chain) times one shape's calls back to back;
in the step each kernel follows a different one, and under programmatic dependent launch that meeting can cost more
than the chain shows (docs/design/weight-only.md, "A decode-chain sweep that misled"). So a swept table is checked
here before it is kept.

Usage: PYTHONPATH=src python3 scripts/table_ab.py --table OLD_DIR --table NEW_DIR [--model llama3-8b]
           [--schemes w4a16 w8a16] [--batches 1 8 32]
A table is a directory holding <gpu slug>.json (QKERNELS_CONFIG_DIR); "shipped" names the package's own. Each
table runs in its own process (the tables are read once per process). Without a GPU: a tiny model under the
interpreter (the bench's tiny Llama, whatever --model says), eagerly, with the interpreter's own configs (a check
of the script, not a timing).
"""
import argparse
import json
import os
import subprocess
import sys


def one(model: str, schemes: list, batches: list) -> None:
    """In the child: one JSON line per (scheme, batch) with the step time in µs."""
    import torch

    from qkernels.bench.model import hf_model, model_configs
    from qkernels.bench.runtime import CTX, runtime_decode
    from qkernels.models import from_pretrained
    import qkernels
    print(json.dumps({"package": str(os.path.dirname(os.path.abspath(qkernels.__file__)))}), flush=True)
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    cfg = model_configs(tiny=False)[model] if gpu else next(iter(model_configs(tiny=True).values()))
    with torch.device(dev):
        hf = hf_model(cfg, torch.float16)
    ctx = CTX if gpu else 8
    for scheme in schemes:
        base = scheme.removesuffix("+head")
        m = from_pretrained(hf, None if base == "fp16" else base, device=dev, dtype=torch.float16,
                            quantize_lm_head=scheme.endswith("+head"))
        for b in batches:
            ms, step = runtime_decode(m, b, ctx, gpu)
            print(json.dumps({"scheme": scheme, "batch": b, "us": ms * 1e3}), flush=True)
            del step
        del m
        if gpu:
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="append", default=[], help='a directory with <gpu>.json, or "shipped"')
    ap.add_argument("--model", default="llama3-8b", help="a model of bench.model.model_configs")
    ap.add_argument("--schemes", nargs="+", default=["w4a16"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one(a.model, a.schemes, a.batches)
    if len(a.table) < 1:
        ap.error("name at least one --table")
    from qkernels.bench.model import model_configs
    if a.model not in model_configs(tiny=False):
        ap.error(f"--model {a.model!r}: expected one of {sorted(model_configs(tiny=False))}")
    for t in a.table:
        if t != "shipped" and not os.path.isdir(t):
            ap.error(f"--table {t!r}: expected a directory holding <gpu slug>.json, or 'shipped'")
    results = {}
    for t in a.table:
        env = {k: v for k, v in os.environ.items() if k != "QKERNELS_CONFIG_DIR"}
        if t != "shipped":
            env["QKERNELS_CONFIG_DIR"] = os.path.abspath(t)
        run = subprocess.run([sys.executable, __file__, "--one", "--model", a.model, "--schemes", *a.schemes,
                              "--batches", *map(str, a.batches)], env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"table {t}: the step failed\n{run.stderr[-3000:]}")
        for line in run.stdout.splitlines():
            if line.startswith("{") and "package" not in line:
                r = json.loads(line)
                results[(t, r["scheme"], r["batch"])] = r["us"]
    print(f"{a.model}, µs per decode step" + ("" if _gpu() else " (interpreter, eager: not a timing)"))
    print("scheme, batch".ljust(18) + "".join(t[-24:].rjust(26) for t in a.table))
    for s in a.schemes:
        for b in a.batches:
            print(f"{s}, {b}".ljust(18) + "".join(f"{results[(t, s, b)]:26.1f}" for t in a.table))


def _gpu() -> bool:
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    main()

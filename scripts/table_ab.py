"""Config tables side by side in the decode step they serve: the runtime's captured step (bench.runtime's method: a
128-token context in a 2112-position cache, one decode step for the whole batch as a CUDA graph, median replay
time) per table, scheme and batch. A decode-chain sweep (tune_*.py --chain) times one shape's calls back to back;
in the step each kernel follows a different one, and under programmatic dependent launch that meeting can cost more
than the chain shows (docs/design/weight-only.md, "A decode-chain sweep that misled"). So a swept table is checked
here before it is kept.

Usage: PYTHONPATH=src python3 scripts/table_ab.py --table OLD_DIR --table NEW_DIR [--model llama3-8b]
           [--schemes w4a16 w8a16] [--batches 1 8 32] [--each [--keep DIR]]
A table is a directory holding <gpu slug>.json (QKERNELS_CONFIG_DIR); "shipped" names the package's own. Each
table runs in its own process (the tables are read once per process).

--each (two tables, OLD and NEW: a sweep's table against the one before it): OLD, then OLD with each entry that NEW
changes (a shape override added, changed or dropped; a bucket's config), one entry at a time, so that a sweep's
entries are judged one by one in the step (together they can lose where some of them win). An entry wins where its
step is faster than OLD's by more than WIN at every batch; --keep DIR writes OLD with the winning entries into DIR
(<gpu slug>.json), to be checked once more against OLD and copied into the package. Without a GPU: a tiny model under the
interpreter (the bench's tiny Llama, whatever --model says), eagerly, with the interpreter's own configs (a check
of the script, not a timing).
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

WIN = 0.005             # --each: an entry wins where its step is this much faster than OLD's at every batch


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
    ap.add_argument("--each", action="store_true", help="two tables OLD NEW: OLD + each entry NEW changes, in turn")
    ap.add_argument("--keep", help="with --each: write OLD with the winning entries into this directory")
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
    if a.each and len(a.table) != 2:
        ap.error(f"--each compares two tables, OLD and NEW: got {len(a.table)}")
    if a.keep and not a.each:
        ap.error("--keep goes with --each")
    if a.each:
        return each(a)
    results = {}
    for t in a.table:
        results.update({(t,) + k: us for k, us in _time(t, a).items()})
    print(f"{a.model}, µs per decode step" + ("" if _gpu() else " (interpreter, eager: not a timing)"))
    print("scheme, batch".ljust(18) + "".join(t[-24:].rjust(26) for t in a.table))
    for s in a.schemes:
        for b in a.batches:
            print(f"{s}, {b}".ljust(18) + "".join(f"{results[(t, s, b)]:26.1f}" for t in a.table))


def _time(table: str, a) -> dict:
    """{(scheme, batch): µs per step} of the runtime under `table` (a directory or "shipped"), in a process of its
    own."""
    env = {k: v for k, v in os.environ.items() if k != "QKERNELS_CONFIG_DIR"}
    if table != "shipped":
        env["QKERNELS_CONFIG_DIR"] = os.path.abspath(table)
    run = subprocess.run([sys.executable, __file__, "--one", "--model", a.model, "--schemes", *a.schemes,
                          "--batches", *map(str, a.batches)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"table {table}: the step failed\n{run.stderr[-3000:]}")
    out = {}
    for line in run.stdout.splitlines():
        if line.startswith("{") and "package" not in line:
            r = json.loads(line)
            out[(r["scheme"], r["batch"])] = r["us"]
    return out


def _tables(table: str) -> dict:
    """{file name: its JSON} of a table directory ("shipped": the package's)."""
    if table == "shipped":
        from qkernels import configs
        table = os.path.dirname(os.path.abspath(configs.__file__))
    return {f: json.load(open(os.path.join(table, f))) for f in sorted(os.listdir(table)) if f.endswith(".json")}


def changes(old: dict, new: dict) -> list:
    """The entries NEW changes against OLD, per table file: [(file, kind, key, NEW's value or None: dropped)], in
    NEW's order (then OLD's dropped ones); files only one side has are not compared."""
    out = []
    for f in old.keys() & new.keys():
        for kind in sorted(old[f].keys() | new[f].keys()):
            a, b = old[f].get(kind, {}), new[f].get(kind, {})
            out += [(f, kind, k, v) for k, v in b.items() if a.get(k) != v]
            out += [(f, kind, k, None) for k in a if k not in b]
    return sorted(out, key=lambda c: (c[0], c[1]))


def applied(old: dict, entries: list) -> dict:
    """OLD with `entries` (as changes() lists them) applied."""
    out = copy.deepcopy(old)
    for f, kind, key, value in entries:
        if value is None:
            out[f].get(kind, {}).pop(key, None)
        else:
            out[f].setdefault(kind, {})[key] = value
    return out


def _write(tables: dict, d: str) -> str:
    os.makedirs(d, exist_ok=True)
    for f, doc in tables.items():
        with open(os.path.join(d, f), "w") as fh:
            json.dump(doc, fh, indent=1)
    return d


def each(a) -> None:
    """--each: OLD, then OLD + each entry NEW changes, in the step; the winners (and --keep's table)."""
    old, new = _tables(a.table[0]), _tables(a.table[1])
    entries = changes(old, new)
    if not entries:
        print(f"{a.table[1]} changes no entry of {a.table[0]}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = _time(_write(old, os.path.join(tmp, "old")), a)
        cols = sorted(base)
        print(f"{a.model}, µs per decode step" + ("" if _gpu() else " (interpreter, eager: not a timing)"))
        print("entry".ljust(44) + "".join(f"{s}, {b}".rjust(22) for s, b in cols))
        print("OLD".ljust(44) + "".join(f"{base[c]:22.1f}" for c in cols))
        winners = []
        for i, entry in enumerate(entries):
            got = _time(_write(applied(old, [entry]), os.path.join(tmp, f"e{i}")), a)
            wins = all(got[c] < base[c] * (1 - WIN) for c in cols)
            winners += [entry] if wins else []
            name = f"{entry[1]} {entry[2]}" + (" (dropped)" if entry[3] is None else "")
            print(f"{name[:43]:44}" + "".join(f"{got[c]:14.1f} ({100 * (got[c] / base[c] - 1):+5.1f}%)"
                                                 for c in cols) + ("  wins" if wins else ""))
    print(f"{len(winners)} of {len(entries)} entries win at every batch by more than {100 * WIN:g}%")
    if a.keep:
        print(f"wrote {_write(applied(old, winners), a.keep)}: OLD with the winners (check it against OLD once more)")


def _gpu() -> bool:
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    main()

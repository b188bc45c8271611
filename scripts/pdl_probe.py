"""Where programmatic dependent launch (PDL) costs the runtime's decode step, per projection. The step is timed by
scripts/table_ab.py (each table in its own process) under the GPU's shipped table and under one table per projection
the runtime calls (q|k|v, o, gate|up with SwiGLU, down), in which that projection's weight-only config at each named
batch's M bucket carries "PDL": false (launched without PDL: it starts when the kernel before it has ended, and the
one after it when it has), plus one with all four. A projection whose table is clearly faster at every rerun earns
that entry in the shipped table (docs/design.md, "Qwen3-1.7B at batch 32 on the H200"). A decode-chain sweep cannot
show this: under PDL a kernel meets the different kernels around it in the step, not copies of itself.

Usage: PYTHONPATH=src python3 scripts/pdl_probe.py --model qwen3-1.7b [--schemes w4a16 w8a16] [--batches 32]
           [--projections q|k|v o gate|up down] [--out DIR]
(the tables go to DIR/<projection>/<gpu slug>.json; default: a temporary directory).
Without a GPU the tables are built from the H100's and table_ab runs the interpreter's tiny model (which reads no
table): a check of the script, not a timing.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECTIONS = {"q|k|v": "q|k|v", "o": "q, o", "gate|up": "gate|up", "down": "down"}   # -> bench.decode_gemv layer


def projection_shapes(model: str) -> dict:
    """{projection: (N, K)} of the runtime's weight-only calls in one decoder layer (merged q|k|v and gate|up)."""
    from qkernels.bench.decode_gemv import SHAPES
    if model not in SHAPES:
        raise ValueError(f"--model: expected one of {sorted(SHAPES)}, got {model!r}")
    by_layer = {layer: (n, k) for n, k, layer in SHAPES[model]}
    return {p: by_layer[layer] for p, layer in PROJECTIONS.items()}


def pdl_off_table(table: dict, kinds: list, ms: list, shapes: list) -> dict:
    """A copy of a GPU's config table in which each (kind, M, shape) config is its own entry "<bucket>:N<N>:K<K>"
    (what configs.lookup returned for it) with "PDL": false; everything else as it was."""
    from qkernels import configs
    out = json.loads(json.dumps(table))
    for kind in kinds:
        t = out[kind]
        for m in ms:
            for n, k in shapes:
                cfg = dict(configs.lookup(t, m, n, k), PDL=False)
                t[f"{configs.bucket_key(t, m)}:N{n}:K{k}"] = cfg
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-1.7b")
    ap.add_argument("--schemes", nargs="+", default=["w4a16"], choices=["w4a16", "w8a16"])
    ap.add_argument("--batches", type=int, nargs="+", default=[32])
    ap.add_argument("--projections", nargs="+", choices=list(PROJECTIONS), default=list(PROJECTIONS))
    ap.add_argument("--out", type=Path, help="where the tables go (default: a temporary directory)")
    a = ap.parse_args()
    try:
        shapes = {p: s for p, s in projection_shapes(a.model).items() if p in a.projections}
    except ValueError as e:
        ap.error(str(e))
    import torch

    from qkernels import configs
    from qkernels._runtime import device_name, gpu_slug
    slug = gpu_slug(device_name(torch.device("cuda"))) if torch.cuda.is_available() else "h100"
    shipped = configs.load(slug)
    root = a.out or Path(tempfile.mkdtemp(prefix="pdl_probe_"))
    tables = ["shipped"]
    sets = [(p, [s]) for p, s in shapes.items()] + ([("all", list(shapes.values()))] if len(shapes) > 1 else [])
    for name, sel in sets:
        d = root / name.replace("|", "_")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{slug}.json").write_text(json.dumps(pdl_off_table(shipped, a.schemes, a.batches, sel), indent=1) + "\n")
        tables.append(str(d))
    named = ", ".join(f"{p} {n}x{k}" for p, (n, k) in shapes.items())
    print(f"{a.model}: weight-only PDL off for one projection per table ({named}; 'all': all of them), tables under "
          f"{root}", flush=True)
    cmd = [sys.executable, str(Path(__file__).with_name("table_ab.py")), "--model", a.model, "--schemes", *a.schemes,
           "--batches", *map(str, a.batches)]
    for t in tables:
        cmd += ["--table", t]
    sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()

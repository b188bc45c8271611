"""Pick decode attention's config per batch bucket on this GPU and write it into src/qkernels/configs/<gpu>.json (kind
"decode_attention"). Each candidate is timed in the runtime's captured decode step (bench.runtime's method: a
128-token context in a 2112-position cache, one CUDA graph, median replay time), where attention meets its
neighbours under programmatic dependent launch, not alone. In that step attention costs 4 µs a layer at batch 1 and
14 at batch 32 on the H200, for about 4 µs of key and value bytes at batch 32 (measured on the H200):
its grid and tiles, not its bytes. Candidates: BLOCK_S keys per tile, warps, the pipeline's stages, WAVES (a full
cache's grid in programs per SM: the most splits a sequence's keys spread over), PREFETCH (the first key tile read
before the PDL wait: the runtime allows it; it holds the tile in registers, so fewer programs fit an SM).

Usage: PYTHONPATH=src python3 scripts/tune_attention.py [--model llama3-8b] [--scheme w4a16] [--batches 1 8 32]
           [--ctx 128] [--write]
--write: each batch's bucket takes the fastest candidate where it beats the table's config (the built-in default
where the table has none) by more than 1% (replays in one process repeat within ~0.3%; a pick that close may not
hold in another process: check it with table_ab.py), else keeps that config. Without a GPU: the
bench's tiny Llama under the interpreter, eagerly, two candidates (a check of the script, not a timing; no --write).
"""
import argparse
import json

import torch

CANDIDATES = [dict(BLOCK_S=s, num_warps=w, num_stages=st, WAVES=v, PREFETCH=p) for s, w, st, v, p in (
    (64, 4, 2, 2, False), (64, 4, 2, 2, True), (32, 4, 2, 2, False), (32, 4, 2, 2, True), (32, 4, 1, 2, False),
    (64, 4, 1, 2, False), (64, 4, 3, 2, False), (64, 8, 2, 2, False), (64, 8, 2, 2, True), (64, 2, 2, 2, False),
    (64, 4, 2, 1, False), (64, 4, 2, 1, True), (64, 4, 2, 4, False), (32, 4, 2, 4, False), (128, 4, 2, 2, False),
    (128, 8, 2, 2, False))]
GAIN = 0.99


def main():
    from qkernels import configs
    from qkernels._runtime import device_name, gpu_slug, next_pow2
    from qkernels.bench.model import hf_model, model_configs
    from qkernels.bench.runtime import runtime_decode
    from qkernels.models import from_pretrained
    from qkernels.ops import attention as A

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b", help="a model of bench.model.model_configs")
    ap.add_argument("--scheme", default="w4a16", help="the linears' scheme (fp16: unquantized)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--ctx", type=int, default=128, help="tokens in the cache before the timed step")
    ap.add_argument("--write", action="store_true", help="write the picks into configs/<gpu>.json")
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    if a.model not in model_configs(tiny=False):
        ap.error(f"--model {a.model!r}: expected one of {sorted(model_configs(tiny=False))}")
    if min(a.batches) < 1 or a.ctx < 1:
        ap.error(f"--batches and --ctx: expected positive integers, got {a.batches} and {a.ctx}")
    if a.write and not gpu:
        ap.error("--write needs a GPU (the table is that GPU's)")
    dev = torch.device("cuda" if gpu else "cpu")
    cfg = model_configs(tiny=False)[a.model] if gpu else next(iter(model_configs(tiny=True).values()))
    with torch.device(dev):
        hf = hf_model(cfg, torch.float16)
    model = from_pretrained(hf, None if a.scheme == "fp16" else a.scheme, device=dev, dtype=torch.float16)
    del hf
    ctx = a.ctx if gpu else 8
    cands = CANDIDATES if gpu else CANDIDATES[:2]
    slug = gpu_slug(device_name(dev)) if gpu else None
    table = json.loads(configs.table_path(slug).read_text()) if gpu and configs.table_path(slug).exists() else {}
    tab = table.get("decode_attention") or {}
    picks = {}
    print(f"{a.model} {a.scheme}, µs per decode step at context {ctx}" + ("" if gpu else
                                                                           " (interpreter, eager: not a timing)"))
    for b in a.batches:
        current = configs.pick(tab or configs.DEFAULT_DECODE_ATTENTION, b)
        times = []
        for c in cands + ([] if current in cands else [current]):
            with A.use_config(c):
                ms, step = runtime_decode(model, b, ctx, gpu)
            del step
            times.append((ms * 1e3, c))
            print(f"batch {b:3d} {json.dumps(c)} {ms * 1e3:9.1f}", flush=True)
        base = next(t for t, c in times if c == current)
        best, cfg_best = min(times, key=lambda r: r[0])
        pick = cfg_best if best < GAIN * base else current
        picks[str(next_pow2(b))] = pick
        print(f"==> batch {b} (bucket {next_pow2(b)}): {json.dumps(pick)} ({best:.1f} vs the table's {base:.1f} µs)",
              flush=True)
    if a.write:
        table["decode_attention"] = {**tab, **picks}
        path = configs.table_path(slug)
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Per-GPU kernel configs as data: configs/<gpu slug>.json, picked by device name.

Layout: {"<kernel>": {"<M bucket>": {"BLOCK_M": .., "BLOCK_N": .., "BLOCK_K": .., "GROUP_M": ..,
"num_warps": .., "num_stages": ..}}}, M bucket = next power of two of M (clamped to the largest key);
optional shape overrides "<M bucket>:N<N>:K<K>" (see lookup).
$QKERNELS_CONFIG_DIR/<gpu slug>.json, where that file exists, takes the place of the shipped one (a table tuned
on the user's machine, or one under test: scripts/table_ab.py).
A GPU without a table is autotuned on first use (qkernels.autotune) among `candidates`: the bucket's
configs from every shipped table and the built-in default below.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from .._runtime import next_pow2

_DIR = Path(__file__).parent

# fallbacks, by M bucket (int8 / fp8 / int4 GEMM)
DEFAULT_GEMM = {
    "16": dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=8, num_warps=4, num_stages=4),
    "64": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=4),
    "256": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3),
    "65536": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3),
}
# weight-only (W4A16 / W8A16): per M bucket a path ("gemv", "mm" or "dequant": dequantize, then
# cuBLAS) and its kernel parameters. The M thresholds between paths are these bucket keys.
DEFAULT_WEIGHT_ONLY = {
    "1": dict(path="gemv", BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=4),
    "16": dict(path="mm", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_N=8, num_warps=4, num_stages=4),
    "64": dict(path="mm", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_N=8, num_warps=4, num_stages=4),
    "256": dict(path="mm", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_N=8, num_warps=8, num_stages=3),
    "65536": dict(path="dequant", BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=1),
}
# decode attention (ops/attention.py), per batch bucket: BLOCK_S keys per tile, warps, the pipeline's stages,
# WAVES: a full cache's grid holds about WAVES programs per SM (splits of each sequence's keys), and PREFETCH: the
# first key tile read before the PDL wait where the caller allows it (decode_attention's prefetch)
DEFAULT_DECODE_ATTENTION = {"1": dict(BLOCK_S=64, num_warps=4, num_stages=2, WAVES=2, PREFETCH=False)}
# the interpreter: 16-key tiles, two splits whatever WAVES (ops.attention._splits), the prefetch path taken
INTERPRETER_DECODE_ATTENTION = {"1": dict(BLOCK_S=16, num_warps=4, num_stages=1, WAVES=1, PREFETCH=True)}
# The Triton interpreter (CPU): its cost is per program, so the tables' tiles are 64 output columns wide (a W8A8
# 256 x 128 linear at M = 1: 1.5 s with 8-column tiles, 0.14 s; tests/nn/test_hf.py 164 -> 38 s). Shapes with N > 64
# still run several column tiles and odd N a masked tail; small K steps and SPLIT_K 2 keep the loops and the split-K
# fix-up running.
INTERPRETER_WEIGHT_ONLY = {
    "1": dict(path="gemv", BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=1),
    "64": dict(path="mm", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_N=4, num_warps=4, num_stages=1),
    "65536": dict(path="dequant", BLOCK_N=16, BLOCK_K=64, num_warps=4, num_stages=1),
}
# the tile kernel, K split in two whenever it spans two steps (so the CPU suite runs the split-K fix-up everywhere)
_INTERPRETER_MMA = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1, SPLIT_K=2,
                        MIN_PROGRAMS=1 << 30)
# M = 1: the int8 / fp8 GEMV, K split whenever it spans two steps (int4 runs its fallback)
INTERPRETER_GEMM = {"1": dict(path="gemv", BLOCK_N=64, BLOCK_K=64, num_warps=4, SPLIT_K=2, MIN_PROGRAMS=1 << 30,
                              fallback=_INTERPRETER_MMA),
                    "65536": _INTERPRETER_MMA}
# W8A8 with dynamic per-token activations ("w8a8" / "w8a8-fp8" kinds): "gemv", the 8-bit GEMV quantizing x itself
# (one launch, the gemv parameters as above); "quantize", the quantize kernel then the int8 / fp8 GEMM's own table
INTERPRETER_W8A8 = {"1": dict(path="gemv", BLOCK_N=64, BLOCK_K=64, num_warps=2, SPLIT_K=2, MIN_PROGRAMS=1 << 30),
                    "65536": dict(path="quantize")}


def table_path(slug: str) -> Path:
    """The table this process uses for GPU `slug`: $QKERNELS_CONFIG_DIR/<slug>.json if that file exists, else the
    shipped configs/<slug>.json (which may not exist)."""
    user = os.environ.get("QKERNELS_CONFIG_DIR")
    if user and (Path(user) / f"{slug}.json").is_file():
        return Path(user) / f"{slug}.json"
    return _DIR / f"{slug}.json"


@functools.cache
def load(slug: str) -> dict:
    path = table_path(slug)
    return json.loads(path.read_text()) if path.exists() else {}


def table_digest(slug: str) -> str | None:
    """A short digest of configs/<slug>.json's content (key order and layout aside), None without that file: results
    files record the table their run used, so a report can point out rows measured before the table changed."""
    table = load(slug)
    return _digest(table) if table else None


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def kind_digests(slug: str) -> dict[str, str]:
    """A digest per kind of configs/<slug>.json ("w4a16", "int8", ...; {} without that file), per kind and M
    bucket ("w4a16@16": the bucket's config and its shape overrides), and per entry (entry_name: the bucket's own
    config, each shape override): a results row judged against the kinds its provider runs (bench.report) is not
    called stale when another kind changed, nor, where it has one M, when another bucket of its kinds did, nor,
    where it has one shape too, when another entry of its bucket did."""
    out = {}
    for kind, tab in (load(slug) or {}).items():
        out[kind] = _digest(tab)
        for b in sorted({k.split(":")[0] for k in tab}):
            out[f"{kind}@{b}"] = _digest({k: v for k, v in tab.items() if k.split(":")[0] == b})
        for k, v in tab.items():
            out[f"{kind}@{entry_name(k)}"] = _digest(v)
    return out


def entry_name(key: str) -> str:
    """An entry's name among kind_digests' per-entry digests: a shape override's own key ("16:N4096:K4096"), a
    bucket's config "<bucket>:*" (its plain key names the bucket with its overrides)."""
    return key if ":" in key else f"{key}:*"


def lookup_key(table: dict, M: int, N: int, K: int) -> str:
    """The key of the entry lookup(table, M, N, K) returns (table: a kind's entries, or only their keys)."""
    key = bucket_key(table, M)
    return f"{key}:N{N}:K{K}" if f"{key}:N{N}:K{K}" in table else key


def shipped() -> list[str]:
    """Slugs of the GPUs with a config table in this package."""
    return sorted(p.stem for p in _DIR.glob("*.json"))


def candidates(kind: str, m_bucket: int, default: dict) -> list[dict]:
    """Autotuning candidates for a GPU without a table: the built-in default's config for this bucket
    first, then every shipped table's, without repeats."""
    out, seen = [], set()
    for table in [default] + [load(slug).get(kind) or {} for slug in shipped()]:
        if table:
            cfg = pick(table, m_bucket)
            tag = json.dumps(cfg, sort_keys=True)
            if tag not in seen:
                seen.add(tag)
                out.append(cfg)
    return out


def bucket_key(table: dict, M: int) -> str:
    """The smallest bucket >= next_pow2(M), else the largest bucket (keys that are not plain numbers are
    shape overrides, see lookup)."""
    m = next_pow2(max(M, 1))
    keys = sorted((k for k in table if k.isdigit()), key=int)
    for k in keys:
        if m <= int(k):
            return k
    return keys[-1]


def pick(table: dict, M: int) -> dict:
    """Config of M's bucket (bucket_key)."""
    return table[bucket_key(table, M)]


def lookup(table: dict, M: int, N: int, K: int) -> dict:
    """Config for an [M, K] x [K, N] product: the shape override "<bucket>:N<N>:K<K>" where the tuner found
    one clearly better for that shape than the bucket's config, else the bucket's config."""
    return table[lookup_key(table, M, N, K)]


# ---------------------------------------------------------------------------------------------
# shape overrides, as the tuning scripts (scripts/tune_gemm.py, scripts/tune_weight_only.py) write them

OVERRIDE_GAIN = 0.95   # a shape gets its own config when another is this much faster there than the bucket's
# (one-call graph timings vary 2-3% run to run, so 5% is past the noise)
CHAIN_OVERRIDE_GAIN = 0.98     # the same for decode-chain timings (the tuners' --chain), which repeat within ~0.3%:
# configs that launch the same kernel, timed as separate candidates (measured on the H100, W8A16 M = 1)


def set_shape_overrides(tab: dict, kind: str, bucket, shapes: list, results: list, chosen: dict,
                        gain: float = OVERRIDE_GAIN) -> None:
    """results: [(time per shape, in `shapes` order), config)] of one bucket's sweep, `chosen` the bucket's
    config among them. Writes "<bucket>:N<N>:K<K>" where another config is clearly faster on that shape (its time
    under `gain` times the bucket config's), and drops stale overrides."""
    base = next(r[0] for r in results if r[1] == chosen)
    for i, (N, K) in enumerate(shapes):
        times, cfg = min(results, key=lambda r: r[0][i])
        key = f"{bucket}:N{N}:K{K}"
        if times[i] < gain * base[i]:
            tab[key] = cfg
            print(f"==> {kind} {key}: {cfg} ({times[i]:.2f} vs {base[i]:.2f} us)", flush=True)
        else:
            tab.pop(key, None)


def overrides_from_runs(table: dict, runs: dict, shapes: list, source: str, gain: float = OVERRIDE_GAIN) -> None:
    """runs: {(kind, bucket): [(time per shape, config)]} parsed from an earlier sweep's log: shape overrides
    against the table's current bucket configs (skipped where the log did not time that config); gain as in
    set_shape_overrides (CHAIN_OVERRIDE_GAIN for a --chain sweep's log)."""
    for (kind, bucket), results in sorted(runs.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        chosen = (table.get(kind) or {}).get(str(bucket))
        if chosen is not None:     # logs print configs without the fallback the table attaches to Gluon ones
            chosen = {k: v for k, v in chosen.items() if k != "fallback"}
        if chosen is None or not any(r[1] == chosen for r in results):
            print(f"{kind} M<={bucket}: the table's config is not in {source}; no overrides", flush=True)
            continue
        set_shape_overrides(table[kind], kind, bucket, shapes, results, chosen, gain)

"""Autotuning fallback for GPUs without a shipped config table (configs/<gpu>.json).

On such a GPU the first call for a (kernel, M bucket, shape) key times a few candidate configs on the
caller's own tensors and keeps the fastest, in memory and in a JSON cache file per GPU
($QKERNELS_CACHE_DIR, default ~/.cache/qkernels/autotune-<gpu>.json), so later calls and later processes
do not tune again. The candidates are the bucket's configs from every shipped table plus the built-in
default (configs.candidates): configs known to be good on some GPU, a handful, so the first call stays
cheap. scripts/tune_gemm.py and scripts/tune_weight_only.py do the wide sweep that ships a new table.

No tuning while a CUDA graph is being captured or torch.compile traces (timing is impossible there): the
first candidate (the built-in default) is used, and not cached. QKERNELS_AUTOTUNE=0 turns tuning off.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Callable

import torch

from ._runtime import unreplayable

log = logging.getLogger("qkernels")

_LOCK = threading.Lock()
_CACHES: dict[str, dict] = {}     # gpu slug -> {key string: config}


def enabled() -> bool:
    return os.environ.get("QKERNELS_AUTOTUNE", "1") != "0"


def cache_path(slug: str) -> Path:
    from ._runtime import cache_dir
    return cache_dir() / f"autotune-{slug}.json"


def _cache(slug: str) -> dict:
    cache = _CACHES.get(slug)
    if cache is None:
        path = cache_path(slug)
        try:
            cache = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError) as e:       # unreadable cache: tune again, overwrite it later
            log.warning("qkernels: ignoring autotune cache %s (%s)", path, e)
            cache = {}
        _CACHES[slug] = cache
    return cache


def _save(slug: str, cache: dict) -> None:
    """Write the cache, merged into what the file holds now (another process may have tuned other shapes since
    this one read it) under an inter-process lock, replacing the file in one step (qkernels._files)."""
    from ._files import locked, write_text_atomically
    path = cache_path(slug)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):            # no other process between this read and the write
            try:
                on_disk = json.loads(path.read_text()) if path.exists() else {}
            except (OSError, ValueError):
                on_disk = {}
            merged = {**on_disk, **cache} if isinstance(on_disk, dict) else dict(cache)
            write_text_atomically(path, json.dumps(merged, indent=1, sort_keys=True) + "\n")
    except OSError as e:                          # read-only home: keep the in-memory result only
        log.warning("qkernels: could not write autotune cache %s (%s)", path, e)


def _bench_ms(fn: Callable[[], object]) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=5, rep=20))


def tuned(slug: str, key: str, candidates: list[dict], run: Callable[[dict], object],
          bench: Callable[[Callable[[], object]], float] | None = None) -> dict:
    """The cached config for `key` on GPU `slug`, or the fastest of `candidates` timed with `run(config)`
    (a launch on the caller's tensors; it must not modify inputs). Candidates that fail to compile or
    launch (shared memory, registers) are skipped; if all fail, the first one is returned and the error
    of the first failure propagates when the caller launches it."""
    cache = _cache(slug)
    cfg = cache.get(key)
    if cfg is not None:
        return cfg
    if not enabled() or len(candidates) == 1 or torch.compiler.is_compiling() or (
            torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        return candidates[0]
    bench = bench or _bench_ms
    unreplayable()          # an eager plan (ops/_eager.py) records a later call, not this one's timing launches
    with _LOCK:
        cfg = cache.get(key)
        if cfg is not None:
            return cfg
        timings = []
        for c in candidates:
            try:
                run(c)                        # compile outside the timed region
                timings.append((bench(lambda c=c: run(c)), c))
            except Exception as e:            # noqa: BLE001 - a candidate this GPU cannot run
                log.info("qkernels autotune %s: %s skipped (%s: %s)", key, c, type(e).__name__, str(e)[:120])
        if not timings:
            return candidates[0]
        ms, cfg = min(timings, key=lambda t: t[0])
        log.info("qkernels autotune %s on %s: %s (%.1f us; %d candidates)", key, slug, cfg, ms * 1e3,
                 len(candidates))
        cache[key] = cfg
        _save(slug, cache)
    return cfg

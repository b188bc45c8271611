"""Benchmark harness: timing, ceilings, result rows, JSON, tables and plots.

Timing on a GPU is `triton.testing.do_bench` (median, L2 flushed between calls). `mode="graph"`
captures the call once in a CUDA graph and times its replays the same way, which removes the host
launch cost; `mode="eager"` times the plain Python call, host overhead included. On a machine
without a GPU the kernels run in the Triton interpreter and the times are host wall-clock medians:
they say nothing about GPU speed and are labelled so.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import configs
from .._files import write_text_atomically
from .._runtime import device_name, gpu_slug, is_interpreter


@dataclass
class Row:
    op: str
    provider: str
    median_us: float
    mode: str = "eager"                      # "eager" (host call timed) or "graph" (CUDA-graph replay)
    sizes: dict = field(default_factory=dict)  # M/N/K or numel: whatever applies
    extra: dict = field(default_factory=dict)  # gbps, pct_copy_bw, tflops, speedup, ...

    def flat(self) -> dict:
        d = {"op": self.op, "provider": self.provider, "mode": self.mode}
        d.update(self.sizes)
        d["median_us"] = round(self.median_us, 3)
        d.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.extra.items()})
        return d


def method_text(doc: str, gpu: bool, what: str) -> str:
    """A results file's "method": the "Method:" part of the benchmark module's docstring on a GPU; on the CPU,
    that the run (of `what`) went through the interpreter."""
    return doc.split("Method:")[1].strip() if gpu else \
        f"Triton interpreter on the CPU, {what}: host wall-clock, not GPU performance"


def on_gpu() -> bool:
    return torch.cuda.is_available() and not is_interpreter()


def time_us(fn: Callable[[], object], *, mode: str = "eager", rep_ms: int = 200, warmup_ms: int = 50,
            calls: int = 1) -> float:
    """Median time of one call of `fn` in microseconds. mode="graph" with calls > 1 captures that many
    back-to-back calls in one graph and returns the time per call: what a call costs inside a
    model's decode graph, without the replay's own launch cost."""
    if not on_gpu():
        fn()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6
    import triton.testing
    if mode == "graph":
        fn()  # compile / autotune outside the capture
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()   # warm-up on a side stream, as graph capture wants
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3 / calls
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def host_us(fn: Callable[[], object], batch: int = 100, batches: int = 20) -> float:
    """Host cost of one call: median over batches of the wall time per call of `batch` back-to-back
    calls that are not waited for (few enough that the launch queue never fills)."""
    return host_us_interleaved({"call": fn}, batch, batches)["call"]


def host_us_interleaved(fns: dict[str, Callable[[], object]], batch: int = 100, batches: int = 20) -> dict[str, float]:
    """Host cost of each of several calls (as host_us: the wall time per call of `batch` back-to-back calls that
    are not waited for, median over `batches`), measured in turns: each round times one batch of every call, in an
    order that rotates from round to round, so a drift of the host's speed during the run (clocks, another process,
    the first seconds after start) falls on all of them alike. Each is called once first."""
    names = list(fns)
    for name in names:
        fns[name]()
    per_call: dict[str, list[float]] = {name: [] for name in names}
    for r in range(batches):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            fn = fns[name]
            if on_gpu():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            per_call[name].append((time.perf_counter() - t0) / batch)
    if on_gpu():
        torch.cuda.synchronize()
    return {name: statistics.median(v) * 1e6 for name, v in per_call.items()}


def copy_bandwidth_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written, measured now (the ceiling for
    memory-bound kernels)."""
    n = nbytes // 4 if on_gpu() else 1 << 20
    a = torch.empty(n, dtype=torch.float32, device=device).normal_()
    b = torch.empty_like(a)
    us = time_us(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (us * 1e-6) / 1e9


def environment() -> dict:
    import triton
    dev = torch.device("cuda") if on_gpu() else torch.device("cpu")
    table = configs.table_digest(gpu_slug(device_name(dev))) if on_gpu() else None
    return {
        "gpu": device_name(dev) if on_gpu() else ("cpu (Triton interpreter)" if is_interpreter() else "cpu"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "interpreter": is_interpreter(),
        # the shipped config table the kernels ran with (configs.table_digest; None on the CPU), and per table
        # digest the digests of its kinds (configs.kind_digests: a report judges a row by the kinds it runs)
        "config_table": table,
        "config_tables": {table: configs.kind_digests(gpu_slug(device_name(dev)))} if table else {},
    }


def results_dir(root: str | os.PathLike) -> Path:
    env = environment()
    slug = gpu_slug(env["gpu"]) if on_gpu() else "cpu-interpreter"
    return Path(root) / slug


def results_doc(rows: list[Row], meta: dict | None = None) -> dict:
    """A results file's document: this run's environment (GPU, versions, date), `meta`, and the rows."""
    doc = environment()
    if meta:
        doc.update(meta)
    doc["rows"] = [r.flat() for r in rows]
    return doc


def write_json(name: str, rows: list[Row] | dict, root: str | os.PathLike, meta: dict | None = None) -> Path:
    """results/<gpu>/<name>.json from rows (and meta), or a whole document (results_doc), written atomically."""
    out = results_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    doc = rows if isinstance(rows, dict) else results_doc(rows, meta)
    path = out / f"{name}.json"
    write_text_atomically(path, json.dumps(doc, indent=1) + "\n")
    return path


RUN_KEYS = ("date", "torch", "triton", "config_table")      # stamped on every merged row: the run it comes from


def merge_results(old: dict | None, new: dict, replaced: Callable[[dict], bool]) -> dict:
    """The results document `new` (this run's rows) merged into `old` (the GPU's earlier document, or None): old
    rows kept unless `replaced(row)` (this run measured them again), every row stamped with its run's date and
    versions (RUN_KEYS) unless it already carries them, and the kind digests of each config table a kept row ran
    with kept (config_tables). An old document from another GPU is not merged."""
    stamp = lambda rows, doc: [{**{k: doc.get(k) for k in RUN_KEYS}, **r} for r in rows]  # noqa: E731
    out = dict(new, rows=stamp(new["rows"], new))
    if not old or old.get("gpu") != new.get("gpu"):
        return out
    out["rows"] = [r for r in stamp(old.get("rows", []), old) if not replaced(r)] + out["rows"]
    used = {r.get("config_table") for r in out["rows"]}
    tables = {**(old.get("config_tables") or {}), **(new.get("config_tables") or {})}
    out["config_tables"] = {t: kinds for t, kinds in tables.items() if t in used}
    return out


def read_results(name: str, root: str | os.PathLike) -> dict | None:
    """This GPU's earlier results/<gpu>/<name>.json, or None."""
    path = results_dir(root) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def format_table(rows: list[Row], columns: list[str]) -> str:
    flat = [r.flat() for r in rows]
    widths = {c: max(len(c), *(len(_fmt(d.get(c, ""))) for d in flat)) for c in columns}
    lines = ["  ".join(c.rjust(widths[c]) for c in columns)]
    for d in flat:
        lines.append("  ".join(_fmt(d.get(c, "")).rjust(widths[c]) for c in columns))
    return "\n".join(lines)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def pyplot():
    """matplotlib.pyplot with the file-only backend, or None (with a message) when not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'qkernels[bench]'): no plot")
        return None
    return plt


def save_png(fig, json_path: str | os.PathLike, title: str, dpi: int = 110) -> Path:
    """Title, lay out and write `fig` as the PNG next to the results JSON; returns its path."""
    import matplotlib.pyplot as plt
    fig.suptitle(title)
    fig.tight_layout()
    png = Path(json_path).with_suffix(".png")
    fig.savefig(png, dpi=dpi)
    plt.close(fig)
    return png


def plot(json_path: str | os.PathLike, x: str, y: str, group: tuple[str, ...] = ("provider", "mode"),
         facet: str | None = None, logx: bool = True) -> Path | None:
    """PNG next to the JSON: `y` against `x`, one line per `group`, one panel per `facet` value."""
    plt = pyplot()
    if plt is None:
        return None
    doc = json.loads(Path(json_path).read_text())
    rows = [r for r in doc["rows"] if x in r and y in r]
    if not rows:
        return None
    facets = sorted({str(r.get(facet)) for r in rows}) if facet else ["all"]
    fig, axes = plt.subplots(1, len(facets), figsize=(5 * len(facets), 4), squeeze=False)
    for ax, fv in zip(axes[0], facets):
        sub = [r for r in rows if not facet or str(r.get(facet)) == fv]
        for key in sorted({tuple(r.get(g) for g in group) for r in sub}, key=str):
            pts = sorted((r[x], r[y]) for r in sub if tuple(r.get(g) for g in group) == key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=" ".join(map(str, key)))
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(f"{facet}={fv}" if facet else doc.get("gpu", ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_png(fig, json_path, f"{Path(json_path).stem} on {doc.get('gpu')}", dpi=110)

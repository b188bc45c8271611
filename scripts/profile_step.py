"""The runtime's decode step per kernel, at any batch: GPU time per kernel name over 20 replays of the captured step
(bench.runtime.profile_step), per scheme, beside the step's median time. Random weights of the real config.

  python3 scripts/profile_step.py --model qwen3-1.7b [llama3-8b] --batch 16 [64] --schemes fp16,w4a16 [--top 16]
      [--json PATH] [--prefill 2048 [262] [--no-graphs]]

--prefill T: a T-token prompt's forward instead (batch 1, as bench runtime's TTFT rows time it: its CUDA graph
captured in the warm-up; --no-graphs: every launch from the host, as bench runtime's ttft_eager_ms): its median
time beside the sum of its kernels' GPU time; where the sum is well short of the time, the host (Python, launches)
sets the pace, not the kernels.

The kernels that differ between two schemes' steps are where one loses to the other. Spans of kernels that start
early under programmatic dependent launch include their wait for the kernel before (bench/runtime.py's method): with
QKERNELS_PDL=0 each span is the kernel's own. "us of the step" is what each kernel class added to the step's end
past the kernels before it (bench.runtime.critical_us): these add up to the step's GPU time with PDL on too. Without a GPU: the bench's tiny model under the interpreter, eagerly,
step times only (a check of the script, not a timing).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from qkernels.bench.model import _median_ms, hf_model, model_configs  # noqa: E402
from qkernels.bench.runtime import CTX, profile_step, runtime_decode  # noqa: E402
from qkernels.models import from_pretrained  # noqa: E402
from qkernels.models.graphs import eager  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["qwen3-1.7b"])
    ap.add_argument("--batch", type=int, nargs="+", default=[16])
    ap.add_argument("--schemes", default="fp16,w4a16")
    ap.add_argument("--top", type=int, default=16, help="kernels listed per step; 0: the step time only")
    ap.add_argument("--json", default=None, help="write {model, batch, scheme: {step_us, kernels}} here")
    ap.add_argument("--prefill", type=int, nargs="+", default=None, metavar="T",
                    help="profile T-token prompts' forward (batch 1) instead of the decode step")
    ap.add_argument("--no-graphs", action="store_true",
                    help="--prefill: the prompt's forward without its CUDA graph (models.graphs.eager)")
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    dev = torch.device("cuda" if gpu else "cpu")
    out = {}
    for name in args.model:
        _model(name, args, dev, out, gpu)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def _model(name: str, args, dev, out: dict, gpu: bool) -> None:
    cfg = model_configs(tiny=False)[name] if gpu else next(iter(model_configs(tiny=True).values()))
    with torch.device(dev):
        hf = hf_model(cfg, torch.float16)
    for scheme in args.schemes.split(","):
        m = from_pretrained(hf, None if scheme == "fp16" else scheme, device=dev, dtype=torch.float16)
        for t in args.prefill or ():
            _prefill(m, name, scheme, t, args, dev, out, gpu)
        for b in () if args.prefill else args.batch:
            ms, step = runtime_decode(m, b, CTX if gpu else 8, gpu)
            tok = torch.zeros(b, dtype=torch.long, device=dev)
            pos = torch.full((b,), CTX if gpu else 8, device=dev)
            rows = profile_step(functools.partial(step, tok, pos), top=args.top) if args.top and gpu else []
            out[f"{name} b={b} {scheme}"] = {"step_us": ms * 1e3, "kernels": rows}
            print(f"== {name} batch {b} {scheme}: {ms * 1e3:.0f} us/step, {b / ms * 1e3:.0f} tok/s")
            for r in rows:
                print(f"  {r['us_per_step']:8.1f} us  x{r['calls_per_step']:5.1f}  "
                      f"{r['critical_us_per_step']:8.1f} us of the step  {r['kernel']}")
            del step
        del m
        gc.collect()
        torch.cuda.empty_cache()
    del hf
    gc.collect()
    torch.cuda.empty_cache()


def _prefill(m, name: str, scheme: str, t: int, args, dev, out: dict, gpu: bool) -> None:
    """One t-token prompt's forward into the cache (logits of its last position): median ms, and its kernels."""
    m.setup_caches(1, t + 64)
    ids = torch.randint(0, m.args.vocab_size, (1, t), device=dev)
    at = torch.full((1,), t - 1, device=dev)

    @torch.inference_mode()
    def forward():
        with eager() if args.no_graphs else contextlib.nullcontext():
            m(ids, 0, logits_at=at)
    ms = _median_ms(forward, dev, 10 if gpu else 1)
    rows = profile_step(forward, top=10 ** 6) if args.top and gpu else []
    gpu_us = sum(r["us_per_step"] for r in rows)
    out[f"{name} prefill {t} {scheme}"] = {"us": ms * 1e3, "kernels_us": gpu_us, "kernels": rows[:args.top]}
    print(f"== {name} prefill {t} tokens {scheme}: {ms * 1e3:.0f} us"
          + (f", its kernels' GPU time {gpu_us:.0f} us ({100 * gpu_us / (ms * 1e3):.0f}%)" if rows else ""))
    for r in rows[:args.top]:
        print(f"  {r['us_per_step']:8.1f} us  x{r['calls_per_step']:5.1f}  {r['kernel']}")


if __name__ == "__main__":
    main()

"""The one-shot all-reduce (ops/collective.py) against NCCL's over message sizes, on the GPUs of one host: where the
runtime's one-shot cap (models.parallel.ONE_SHOT_BYTES, 16 MB; QKERNELS_TP_ONESHOT_BYTES) should lie, and whether
the LL protocol (QKERNELS_TP_ALLREDUCE=ll) beats the flag protocol at decode sizes (up to LL_MAX_KB).

  torchrun --nproc-per-node 2 scripts/bench_allreduce.py [--kb 8 64 512 4096 16384] [--dtype float16] [--json PATH]

Each size: every rank's x (random, its own), both paths' sums checked equal (two ranks: one rounding of the same
sum), then each path's calls captured 20 to a CUDA graph and the graph replayed 10 times between CUDA events after a
warm-up replay, every rank in lockstep (a barrier before): µs per call on rank 0, the ranks' waits for each other
included, as the decode step sees them. The one-shot buffers are sized for the largest message. Needs CUDA GPUs
with peer access (PyTorch's symmetric memory) and NCCL; elsewhere it says so and exits 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

CALLS, REPLAYS = 20, 10
LL_MAX_KB = 1024            # the LL protocol's messages: decode sizes (its words carry 4x an fp16 message's bytes)


def _time_us(fn, dist) -> float:
    """µs per call of fn (one all-reduce) from CALLS calls captured in a CUDA graph, replayed REPLAYS times."""
    fn()                                    # the communicator / kernels set up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPLAYS):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / (CALLS * REPLAYS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kb", type=int, nargs="+", default=[8, 32, 64, 256, 1024, 4096, 16384])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--json", default=None, help="rank 0 writes {gpu, torch, triton, date, rows} here "
                    "(benchmarks/results/<gpu>/allreduce.json)")
    args = ap.parse_args()
    if not torch.cuda.is_available() or "WORLD_SIZE" not in os.environ:
        print("bench_allreduce: needs CUDA GPUs and torchrun (torchrun --nproc-per-node 2 scripts/bench_allreduce.py):"
              f" CUDA {'available' if torch.cuda.is_available() else 'not available'}, WORLD_SIZE "
              f"{os.environ.get('WORLD_SIZE', 'unset')}", file=sys.stderr)
        return 2
    if min(args.kb) < 1:
        ap.error(f"--kb: expected sizes of at least 1 KB, got {args.kb}")
    import torch.distributed as dist

    from qkernels.ops.collective import PeerBuffers, one_shot_all_reduce
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    dt = getattr(torch, args.dtype)
    peers = PeerBuffers.create(None, dev, capacity_bytes=max(args.kb) * 1024)
    ll_kb = min(max(args.kb), LL_MAX_KB)
    ll_peers = PeerBuffers.create(None, dev, capacity_bytes=ll_kb * 1024 * 8 // dt.itemsize, ll=True)
    rows = []
    for kb in args.kb:
        n = kb * 1024 // dt.itemsize
        gen = torch.Generator(device=dev).manual_seed(1000 + rank)
        x = torch.randn(n, device=dev, dtype=dt, generator=gen)
        y = x.clone()
        dist.all_reduce(y)
        same = torch.tensor([int(torch.equal(one_shot_all_reduce(x, peers), y)
                                 and (kb > ll_kb or torch.equal(one_shot_all_reduce(x, ll_peers), y)))], device=dev)
        dist.all_reduce(same, op=dist.ReduceOp.MIN)             # every rank stops together, none left waiting
        if not same.item() and dist.get_world_size() == 2:
            raise RuntimeError(f"{kb} KB: the one-shot sum differs from NCCL's on a rank")
        buf = x.clone()
        us = {"one-shot": _time_us(lambda: one_shot_all_reduce(x, peers), dist),
              "nccl": _time_us(lambda: dist.all_reduce(buf), dist)}
        if kb <= ll_kb:
            us["one-shot LL"] = _time_us(lambda: one_shot_all_reduce(x, ll_peers), dist)
        peers.check()
        ll_peers.check()
        for provider, t in us.items():
            rows.append({"op": "all_reduce", "provider": provider, "bytes": kb * 1024, "dtype": args.dtype,
                         "world": dist.get_world_size(), "median_us": t})
        if rank == 0:
            print(f"{kb:7d} KB: one-shot {us['one-shot']:8.1f} us, NCCL {us['nccl']:8.1f} us "
                  f"({us['nccl'] / us['one-shot']:.2f}x)"
                  + (f", LL {us['one-shot LL']:8.1f} us" if "one-shot LL" in us else ""), flush=True)
    if rank == 0 and args.json:
        from qkernels.bench.harness import environment
        with open(args.json, "w") as f:
            json.dump(dict(environment(), rows=rows), f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

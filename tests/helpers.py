"""Test helpers: bit-exact comparison with a readable report of the worst elements; scripts run as a user runs
them."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/<name> with args in a fresh process on the CPU (this checkout's src, the Triton interpreter, no GPU
    visible): what a script's CPU test checks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          env=env, timeout=900)


def as_bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point and t.dtype.itemsize == 1:
        return t.view(torch.uint8)
    return t


def assert_bit_exact(got: torch.Tensor, want: torch.Tensor, name: str = "tensor") -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    g, w = got.cpu(), want.cpu()
    if g.dtype.is_floating_point:
        g, w = g.float(), w.float()
        same = (g == w) | (torch.isnan(g) & torch.isnan(w))
    else:
        same = g == w
    if not bool(same.all()):
        bad = (~same).nonzero()
        shown = ", ".join(f"{tuple(i.tolist())}: got {g[tuple(i)].item()} want {w[tuple(i)].item()}" for i in bad[:8])
        raise AssertionError(f"{name}: {bad.shape[0]} of {same.numel()} elements differ; first: {shown}")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def graph_replay(fn):
    """Capture fn() in a CUDA graph (after a warm-up on a side stream, as capture wants), replay it
    once and return the output written by the replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    return out


def shipped_table_entries(kinds: tuple, device) -> list:
    """(kind, key, config) of every entry of `kinds` in the shipped config table of `device`'s GPU (none off a GPU
    or without a table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return []
    from qkernels import configs
    from qkernels._runtime import device_name, gpu_slug
    table = configs.load(gpu_slug(device_name(device)))
    return [(kind, key, cfg) for kind in kinds for key, cfg in (table.get(kind) or {}).items()]


def table_entry_case(key: str) -> tuple[int, int, int]:
    """(M, N, K) a table entry is run at: its bucket's M (the largest M of the bucket below plus one) on the shape
    it was tuned for (a shape override's N x K; 4096 x 4096 for a bucket)."""
    bucket, *shape = key.split(":")
    N, K = (int(shape[0][1:]), int(shape[1][1:])) if shape else (4096, 4096)
    return max(1, int(bucket) // 2 + 1), N, K


def spawn_workers(worker, world: int, args: tuple, timeout_s: float, what: str) -> None:
    """worker(rank, port, *args) in `world` spawned processes (port: a free one for their process group); fails
    the test if they have not all ended in timeout_s (a collective that hangs), killing what is left."""
    import pytest
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(worker, args=(port, *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):    # True once every worker has ended
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not finish in {timeout_s:.0f} s (a collective hung?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()

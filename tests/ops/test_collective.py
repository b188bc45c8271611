"""ops/collective.py: the one-shot all-reduce against reference.all_reduce_sum, bit for bit.

Emulated in one process (every device, the interpreter too): rank 0's kernel of a two-rank group whose peer's
memory is local, the peer's half of the exchange (its slot and its signal) written beforehand. Then, where there
are two GPUs, the real thing: two processes over NCCL and symmetric memory, eager and inside a CUDA graph.
"""
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkernels import reference as ref
from qkernels._runtime import poison_outputs
from qkernels.ops.collective import BLOCK, PeerBuffers, deltas, one_shot_all_reduce

from ..conftest import DEVICE
from ..helpers import spawn_workers

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SIZES = (1, 7, BLOCK, 3 * BLOCK + 5)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _emulated(world: int, capacity: int, ll: bool = False):
    """rank 0's PeerBuffers of a group whose ranks' buffers all live here: (peers, data [world] of uint8 [2, world,
    capacity], flags [world] of int32 [world, max_programs]); ll: of the LL protocol."""
    max_programs = capacity // 2 // BLOCK
    data = [torch.zeros(2 * world * capacity, dtype=torch.uint8, device=DEVICE) for _ in range(world)]
    flags = [torch.zeros(world * max_programs, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    peers = PeerBuffers(0, world, data[0], flags[0], deltas(data[0], [t.data_ptr() for t in data], 0, 16),
                        deltas(flags[0], [t.data_ptr() for t in flags], 0, 4), capacity, (data, flags), ll=ll)
    return peers, data, flags


def _assert_same_bits(got: tuple, want: tuple, what: str) -> None:
    """The fused op's outputs (y or codes and scales, then h) bit for bit."""
    for a, b in zip(got, want):
        assert torch.equal(_bits(a) if a.dtype in DTYPES else a.view(torch.uint8), _bits(b) if b.dtype in DTYPES
                           else b.view(torch.uint8)), what


def _words(x: torch.Tensor, epoch: int) -> torch.Tensor:
    """x's elements as the LL protocol sends them: int64 words, the element's bits low, the epoch high."""
    bits = x.reshape(-1).view(torch.int16 if x.element_size() == 2 else torch.int32).to(torch.int64)
    return (bits & (0xFFFF if x.element_size() == 2 else 0xFFFFFFFF)) | (epoch << 32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_shot_all_reduce_emulated(dtype):
    world, capacity = 2, 4 * BLOCK * 4
    peers, data, flags = _emulated(world, capacity)
    g = torch.Generator(device="cpu").manual_seed(5)
    for call, n in enumerate(SIZES):
        epoch = call + 1                       # every program that runs this call was used once per call before
        progs = -(-n // BLOCK)
        x0, x1 = (torch.randn(n, generator=g).mul_(8).to(dtype).to(DEVICE) for _ in range(2))
        slot = capacity // x0.element_size()
        half = epoch % 2
        # rank 1's part of the exchange: its x in rank 0's slot [half, 1], its signal in rank 0's flag [1, p]
        data[0].view(dtype)[(half * world + 1) * slot:][:n] = x1
        flags[0][1 * peers.max_programs:][:progs] = epoch
        peers.epochs[:progs] = call                  # as if every program had run in every earlier call
        with poison_outputs():
            out = one_shot_all_reduce(x0, peers)
        assert torch.equal(_bits(out), _bits(ref.all_reduce_sum([x0, x1]))), f"n={n}"
        # rank 0's part: its x pushed into rank 1's slot [half, 0], its signal in rank 1's flag [0, p]
        assert torch.equal(data[1].view(dtype)[(half * world + 0) * slot:][:n], x0)
        assert flags[1][:progs].tolist() == [epoch] * progs
        assert peers.epochs[:progs].tolist() == [epoch] * progs


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_shot_all_reduce_ll_emulated(dtype):
    """The LL protocol (rank 0 of two, emulated): the same bits as the flag protocol's sum, rank 1's elements taken
    from its words of this epoch in rank 0's slot [half, 1], rank 0's pushed as words into rank 1's slot [half, 0]; no
    flag written; over calls whose epochs and halves advance."""
    world, capacity = 2, 4 * BLOCK * 8
    peers, data, flags = _emulated(world, capacity, ll=True)
    g = torch.Generator(device="cpu").manual_seed(6)
    for call, n in enumerate(SIZES):
        epoch, progs, half = call + 1, -(-n // BLOCK), (call + 1) % 2
        x0, x1 = (torch.randn(n, generator=g).mul_(8).to(dtype).to(DEVICE) for _ in range(2))
        slot = capacity // 8
        data[0].view(torch.int64)[(half * world + 1) * slot:][:n] = _words(x1, epoch)
        peers.epochs[:progs] = call
        with poison_outputs():
            out = one_shot_all_reduce(x0, peers)
        assert torch.equal(_bits(out), _bits(ref.all_reduce_sum([x0, x1]))), f"n={n}"
        assert torch.equal(data[1].view(torch.int64)[(half * world + 0) * slot:][:n], _words(x0, epoch))
        assert peers.epochs[:progs].tolist() == [epoch] * progs
    assert not any(f.any() for f in flags)


@pytest.mark.parametrize("quantize", [None, "int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_rms_norm_ll_emulated_equals_the_unfused_sequence(dtype, quantize):
    """The fused all-reduce + norm under the LL protocol: the unfused sequence's bits, as under the flag protocol."""
    from qkernels import rms_norm
    from qkernels.ops.collective import one_shot_all_reduce_rms_norm
    world, capacity = 2, 4 * BLOCK * 8
    peers, data, _ = _emulated(world, capacity, ll=True)
    g = torch.Generator(device="cpu").manual_seed(8)
    for call, (M, N) in enumerate([(1, 64), (3, 200), (4, 1024)]):
        epoch, half = call + 1, (call + 1) % 2
        x0, x1, res = (torch.randn(M, N, generator=g).mul_(4).to(dtype).to(DEVICE) for _ in range(3))
        w = (torch.rand(N, generator=g) + 0.5).to(dtype).to(DEVICE)
        data[0].view(torch.int64)[(half * world + 1) * (capacity // 8):][:M * N] = _words(x1, epoch)
        peers.epochs[:M] = call
        with poison_outputs():
            got = one_shot_all_reduce_rms_norm(x0, res, w, 1e-6, peers, quantize)
        want = rms_norm(ref.all_reduce_sum([x0, x1]), w, 1e-6, residual=res, quantize=quantize)
        _assert_same_bits(got, want, f"{M}x{N}")
        assert torch.equal(data[1].view(torch.int64)[(half * world + 0) * (capacity // 8):][:M * N], _words(x0, epoch))


@pytest.mark.parametrize("stale", [False, True], ids=["nothing", "an older epoch's words"])
def test_ll_waits_for_words_of_this_epoch_and_names_a_peer_that_never_sends_them(stale):
    """Under LL a rank takes only words of the call's epoch: with nothing from rank 1, or only its words of two calls
    back in the same half (epochs only grow), rank 0 waits its bounded time and names rank 1, as under flags."""
    world, capacity = 2, 4 * BLOCK * 8
    peers, data, _ = _emulated(world, capacity, ll=True)
    peers.timeout_s = 0.05
    x = torch.randn(64, device=DEVICE)
    peers.epochs[:1] = 2                                     # this call's epoch: 3, half 1
    if stale:
        data[0].view(torch.int64)[(1 * world + 1) * (capacity // 8):][:64] = _words(torch.randn(64), 1)
    one_shot_all_reduce(x, peers)
    assert peers.status.item() == 2
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 did not reach an all-reduce"):
        peers.check()


@pytest.mark.parametrize("quantize", [None, "int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_rms_norm_emulated_equals_the_unfused_sequence(dtype, quantize):
    """The fused all-reduce + residual add + RMSNorm (rank 0 of two, emulated): the bits of the one-shot all-reduce
    (reference.all_reduce_sum, which it equals bit for bit) followed by the rms_norm kernel with the residual, for
    rows of several widths, over repeated calls (the epochs and halves advance); the exchange as the one-shot's, per
    row; and the reference twin within one rounding."""
    from qkernels import rms_norm
    from qkernels.ops.collective import one_shot_all_reduce_rms_norm
    world, capacity = 2, 4 * BLOCK * 4
    peers, data, flags = _emulated(world, capacity)
    g = torch.Generator(device="cpu").manual_seed(7)
    for call, (M, N) in enumerate([(1, 64), (3, 200), (4, 1024), (2, 96)]):
        epoch = call + 1
        x0, x1, res = (torch.randn(M, N, generator=g).mul_(4).to(dtype).to(DEVICE) for _ in range(3))
        w = (torch.rand(N, generator=g) + 0.5).to(dtype).to(DEVICE)
        slot = capacity // x0.element_size()
        half = epoch % 2
        data[0].view(dtype)[(half * world + 1) * slot:][:M * N] = x1.reshape(-1)
        flags[0][1 * peers.max_programs:][:M] = epoch
        peers.epochs[:M] = call
        with poison_outputs():
            got = one_shot_all_reduce_rms_norm(x0, res, w, 1e-6, peers, quantize)
        want = rms_norm(ref.all_reduce_sum([x0, x1]), w, 1e-6, residual=res, quantize=quantize)
        _assert_same_bits(got, want, f"{M}x{N}")
        twin = ref.all_reduce_rms_norm([x0, x1], res, w, 1e-6, quantize, compute_dtype=torch.float64)
        assert torch.equal(got[-1], twin[-1])                                   # h: exact
        if quantize is None:
            torch.testing.assert_close(got[0], twin[0])                          # y: one rounding of x's dtype
        assert torch.equal(data[1].view(dtype)[(half * world + 0) * slot:][:M * N], x0.reshape(-1))
        assert flags[1][:M].tolist() == [epoch] * M and peers.epochs[:M].tolist() == [epoch] * M


@pytest.mark.parametrize("fused", [False, True], ids=["one-shot", "with the norm"])
def test_a_peer_that_never_arrives_ends_the_wait_and_is_named(fused):
    """Rank 1 of two never signals (its process died): rank 0's kernel waits its bounded time, writes the rank to the
    status word and returns instead of spinning forever; check() raises naming rank 1, and keeps raising."""
    from qkernels.ops.collective import one_shot_all_reduce_rms_norm
    world, capacity = 2, 4 * BLOCK * 4
    peers, data, flags = _emulated(world, capacity)
    peers.timeout_s = 0.05
    x = torch.randn(3, 64, device=DEVICE)
    peers.check()                                             # nothing to report yet
    if fused:
        one_shot_all_reduce_rms_norm(x, torch.zeros_like(x), None, 1e-6, peers)
    else:
        one_shot_all_reduce(x, peers)
    assert peers.status.item() == 2
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"rank 1 of 2 did not reach an all-reduce within 0.05 s \(rank 0"):
            peers.check()
    assert flags[1][:3 if fused else 1].tolist() == [1] * (3 if fused else 1)   # rank 0 signalled all the same


def test_all_reduce_rms_norm_refuses_what_does_not_fit():
    from qkernels.ops.collective import ROW_MAX, one_shot_all_reduce_rms_norm
    peers, _, _ = _emulated(2, 4 * BLOCK * 4)
    rows = torch.zeros(peers.max_programs + 1, 8, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"at most 8 rows of at most 16384"):
        one_shot_all_reduce_rms_norm(rows, rows, None, 1e-6, peers)
    wide = torch.zeros(1, ROW_MAX + 2, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="must be on"):
        one_shot_all_reduce_rms_norm(wide, wide, None, 1e-6, peers)
    x = torch.zeros(2, 8, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match=r"residual must have x's shape \(2, 8\)"):
        one_shot_all_reduce_rms_norm(x, x[:1], None, 1e-6, peers)
    with pytest.raises(ValueError, match="quantize must be None, 'int8' or 'fp8_e4m3'"):
        one_shot_all_reduce_rms_norm(x, x, None, 1e-6, peers, "int4")


def test_one_shot_all_reduce_refuses_what_does_not_fit():
    peers, _, _ = _emulated(2, 4 * BLOCK * 4)
    with pytest.raises(ValueError, match="at most"):
        one_shot_all_reduce(torch.zeros(4 * BLOCK * 4, dtype=torch.float16, device=DEVICE), peers)
    with pytest.raises(TypeError, match="dtype"):
        one_shot_all_reduce(torch.zeros(8, dtype=torch.int32, device=DEVICE), peers)


# ---------------------------------------------------------------------------------------------
# two GPUs, two processes

WORLD = 2
TWO_GPUS = torch.cuda.device_count() >= WORLD


def _checks(rank: int) -> dict:
    dev = torch.device("cuda", rank)
    res = {}
    for ll in (False, True):                            # the flag protocol, then LL
        peers = PeerBuffers.create(None, dev, ll=ll)
        res.update({f"{'LL ' if ll else ''}{k}": v for k, v in _checks_of(peers, rank, dev).items()})
    return res


def _checks_of(peers, rank: int, dev) -> dict:
    import torch.distributed as dist
    res = {}
    g = torch.Generator(device="cpu").manual_seed(11 + rank)
    shapes = [(1,), (4096,), (8, 4096), (3 * BLOCK + 5,), (4, 8192)]        # up to the capacity, 16 programs
    for dtype in DTYPES:
        for shape in shapes:
            x = torch.randn(shape, generator=g).mul_(4).to(dtype).to(dev)
            if not peers.fits(x):                       # fp32 of the largest shapes
                continue
            parts = [torch.empty_like(x) for _ in range(WORLD)]
            dist.all_gather(parts, x)
            want = ref.all_reduce_sum(parts)
            for rep in range(3):                        # the epochs and halves advance
                with poison_outputs():
                    got = one_shot_all_reduce(x, peers)
                ok = torch.equal(_bits(got), _bits(want))
                res[f"eager {dtype} {shape} {rep}"] = "ok" if ok else f"max err {(got - want).abs().max().item()}"
    # inside a CUDA graph: 40 calls per replay, the inputs changed between replays
    x = torch.zeros(4096, dtype=torch.float16, device=dev)
    outs = []
    for _ in range(2):                                  # warm up (compile) outside the capture
        one_shot_all_reduce(x, peers)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(40):
            y = one_shot_all_reduce(y, peers) * 0.5
            outs.append(y)
    for rep in range(5):
        x.copy_(torch.randn(4096, generator=g).to(torch.float16).to(dev))
        parts = [torch.empty_like(x) for _ in range(WORLD)]
        dist.all_gather(parts, x)
        graph.replay()
        torch.cuda.synchronize(dev)
        y = parts
        ok = True
        for i in range(40):
            want = ref.all_reduce_sum(y) * 0.5
            ok &= torch.equal(_bits(outs[i]), _bits(want))
            y = [want] * WORLD
        res[f"graph replay {rep}"] = "ok" if ok else "differs"
    return res


def _worker(rank: int, port: int, tmp: str):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda", rank))
    try:
        try:
            res = _checks(rank)
        except Exception as e:          # noqa: BLE001  (reported to the test, which fails on it)
            res = {"error": f"{type(e).__name__}: {e}"}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(tmp, f"r{rank}.json"), "w") as f:
        json.dump(res, f)


@pytest.mark.skipif(not TWO_GPUS, reason=f"needs {WORLD} GPUs")
def test_one_shot_all_reduce_two_gpus(tmp_path):
    spawn_workers(_worker, WORLD, (str(tmp_path),), 300, "the all-reduce workers")
    for r in range(WORLD):
        res = json.load(open(tmp_path / f"r{r}.json"))
        bad = {k: v for k, v in res.items() if v != "ok"}
        assert res and not bad, f"rank {r}: {bad}"
        assert "LL graph replay 4" in res and "graph replay 4" in res, sorted(res)


def test_pdl_only_for_one_wave(monkeypatch):
    """Programmatic dependent launch for an all-reduce whose programs fit one wave (decode sizes); none for a
    prefill-sized one (thousands of programs) or off the GPU."""
    from qkernels.ops import collective
    monkeypatch.setattr(collective, "pdl_options", lambda device: {"launch_pdl": True, "PDL": True})
    monkeypatch.setattr(collective, "num_sms", lambda device: 132)
    gpu = torch.device("cuda", 0)
    assert collective._pdl_one_wave(16, gpu) == {"launch_pdl": True, "PDL": True}
    assert collective._pdl_one_wave(132, gpu) == {"launch_pdl": True, "PDL": True}
    assert collective._pdl_one_wave(4096, gpu) == {}
    assert collective._pdl_one_wave(1, torch.device("cpu")) == {}


def test_all_reduce_kernels_compile_for_hopper():
    """Both kernels, flag and LL protocols, with the GPU's timer, build offline for sm_90 (the interpreter neither
    type-checks loops nor runs the timer's inline asm)."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qkernels.kernels._allreduce import _one_shot_all_reduce_kernel as k1, _all_reduce_rms_norm_kernel as k2
common = dict(flags_ptr="*i32", data_deltas="*i64", flag_deltas="*i64", epoch_ptr="*i32", status_ptr="*i32",
              wait="i64")
for ll in (False, True):
    for dt in ("fp16", "bf16", "fp32"):
        data = "*i64" if ll else "*" + dt
        types = dict(common, x_ptr="*" + dt, out_ptr="*" + dt, data_ptr=data)
        cx = dict(RANK=0, WORLD=2, MAX_PROGRAMS=8, BLOCK=2048, TIMER=True, PDL=True, LL=ll)
        sig = {n: "constexpr" if n in cx else types.get(n, "i32") for n in k1.arg_names}
        triton.compile(ASTSource(k1, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        types = dict(common, x_ptr="*" + dt, r_ptr="*" + dt, w_ptr="*" + dt, y_ptr="*" + dt, rout_ptr="*" + dt,
                     s_ptr="*fp32", data_ptr=data, eps="fp32")
        cx = dict(RANK=1, WORLD=2, MAX_PROGRAMS=8, BLOCK_N=4096, HAS_W=True, QUANT=0, QMAX=127.0, IS_FP8=False,
                  FP8_EMULATE=False, TIMER=True, PDL=True, LL=ll)
        sig = {n: "constexpr" if n in cx else types.get(n, "i32") for n in k2.arg_names}
        triton.compile(ASTSource(k2, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        print(ll, dt, "built")
"""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    env.pop("TRITON_INTERPRET", None)       # a real compile
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.stdout.splitlines()) == 6, run.stdout

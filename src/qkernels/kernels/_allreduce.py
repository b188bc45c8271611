"""Private Triton kernel: a one-shot all-reduce (sum) between the GPUs of one host, over memory every rank maps
(PyTorch's symmetric memory: peer-to-peer over NVLink). Launcher: ops/collective.py. Numerics:
reference.all_reduce_sum.

At decode sizes an all-reduce moves a few KB: its cost is latency, and a ring (NCCL's) pays it in several hops
and a kernel that cannot start before the previous one ends. Here one kernel does it in one hop:

  program p (a BLOCK of the message) takes epoch e = its own counter + 1 (a local int32 per program: every rank
  launches the same sequence of calls with the same grid, so the counters agree);
  it stores its chunk of x into slot [e % 2, RANK] of every rank's buffer (its own and the peers': remote
  stores), then, after a barrier, writes e into flag [RANK, p] of every peer (release, system scope);
  it waits until flag [r, p] of its own pad holds >= e for every peer r (acquire, system scope), then sums
  slots [e % 2, 0 .. WORLD - 1] in rank order in fp32 and stores the sum, rounded once.

Every rank adds the same values in the same order, so the ranks get the same bits. Slots alternate between two
halves: a rank writes half e % 2 of a peer again only at epoch e + 2, which it reaches after the peer signalled
e + 1, that is after the peer's kernel of epoch e (its reads of that half) had finished. A rank that never
arrives (a peer that failed) leaves the others waiting, as a collective does.
"""
import triton
import triton.language as tl

from ._common import _cast


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, out_ptr, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, numel, slot,
                                RANK: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
                                BLOCK: tl.constexpr):
    """x, out [numel]; data_ptr: this rank's data buffer [2, WORLD, slot] in x's dtype; flags_ptr: its flag pad
    [WORLD, MAX_PROGRAMS] int32; rank r's copies lie data_deltas[r] 16-byte units and flag_deltas[r] int32 elements
    away from this rank's, as mapped on this GPU (int64 [WORLD]); epoch_ptr: int32 [MAX_PROGRAMS], this rank's own."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    e = tl.load(epoch_ptr + pid) + 1         # advanced below, once every warp of the program has read it
    half = (e % 2).to(tl.int64)
    per16: tl.constexpr = 128 // x_ptr.dtype.element_ty.primitive_bitwidth       # elements per 16 bytes
    x = tl.load(x_ptr + offs, mask=mask)
    for r in tl.static_range(WORLD):
        buf = data_ptr + tl.load(data_deltas + r) * per16
        tl.store(buf + (half * WORLD + RANK) * slot + offs, x, mask=mask)
    tl.debug_barrier()              # the program's stores before its signal
    for r in tl.static_range(WORLD):
        if r != RANK:
            flags = flags_ptr + tl.load(flag_deltas + r)
            tl.atomic_xchg(flags + RANK * MAX_PROGRAMS + pid, e, sem="release", scope="sys")
    for r in tl.static_range(WORLD):
        if r != RANK:
            seen = tl.atomic_add(flags_ptr + r * MAX_PROGRAMS + pid, 0, sem="acquire", scope="sys")
            while seen < e:
                seen = tl.atomic_add(flags_ptr + r * MAX_PROGRAMS + pid, 0, sem="acquire", scope="sys")
    tl.debug_barrier()              # every thread's loads after the wait; every warp has read the epoch
    tl.store(epoch_ptr + pid, e)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        acc += tl.load(data_ptr + (half * WORLD + r) * slot + offs, mask=mask, other=0.0, cache_modifier=".cg").to(
            tl.float32)
    tl.store(out_ptr + offs, _cast(acc, out_ptr.dtype.element_ty), mask=mask)

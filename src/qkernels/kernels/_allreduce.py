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
e + 1, that is after the peer's kernel of epoch e (its reads of that half) had finished.

LL (low latency; a PeerBuffers made with ll=True): no flags and no fence. Each element travels in a 64-bit word with
the epoch beside it (low 32 bits: the element's bits, high: e), pushed into slot [e % 2, RANK] of every peer; a
64-bit word lands whole (single-copy atomic), so a rank that reads e in a word has its element too, and polls its
own slots' words until every one of them holds e. The data moves in words four (fp16 / bf16) or two (fp32) times
its size: it is for decode-sized messages, where the flag's release fence and its second trip cost more than the
bytes. A word of another epoch in the half is older (epochs only grow: e - 2 at most), never taken for this one;
the halves are reused as above.

A rank that never arrives (a peer whose process or GPU failed) would leave the others spinning forever: the wait is
bounded (WAIT: nanoseconds of %globaltimer on a GPU; under the interpreter, which has no timer, polls), and a
program that gives up writes peer + 1 into the status word and goes on with what its buffer holds. The launcher's
caller reads the status at its next host synchronization and raises, naming that rank (ops/collective.py,
PeerBuffers.check): the result of a call that timed out is never used.
"""
import triton
import triton.language as tl

from ._common import _cast, _pdl_wait
from ._fused import _rstd, _store_rows


@triton.jit
def _clock(e, TIMER: tl.constexpr):
    """Nanoseconds of the GPU's global timer (TIMER), else 0: the interpreter counts polls instead (e: any int32 the
    asm takes as an operand, unused)."""
    if TIMER:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [e], dtype=tl.int64, is_pure=False,
                                         pack=1)
    return tl.zeros([], tl.int64)


@triton.jit
def _exchange_and_sum(x, offs, mask, pid, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, status_ptr, slot,
                      wait, RANK: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
                      TIMER: tl.constexpr):
    """Program pid's part of the exchange (the module's docstring): its epoch advanced, x [BLOCK] (at offs, this
    rank's values) pushed into slot [half, RANK] of every rank's buffer, its signal to every peer, the wait for
    theirs (at most `wait`: ns with TIMER, else polls; a peer that did not signal in time is written to status_ptr
    as its rank + 1); returns the fp32 sum of the WORLD slots at offs in rank order."""
    e = tl.load(epoch_ptr + pid) + 1         # advanced below, once every warp of the program has read it
    half = (e % 2).to(tl.int64)
    per16: tl.constexpr = 128 // data_ptr.dtype.element_ty.primitive_bitwidth       # elements per 16 bytes
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
            t0 = _clock(e, TIMER)
            spent = tl.zeros([], tl.int64)
            while (seen < e) & (spent < wait):
                seen = tl.atomic_add(flags_ptr + r * MAX_PROGRAMS + pid, 0, sem="acquire", scope="sys")
                if TIMER:
                    spent = _clock(e, TIMER) - t0
                else:
                    spent += 1
            if seen < e:             # rank r never arrived: say so, and end instead of hanging
                tl.atomic_xchg(status_ptr, r + 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()              # every thread's loads after the wait; every warp has read the epoch
    tl.store(epoch_ptr + pid, e)
    acc = tl.zeros(x.shape, dtype=tl.float32)
    for r in tl.static_range(WORLD):
        acc += tl.load(data_ptr + (half * WORLD + r) * slot + offs, mask=mask, other=0.0, cache_modifier=".cg").to(
            tl.float32)
    return acc


@triton.jit
def _exchange_and_sum_ll(x, offs, mask, pid, data_ptr, data_deltas, epoch_ptr, status_ptr, slot, wait,
                         RANK: tl.constexpr, WORLD: tl.constexpr, TIMER: tl.constexpr):
    """_exchange_and_sum under the LL protocol (the module's docstring): data_ptr is this rank's buffer as int64 words
    [2, WORLD, slot]; x's elements go to the peers packed with the epoch, the peers' are read from this rank's slots
    once every word holds the epoch (at most `wait`, as the flag protocol's wait). Returns the fp32 sum of the WORLD
    ranks' x at offs in rank order (this rank's own from x itself: the bits its peers receive)."""
    e = tl.load(epoch_ptr + pid) + 1
    half = (e % 2).to(tl.int64)
    if x.dtype.primitive_bitwidth == 16:
        low = x.to(tl.int16, bitcast=True).to(tl.int64) & 0xFFFF
    else:
        low = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    word = low | (e.to(tl.int64) << 32)
    for r in tl.static_range(WORLD):
        if r != RANK:
            buf = data_ptr + tl.load(data_deltas + r) * 2            # 16-byte units: two words each
            tl.store(buf + (half * WORLD + RANK) * slot + offs, word, mask=mask)
    acc = tl.zeros(x.shape, dtype=tl.float32)
    for r in tl.static_range(WORLD):
        if r == RANK:
            acc += x.to(tl.float32)
        else:
            at = data_ptr + (half * WORLD + r) * slot + offs
            got = tl.load(at, mask=mask, other=0, volatile=True)
            t0 = _clock(e, TIMER)
            spent = tl.zeros([], tl.int64)
            late = tl.sum(tl.where(mask & ((got >> 32).to(tl.int32) != e), 1, 0))
            while (late > 0) & (spent < wait):
                got = tl.load(at, mask=mask, other=0, volatile=True)
                late = tl.sum(tl.where(mask & ((got >> 32).to(tl.int32) != e), 1, 0))
                if TIMER:
                    spent = _clock(e, TIMER) - t0
                else:
                    spent += 1
            if late > 0:             # rank r never arrived: say so, and end instead of hanging
                tl.atomic_xchg(status_ptr, r + 1, sem="relaxed", scope="gpu")
            bits = (got & 0xFFFFFFFF).to(tl.int32)
            if x.dtype.primitive_bitwidth == 16:
                acc += bits.to(tl.int16).to(x.dtype, bitcast=True).to(tl.float32)
            else:
                acc += bits.to(tl.float32, bitcast=True)
    tl.debug_barrier()              # every warp has read the epoch
    tl.store(epoch_ptr + pid, e)
    return acc


@triton.jit
def _exchange(x, offs, mask, pid, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, status_ptr, slot, wait,
              RANK: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr, TIMER: tl.constexpr,
              LL: tl.constexpr):
    """The fp32 sum of the ranks' x at offs, under the LL protocol or the flag protocol."""
    if LL:
        acc = _exchange_and_sum_ll(x, offs, mask, pid, data_ptr, data_deltas, epoch_ptr, status_ptr, slot, wait,
                                   RANK, WORLD, TIMER)
    else:
        acc = _exchange_and_sum(x, offs, mask, pid, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr,
                                status_ptr, slot, wait, RANK, WORLD, MAX_PROGRAMS, TIMER)
    return acc


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, out_ptr, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, status_ptr,
                                numel, slot, wait, RANK: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
                                BLOCK: tl.constexpr, TIMER: tl.constexpr, PDL: tl.constexpr = False,
                                LL: tl.constexpr = False):
    """x, out [numel]; data_ptr: this rank's data buffer [2, WORLD, slot] in x's dtype (LL: int64 words);
    flags_ptr: its flag pad [WORLD, MAX_PROGRAMS] int32; rank r's copies lie data_deltas[r] 16-byte units and
    flag_deltas[r] int32 elements away from this rank's, as mapped on this GPU (int64 [WORLD]); epoch_ptr: int32
    [MAX_PROGRAMS], this rank's own; status_ptr: int32 [1], 0 unless a peer did not arrive within `wait` (the
    module's docstring). PDL: launched early, it waits for the kernel before, then lets the next one start (its
    weights fetched during the exchange). LL: the LL protocol's exchange (flags_ptr and flag_deltas unused)."""
    _pdl_wait(PDL)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask)
    acc = _exchange(x, offs, mask, pid, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, status_ptr, slot,
                    wait, RANK, WORLD, MAX_PROGRAMS, TIMER, LL)
    tl.store(out_ptr + offs, _cast(acc, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _all_reduce_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, rout_ptr, s_ptr, data_ptr, flags_ptr, data_deltas,
                                flag_deltas, epoch_ptr, status_ptr, N, slot, eps, wait,
                                RANK: tl.constexpr, WORLD: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
                                BLOCK_N: tl.constexpr, HAS_W: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr,
                                IS_FP8: tl.constexpr, FP8_EMULATE: tl.constexpr, TIMER: tl.constexpr,
                                PDL: tl.constexpr = False, LL: tl.constexpr = False):
    """The all-reduce of one row (program p: row p of x [M, N], every rank's partial of it) fused with what follows
    it in a decoder block: a = the sum over the ranks in rank order (fp32, rounded to x's dtype: the one-shot
    all-reduce's bits), h = a + residual (rounded as an eager add; written to rout), then RMSNorm of h with weight,
    as kernels/_fused.py's norm computes it (fp64 sum of squares, one rounding), written to y, or as per-row codes
    and scales (QUANT). The exchange is the one-shot kernel's, per row: slots [half, rank] of every rank's buffer at
    the row's offset, the program's flag and epoch (its PeerBuffers are its own: a row program's region is not a
    flat program's). PDL, LL: as the one-shot kernel's."""
    _pdl_wait(PDL)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    offs = pid.to(tl.int64) * N + cols
    w = tl.zeros([BLOCK_N], tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=cmask)
    acc = _exchange(x, offs, cmask, pid, data_ptr, flags_ptr, data_deltas, flag_deltas, epoch_ptr, status_ptr, slot,
                    wait, RANK, WORLD, MAX_PROGRAMS, TIMER, LL)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    a = _cast(acc, DT).to(tl.float32)
    res = tl.load(r_ptr + offs, mask=cmask, other=0.0).to(tl.float32)
    h = _cast(a + res, DT).to(tl.float32)
    tl.store(rout_ptr + offs, h.to(DT), mask=cmask)
    h2 = h[None, :]
    h64 = h2.to(tl.float64)
    y = h2 * _rstd(tl.sum(h64 * h64, axis=1), N, eps)[:, None]
    if HAS_W:
        y = y * w[None, :]
    rows = tl.zeros([1], tl.int64) + pid
    _store_rows(y_ptr, s_ptr, rows, rows >= 0, offs[None, :], cmask[None, :], _cast(y, DT), QUANT, QMAX, IS_FP8,
                FP8_EMULATE, 1)

"""Gluon kernel of the W4A8-FP8 linear on Hopper (sm_90): FP8 wgmma with the weight tile as its A operand straight
from registers. Launcher: ops/w4a8.py (configs with "path": "wg"). Reference: reference.w4a8_linear. The Triton
kernel (_w4a8.py) computes the same thing and is its CPU twin (Gluon has no interpreter).

Why. The weight-only wgmma kernel (weight_only/wg.py) spends about 2.3 instructions a weight turning codes into
fp16 (16-bit code pairs out of shared memory, a magic-number LOP3, an HADD2 for the zero point and an HMUL2 for
the scale per two weights). With FP8 activations the codes need none of that: a 4-bit code u under a zero high
nibble is, read as e4m3 bits, exactly u * 2**-9 (see _w4a8.py), and PackedWeight keeps k and k + 32 of a 64-k chunk
in one byte, so one 32-bit word of a row's codes is, after one AND, the A operand's four consecutive k of the
chunk's first half (k .. k + 3), and after a shift and an AND, the same four k of its second half. A thread reads
four such words per 64-k chunk (two rows, two k quads): about 0.5 instructions a weight.

The zero point rides on the tensor cores too: -z for an integer z in [0, 16] is also an exact e4m3 pattern (the
sign bit over the byte z), so a tile whose row r holds -z_r everywhere, multiplied by the same x slice into the
same accumulator, makes it sum_k (u_k - z) x_k. Each 64-k chunk has its own accumulator (fresh, four wgmmas: codes
and -z against x[k .. k + 31], then against x[k + 32 .. k + 63]), which is added to the fp32 total with the
chunk's group scale (times 2**9) once it is done: FP8 products are summed in fp32 over 128 products at most before
that promotion. Two chunk accumulators alternate, so one chunk's wgmmas run while the previous one is promoted and
the next one's codes are read.

Schedule (per program: a [BLOCK_N, BLOCK_M] tile of out.T, all or a slice of K): x (already e4m3, per-token
scales) and the code bytes come through a STAGES-deep shared-memory ring by TMA, one mbarrier per stage; a stage
is refilled once every warp is past the wgmmas that read it. Programmatic dependent launch: the first stages' code
bytes and (scale, zero) words are fetched before the wait for the kernel before, x after it.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .weight_only.gluon_shared import PER_CHANNEL, _bytes_of, _pdl_wait, _splitk_fixup
from .weight_only.wg import _wg_store

BK: gl.constexpr = gl.constexpr(64)     # k per chunk: 32 code bytes a row


@gluon.constexpr_function
def _quads_layout(ll):
    """Linear layout of an fp8 A operand [R, 32] (register bits 0, 1: k bits 0, 1: four consecutive k a thread)
    -> the layout of those quads as 32-bit words [R, 8]."""
    assert list(ll.reg_bases[0]) == [0, 1] and list(ll.reg_bases[1]) == [0, 2], ll

    def quad(bases):
        return [[r, k // 4] for r, k in bases]
    return gl.DistributedLinearLayout(quad(ll.reg_bases[2:]), quad(ll.lane_bases), quad(ll.warp_bases),
                                      quad(ll.block_bases), [ll.shape[0], ll.shape[1] // 4])


@gluon.jit
def _sz_words(s_p, chunk, GROUP: gl.constexpr):
    """The (scale, zero) words of K chunk `chunk` (absolute), one per row of s_p's layout."""
    if GROUP == PER_CHANNEL:
        return gl.load(s_p)
    return gl.load(s_p + chunk * BK // GROUP)


@gluon.jit
def _neg_zero(sz, st: gl.constexpr, ql: gl.constexpr, al: gl.constexpr):
    """The A tile [R, 32] whose row r is -z_r (e4m3: the sign bit over the byte z, exact for integers 0..16)."""
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32).to(gl.int32)
    w = (z | 0x80) * 0x01010101
    w = gl.convert_layout(w, gl.SliceLayout(1, ql))
    R: gl.constexpr = w.shape[0]
    return _bytes_of(w[:, None] + gl.zeros([R, BK // 8], gl.int32, layout=ql), al, gl.float8e4nv)


@gluon.jit
def _issue(unit, sz, c_ring, x_ring, bars, acc, CPG: gl.constexpr, STAGES: gl.constexpr, st: gl.constexpr,
           ql: gl.constexpr, al: gl.constexpr):
    """Issue the wgmmas of promotion unit `unit` (CPG chunks of one group, the slice's chunks CPG * unit onward) into
    acc (fresh: its old value is not read): per chunk, wait for its ring stage, read its codes into the two A tiles,
    four wgmmas (codes and -z against x[k .. k + 31], then against x[k + 32 .. k + 63])."""
    nz = _neg_zero(sz, st, ql, al)
    BN: gl.constexpr = c_ring.shape[1]
    for i in gl.static_range(CPG):
        chunk = unit * CPG + i
        stage = chunk % STAGES
        mbarrier.wait(bars.index(stage), (chunk // STAGES) & 1)
        w = c_ring.index(stage)._reinterpret(gl.int32, [BN, BK // 8], c_ring.layout).load(ql)
        lo = _bytes_of(w & 0x0F0F0F0F, al, gl.float8e4nv)
        hi = _bytes_of((w >> 4) & 0x0F0F0F0F, al, gl.float8e4nv)
        xs = x_ring.index(stage)
        xl = xs.slice(0, BK // 2, dim=1).permute((1, 0))
        xh = xs.slice(BK // 2, BK // 2, dim=1).permute((1, 0))
        acc = warpgroup_mma(lo, xl, acc, use_acc=i > 0, is_async=True)
        acc = warpgroup_mma(nz, xl, acc, is_async=True)
        acc = warpgroup_mma(hi, xh, acc, is_async=True)
        acc = warpgroup_mma(nz, xh, acc, is_async=True)
    return acc


@gluon.jit
def _load(x_desc, w_desc, x_ring, c_ring, bars, chunk, s0, off_m, off_n, pred, STAGES: gl.constexpr):
    """The TMA copies of slice chunk `chunk` (code bytes and x) into its ring stage, completing on its barrier."""
    stage = chunk % STAGES
    k0 = (s0 + chunk) * BK
    mbarrier.expect(bars.index(stage), w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, k0 // 2], bars.index(stage), c_ring.index(stage), pred=pred)
    tma.async_copy_global_to_shared(x_desc, [off_m, k0], bars.index(stage), x_ring.index(stage), pred=pred)


@gluon.jit
def _release(x_desc, w_desc, x_ring, c_ring, bars, empty, unit, steps, s0, off_m, off_n, CPG: gl.constexpr,
             STAGES: gl.constexpr, WS: gl.constexpr):
    """Promotion unit `unit`'s wgmmas are done: the stages of its CPG chunks take the chunks STAGES later. WS: handed
    back to the producer warp (their `empty` barriers); else refilled here, once every warp is past them."""
    if WS:
        fence_async_shared()        # this partition's reads of the stages ordered before the producer's TMA writes
        for i in gl.static_range(CPG):
            mbarrier.arrive(empty.index((unit * CPG + i) % STAGES), count=1)
    else:
        gl.thread_barrier()
        for i in gl.static_range(CPG):
            chunk = unit * CPG + i
            _load(x_desc, w_desc, x_ring, c_ring, bars, chunk + STAGES, s0, off_m, off_n, chunk + STAGES < steps,
                  STAGES)


@gluon.jit
def _produce(x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, STAGES: gl.constexpr,
             PDL: gl.constexpr):
    """WS's producer warp: the first STAGES chunks' code bytes, the wait for the kernel before (PDL), their x; then
    each later chunk once the consumers have handed its stage back."""
    _ring_first(x_desc, w_desc, x_ring, c_ring, bars, steps, s0, off_m, off_n, STAGES, True)
    _pdl_wait(PDL)
    _ring_first(x_desc, w_desc, x_ring, c_ring, bars, steps, s0, off_m, off_n, STAGES, False)
    for c in range(STAGES, steps):
        mbarrier.wait(empty.index(c % STAGES), (c // STAGES - 1) & 1)
        _load(x_desc, w_desc, x_ring, c_ring, bars, c, s0, off_m, off_n, True, STAGES)


@gluon.jit
def _scale_of(sz, st: gl.constexpr, layout: gl.constexpr):
    """A unit's promotion factor per weight row, in `layout`: the group scale times 2**9 (the codes are u * 2**-9)."""
    s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
    return gl.convert_layout(s * 512.0, layout)


@gluon.jit
def _mainloop(s_p, x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, GROUP: gl.constexpr,
              st: gl.constexpr, mma: gl.constexpr, ql: gl.constexpr, al: gl.constexpr, CPG: gl.constexpr,
              STAGES: gl.constexpr, WS: gl.constexpr):
    """The fp32 total [weight rows, tokens] over the slice's chunks (the ring started by the caller, or by the
    producer warp with WS), in promotion units of CPG chunks (steps: a multiple of CPG). Two units per iteration,
    each with its own accumulator: unit u's wgmmas run while unit u - 1 is promoted, its stages released and unit
    u + 1's codes read; each unit's (scale, zero) words are loaded two units ahead."""
    NW: gl.constexpr = 4 * CPG          # wgmma groups a unit
    sl: gl.constexpr = gl.SliceLayout(1, mma)
    BN: gl.constexpr = c_ring.shape[1]
    BM: gl.constexpr = x_ring.shape[1]
    tot = gl.zeros([BN, BM], gl.float32, layout=mma)
    units = steps // CPG
    acc_b = tot
    a_b = gl.zeros([BN], gl.float32, layout=sl)     # no unit before the first: a zero promotion
    sz = _sz_words(s_p, s0, GROUP)
    sz_b = _sz_words(s_p, s0 + CPG * gl.minimum(1, units - 1), GROUP)
    for j in range(units // 2):
        u = 2 * j
        acc_a = _issue(u, sz, c_ring, x_ring, bars, tot, CPG, STAGES, st, ql, al)
        a_a = _scale_of(sz, st, sl)
        sz = _sz_words(s_p, s0 + CPG * gl.minimum(u + 2, units - 1), GROUP)
        acc_b = warpgroup_mma_wait(NW, deps=[acc_b])
        tot += a_b[:, None] * acc_b
        if u >= 1:
            _release(x_desc, w_desc, x_ring, c_ring, bars, empty, u - 1, steps, s0, off_m, off_n, CPG, STAGES, WS)
        acc_b = _issue(u + 1, sz_b, c_ring, x_ring, bars, tot, CPG, STAGES, st, ql, al)
        a_b = _scale_of(sz_b, st, sl)
        sz_b = _sz_words(s_p, s0 + CPG * gl.minimum(u + 3, units - 1), GROUP)
        acc_a, acc_b = warpgroup_mma_wait(NW, deps=[acc_a, acc_b])     # unit u + 1's still in flight
        tot += a_a[:, None] * acc_a
        _release(x_desc, w_desc, x_ring, c_ring, bars, empty, u, steps, s0, off_m, off_n, CPG, STAGES, WS)
    if units % 2 == 1:
        acc_a = _issue(units - 1, sz, c_ring, x_ring, bars, tot, CPG, STAGES, st, ql, al)
        a_a = _scale_of(sz, st, sl)
        acc_b = warpgroup_mma_wait(NW, deps=[acc_b])
        tot += a_b[:, None] * acc_b
        acc_a = warpgroup_mma_wait(0, deps=[acc_a])
        tot += a_a[:, None] * acc_a
    else:
        acc_b = warpgroup_mma_wait(0, deps=[acc_b])
        tot += a_b[:, None] * acc_b
    return (tot,)


@gluon.jit
def _program_tile(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(token offset, weight-row offset) of this program's tile, in grouped order (GROUP_M token blocks share each
    weight block in L2)."""
    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BLOCK_M)
    width = GROUP_M * gl.cdiv(N, BLOCK_N)
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    return (first_m + (pid % width) % gm) * BLOCK_M, ((pid % width) // gm) * BLOCK_N


@gluon.jit
def _k_slice(K, CPG: gl.constexpr, SPLIT_K: gl.constexpr):
    """(first chunk, chunks) of this program's slice of K: all of it, or slice program_id(1) of SPLIT_K in whole
    promotion units."""
    if SPLIT_K == 1:
        return 0, K // BK
    per = gl.cdiv(K // (BK * CPG), SPLIT_K)
    return gl.program_id(1) * per * CPG, gl.minimum(K // (BK * CPG) - gl.program_id(1) * per, per) * CPG


@gluon.jit
def _ring_first(x_desc, w_desc, x_ring, c_ring, bars, steps, s0, off_m, off_n, STAGES: gl.constexpr,
                CODES: gl.constexpr):
    """The first STAGES chunks' copies: CODES, their code bytes (and each stage's expected bytes), issued before the
    wait for the kernel before (PDL); else their x, issued after it."""
    for p in gl.static_range(STAGES):
        if CODES:
            mbarrier.expect(bars.index(p), w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=p < steps)
            tma.async_copy_global_to_shared(w_desc, [off_n, (s0 + p) * (BK // 2)], bars.index(p), c_ring.index(p),
                                            pred=p < steps)
        else:
            tma.async_copy_global_to_shared(x_desc, [off_m, (s0 + p) * BK], bars.index(p), x_ring.index(p),
                                            pred=p < steps)


@gluon.jit
def _finish(t, xs_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, off_m, off_n, M, N, stride_om, HAS_BIAS: gl.constexpr,
            SPLIT_K: gl.constexpr, W: gl.constexpr):
    """An out.T tile's fp32 sums t [BLOCK_N, BLOCK_M] (this slice's, with SPLIT_K > 1: added up by the tile's last
    program) times the tokens' scales (+ bias) into out."""
    on = off_n + gl.arange(0, t.shape[0], layout=gl.SliceLayout(1, t.type.layout))
    om = off_m + gl.arange(0, t.shape[1], layout=gl.SliceLayout(0, t.type.layout))
    last = True
    if SPLIT_K > 1:
        t, last = _splitk_fixup(t, ws_ptr, cnt_ptr, gl.program_id(0), on, om, (on < N)[:, None] & (om < M)[None, :],
                                M, N, SPLIT_K)
    if last:
        t = t * gl.load(xs_ptr + om % M)[None, :]
        _wg_store(t, bias_ptr, out_ptr, off_m, off_n, 0, M, N, stride_om, HAS_BIAS, False, W)


@gluon.jit
def _w4a8_wg_kernel(x_desc, w_desc, xs_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_sn, stride_om, ws_ptr,
                    cnt_ptr, GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr = 1,
                    CPG: gl.constexpr = 1, WS: gl.constexpr = False, PDL: gl.constexpr = False):
    """out [M, N] = (x_q @ W.T) * x_scale (+ bias). x_desc: TMA descriptor of the e4m3 x [M, K], blocks
    [BLOCK_M, 64]; w_desc: of the code bytes [N, K / 2], blocks [BLOCK_N, 32] (rows past M / N read as zeros);
    xs_ptr: [M] fp32 per-token scales; sz_ptr: [N, K / GROUP] (scale, zero) words, integer zero points in [0, 16].
    BLOCK_N: 64 x warpgroups; BLOCK_M: 8..256, a multiple of 8 (the wgmma's n). Grouped program order (GROUP_M x
    blocks share each weight block in L2). SPLIT_K > 1: program column z covers slice z of the chunks, partials added
    up by the tile's last program (_splitk_fixup: ws_ptr [SPLIT_K, M, N] fp32, cnt_ptr one counter per tile). WS:
    warp-specialized, one more warp (the producer: every TMA copy, the PDL wait) fills the ring while the
    warpgroups only read codes and issue wgmmas, handing each stage back through an `empty` mbarrier."""
    W: gl.constexpr = gl.num_warps()
    st: gl.constexpr = sz_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_M, 32])
    al: gl.constexpr = gl.DotOperandLayout(0, mma, 4)
    ql: gl.constexpr = _quads_layout(gl.to_linear_layout(al, [BLOCK_N, BK // 2]))
    rl: gl.constexpr = gl.SliceLayout(1, ql)          # a value per weight row, as the A tiles hold the rows

    off_m, off_n = _program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = (off_n + gl.arange(0, BLOCK_N, layout=rl)) % N         # wrapped: no masks on the scale loads
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + rows.to(gl.int64) * stride_sn
    s0, steps = _k_slice(K, CPG, SPLIT_K)

    x_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BK], x_desc.layout)
    c_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, BK // 2], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(bars.index(p), count=1)
    if WS:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for p in gl.static_range(STAGES):
            mbarrier.init(empty.index(p), count=1)
        tot, = gl.warp_specialize([
            (_mainloop, (s_p, x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, GROUP, st, mma,
                         ql, al, CPG, STAGES, True)),
            (_produce, (x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, STAGES, PDL)),
        ], [1], [24])
        for p in gl.static_range(STAGES):
            mbarrier.invalidate(empty.index(p))
    else:
        _ring_first(x_desc, w_desc, x_ring, c_ring, bars, steps, s0, off_m, off_n, STAGES, True)
        _pdl_wait(PDL)
        _ring_first(x_desc, w_desc, x_ring, c_ring, bars, steps, s0, off_m, off_n, STAGES, False)
        tot, = _mainloop(s_p, x_desc, w_desc, x_ring, c_ring, bars, bars, steps, s0, off_m, off_n, GROUP, st, mma,
                         ql, al, CPG, STAGES, False)
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(p))
    _finish(tot, xs_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, off_m, off_n, M, N, stride_om, HAS_BIAS, SPLIT_K, W)

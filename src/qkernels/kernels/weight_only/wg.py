"""Gluon kernel for weight-only linears on Hopper (sm_90), 4- or 8-bit codes: wgmma fed by in-register
dequantization, for large M (x tiles up to 256 rows) and, with split-K, small M (x tiles of 8-32 rows: the
wgmma's n).
Launcher: ops/weight_only/launch.py (path "wg"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language kernels (gemv.py, mm.py) compute the same thing and are its CPU twin (Gluon has no
interpreter); the tests run this one on Hopper GPUs against the reference.

Why. In the Triton-language mm kernel Triton waits for each wgmma before it dequantizes the next tile, so
tensor cores and the dequantization take turns (~0.6x fp16 cuBLAS at M >= 1024). Here the schedule is
explicit, per 64-k step:

  - x and the code bytes of each step come through a STAGES-deep shared-memory ring by TMA (one mbarrier per
    stage), refilled as soon as every warp is done with a stage; the (scale, zero) words are plain loads;
  - out.T = W @ x.T: the weight tile is the wgmma's A operand straight from registers (64 rows per warpgroup),
    x.T its B operand from the ring; the code bytes are read from shared memory as 16-bit pairs in the
    A-operand layout (a pair is the two adjacent k a thread holds), so the dequantized values need no layout
    change, and low / high nibbles (k and k + 32 of the packed chunk) are two wgmmas on the two halves of the
    x tile. 8-bit codes: the step's 64 bytes of a row come as two 32-byte TMA boxes (k and k + 32), read and
    multiplied the same way, a byte per value instead of a nibble;
  - a step issues its wgmmas, waits for the previous step's (is_async, one step in flight), refills the stage
    that step read and dequantizes the next tile while its own wgmmas run. The loop takes two steps per
    iteration so the tile in flight and the one being written are different registers (with one loop-carried
    tile ptxas held the dequantization back until the wgmma reading those registers was done).

Measured against other designs in docs/design/weight-only.md: the same pipeline with the dequantized
tile stored to shared memory as the B operand (x as A) lost ~40% to the extra shared-memory traffic.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)

from .gluon_shared import PER_CHANNEL, _halves_of, _pdl_wait, _splitk_fixup


BK: gl.constexpr = gl.constexpr(64)     # k per step: one 64-k chunk (32 code bytes per row at 4 bits, 64 at 8)


@gluon.jit
def _wg_expect(x_desc, w_desc, bars, xbars, stage, pred, BITS: gl.constexpr, KC: gl.constexpr, SWIGLU: gl.constexpr,
               XBAR: gl.constexpr):
    """Start ring stage `stage` (KC 64-k chunks): its barrier expects the code bytes and x tiles of all KC chunks;
    XBAR: the code bytes on `bars`, the x tiles on `xbars` (a separate allocation: the compiler's shared-memory
    barrier analysis then orders the stage's copies behind both expects with one CTA barrier, not one per copy)."""
    CPS: gl.constexpr = BITS // 4
    NBOX: gl.constexpr = 2 if SWIGLU else 1
    codes: gl.constexpr = KC * CPS * NBOX * w_desc.block_type.nbytes
    if XBAR:
        mbarrier.expect(bars.index(stage), codes, pred=pred)
        mbarrier.expect(xbars.index(stage), KC * x_desc.block_type.nbytes, pred=pred)
    else:
        mbarrier.expect(bars.index(stage), codes + KC * x_desc.block_type.nbytes, pred=pred)


@gluon.jit
def _wg_issue_codes(w_desc, c_ring, bars, stage, off_n, up0, k0, pred, BITS: gl.constexpr, KC: gl.constexpr,
                    SWIGLU: gl.constexpr):
    """The TMA copies of ring stage `stage`'s code bytes (KC 64-k chunks from k0, after _wg_expect), one
    32-byte-wide box per row and chunk at 4 bits (ring entry KC stage + c), two at 8 (entries 2 (KC stage + c) and
    + 1: k and k + 32). SWIGLU: each box is two half-height boxes, gate rows from off_n into the entry's first
    half, up rows from off_n + up0 into its second. _wg_issue_x adds the x tiles."""
    bar = bars.index(stage)
    CPS: gl.constexpr = BITS // 4
    HB: gl.constexpr = w_desc.block_type.shape[0]
    for c in gl.static_range(KC):
        for h in gl.static_range(CPS):
            kk = (k0 + c * BK) // 2 if BITS == 4 else k0 + c * BK + h * (BK // 2)
            dst = c_ring.index((stage * KC + c) * CPS + h)
            if SWIGLU:
                tma.async_copy_global_to_shared(w_desc, [off_n, kk], bar, dst.slice(0, HB, dim=0), pred=pred)
                tma.async_copy_global_to_shared(w_desc, [off_n + up0, kk], bar, dst.slice(HB, HB, dim=0), pred=pred)
            else:
                tma.async_copy_global_to_shared(w_desc, [off_n, kk], bar, dst, pred=pred)


@gluon.jit
def _wg_issue_x(x_desc, x_ring, xbars, stage, off_m, k0, pred, KC: gl.constexpr):
    """The TMA copies of ring stage `stage`'s KC x tiles (entries KC stage + c), completing on xbars (the code
    bytes' barriers unless XBAR)."""
    for c in gl.static_range(KC):
        tma.async_copy_global_to_shared(x_desc, [off_m, k0 + c * BK], xbars.index(stage),
                                        x_ring.index(stage * KC + c), pred=pred)


def _pairs_asm(magic: str) -> str:
    """PTX: one 16-bit code pair (bytes b0, b1) in $2 -> magic + low nibbles of b0, b1 in $0 and magic + high
    nibbles in $1, as 16-bit float pairs (prmt spreads the bytes into the halves, lop3 ORs a nibble into the
    magic number's mantissa)."""
    return f"""{{
        .reg .b32 t, u, m, mg;
        mov.b32 m, 0x000F000F;
        mov.b32 mg, {magic};
        cvt.u32.u16 u, $2;
        prmt.b32 t, u, 0, 0x4140;
        lop3.b32 $0, t, m, mg, 0xEA;
        shr.b32 t, t, 4;
        lop3.b32 $1, t, m, mg, 0xEA;
        }}"""


_PAIRS_F16: gl.constexpr = gl.constexpr(_pairs_asm("0x64006400"))     # magic 1024.0
_PAIRS_BF16: gl.constexpr = gl.constexpr(_pairs_asm("0x43004300"))    # magic 128.0
# PTX: two 16-bit pairs of 8-bit codes (bytes b0, b1 in $2 and $3) -> 1024 + b0, 1024 + b1 as fp16 pairs in $0 and
# $1 (prmt puts each byte under the exponent byte 0x64 of 1024.0; fp16 holds 1024 + u exactly for u < 1024)
_BYTES_F16: gl.constexpr = gl.constexpr("""{
        .reg .b32 u, v, mg;
        mov.b32 mg, 0x64646464;
        cvt.u32.u16 u, $2;
        cvt.u32.u16 v, $3;
        prmt.b32 $0, u, mg, 0x4140;
        prmt.b32 $1, v, mg, 0x4140;
        }""")


@gluon.constexpr_function
def _pairs_layout(ll):
    """Linear layout of the A operand's code bytes [R, 32] (register bit 0 is k bit 0: each thread holds byte
    pairs) -> the layout of those pairs as 16-bit words [R, 16]."""
    assert list(ll.reg_bases[0]) == [0, 1], ll

    def half(bases):
        return [[r, k // 2] for r, k in bases]
    return gl.DistributedLinearLayout(half(ll.reg_bases[1:]), half(ll.lane_bases), half(ll.warp_bases),
                                      half(ll.block_bases), [ll.shape[0], ll.shape[1] // 2])


@gluon.jit
def _wg_dequant(codes, sz, INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr, al: gl.constexpr,
                BITS: gl.constexpr):
    """Code pairs (_wg_codes) -> (lo, hi): the dequantized k = j and k = 32 + j halves of the step's 64-k chunk,
    [BN, 32] each, in the wgmma A-operand layout `al`. The codes become magic + u in 16-bit floats: 4-bit, one
    uint16 of two code bytes per pair of each half (low / high nibbles); 8-bit, one uint16 per pair and half, in
    fp16 whatever dt (bf16's 7 mantissa bits hold no magic + u for u up to 255: u is taken exactly from the fp16
    form, exact in bf16 too). For integer zero points and the magic's own dtype, (magic + u) - (magic + z) is exact."""
    if BITS == 8:
        lw, hw = gl.inline_asm_elementwise(asm=_BYTES_F16, constraints="=r,=r,h,h", args=[codes[0], codes[1]],
                                           dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        HT: gl.constexpr = gl.float16
        MAGIC: gl.constexpr = 1024.0
    elif dt == gl.bfloat16:
        lw, hw = gl.inline_asm_elementwise(asm=_PAIRS_BF16, constraints="=r,=r,h", args=[codes[0]],
                                           dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        HT: gl.constexpr = gl.bfloat16
        MAGIC: gl.constexpr = 128.0
    else:
        lw, hw = gl.inline_asm_elementwise(asm=_PAIRS_F16, constraints="=r,=r,h", args=[codes[0]],
                                           dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        HT: gl.constexpr = gl.float16
        MAGIC: gl.constexpr = 1024.0
    lo = _halves_of(lw, HT, al)
    hi = _halves_of(hw, HT, al)
    szl: gl.constexpr = gl.SliceLayout(1, al)
    sz = gl.convert_layout(sz, szl, assert_trivial=True)
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True)
    if INT_Z and HT == dt:
        zz = (z.to(gl.float32) + MAGIC).to(dt)[:, None]
        lo = lo - zz
        hi = hi - zz
    else:
        zz = z.to(dt)[:, None]
        lo = (lo - MAGIC).to(dt) - zz
        hi = (hi - MAGIC).to(dt) - zz
    s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(dt)[:, None]
    return lo * s, hi * s


@gluon.jit
def _wg_codes(c_ring, bars, xbars, step, al: gl.constexpr, STAGES: gl.constexpr, BITS: gl.constexpr,
              KC: gl.constexpr, XBAR: gl.constexpr):
    """Wait for the stage holding chunk `step` (stage step // KC mod STAGES; a wait on a stage already complete
    returns at once; XBAR: for its x tiles too) and read the chunk's code bytes as 16-bit pairs in the A-operand
    layout: 8-bit, the pairs of k and of k + 32; 4-bit, the pairs of both (twice, the same value)."""
    g = step // KC
    mbarrier.wait(bars.index(g % STAGES), (g // STAGES) & 1)
    if XBAR:
        mbarrier.wait(xbars.index(g % STAGES), (g // STAGES) & 1)
    BN: gl.constexpr = c_ring.shape[1]
    pl: gl.constexpr = _pairs_layout(gl.to_linear_layout(al, [BN, BK // 2]))
    CPS: gl.constexpr = BITS // 4
    e = step % (STAGES * KC)
    clo = c_ring.index(CPS * e)._reinterpret(gl.uint16, [BN, BK // 4], c_ring.layout).load(pl)
    if BITS == 8:
        chi = c_ring.index(CPS * e + 1)._reinterpret(gl.uint16, [BN, BK // 4], c_ring.layout).load(pl)
    else:
        chi = clo
    return clo, chi


@gluon.jit
def _wg_sz(s_p, step, steps, s0, GROUP: gl.constexpr):
    """The (scale, zero) words of the slice's step `step` (clamped to its last step; s0: the slice's first step
    in K), one per row."""
    if GROUP == PER_CHANNEL:
        return gl.load(s_p)
    return gl.load(s_p + (s0 + gl.minimum(step, steps - 1)) * BK // GROUP)


@gluon.jit
def _wg_mma(acc, lo, hi, xs):
    """Issue one step's wgmmas: low nibbles with the x tile's first 32 k, high nibbles with its last 32."""
    acc = warpgroup_mma(lo, xs.slice(0, BK // 2, dim=1).permute((1, 0)), acc, is_async=True)
    return warpgroup_mma(hi, xs.slice(BK // 2, BK // 2, dim=1).permute((1, 0)), acc, is_async=True)


@gluon.jit
def _wg_refill(x_desc, w_desc, x_ring, c_ring, bars, xbars, g, steps, s0, off_m, off_n, up0, pred,
               BITS: gl.constexpr, KC: gl.constexpr, STAGES: gl.constexpr, SWIGLU: gl.constexpr, XBAR: gl.constexpr):
    """Load stage group g (chunks g KC ...) into ring stage g mod STAGES, if it is in the slice (and pred)."""
    pred = pred & (g * KC < steps)
    k0 = (s0 + g * KC) * BK
    _wg_expect(x_desc, w_desc, bars, xbars, g % STAGES, pred, BITS, KC, SWIGLU, XBAR)
    _wg_issue_codes(w_desc, c_ring, bars, g % STAGES, off_n, up0, k0, pred, BITS, KC, SWIGLU)
    _wg_issue_x(x_desc, x_ring, xbars, g % STAGES, off_m, k0, pred, KC)


@gluon.jit
def _wg_step(acc, lo, hi, sz, step, steps, s0, x_desc, w_desc, x_ring, c_ring, bars, xbars, empty, s_p, off_m, off_n,
             up0, GROUP: gl.constexpr, INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr, al: gl.constexpr,
             STAGES: gl.constexpr, BITS: gl.constexpr, KC: gl.constexpr, SWIGLU: gl.constexpr, WS: gl.constexpr,
             XBAR: gl.constexpr):
    """Chunk `step`: issue its wgmmas on (lo, hi) and start the load of the (scale, zero) words of the chunk
    after next; wait for the previous chunk's wgmmas (its tile's registers are then free); if that chunk was its
    stage's last, refill the stage with the chunks STAGES stages on, once every warp is past it (WS: hand the stage
    back to the producer warp through its `empty` barrier: one elected arrive after a barrier of the consumer
    warps); read and dequantize the next chunk's codes (after the last chunk: the last one again, unused; sz: its
    words, loaded a chunk ago) while this chunk's wgmmas run. Returns (acc in flight, next lo, next hi, the words
    for the chunk after next)."""
    acc = _wg_mma(acc, lo, hi, x_ring.index(step % (STAGES * KC)))
    if GROUP == PER_CHANNEL:      # per channel: the same words every chunk
        sz_after = sz
    else:
        sz_after = _wg_sz(s_p, step + 2, steps, s0, GROUP)
    acc = warpgroup_mma_wait(2, deps=[acc])
    if WS:
        done = (step >= 1) & ((step - 1) % KC == KC - 1)
        fence_async_shared()        # this partition's reads of the stage ordered before the producer's TMA writes
        mbarrier.arrive(empty.index(((step - 1) // KC) % STAGES), count=1, pred=done)
    else:
        g = (step - 1) // KC + STAGES       # the stage the previous chunk was in, refilled with stage g
        if KC == 1:     # every chunk ends its stage (the barrier unconditional, as branch-free code)
            gl.thread_barrier()
            _wg_refill(x_desc, w_desc, x_ring, c_ring, bars, xbars, g, steps, s0, off_m, off_n, up0, step >= 1, BITS,
                       KC, STAGES, SWIGLU, XBAR)
        elif (step >= 1) & ((step - 1) % KC == KC - 1):
            gl.thread_barrier()
            _wg_refill(x_desc, w_desc, x_ring, c_ring, bars, xbars, g, steps, s0, off_m, off_n, up0, True, BITS, KC,
                       STAGES, SWIGLU, XBAR)
    codes = _wg_codes(c_ring, bars, xbars, gl.minimum(step + 1, steps - 1), al, STAGES, BITS, KC, XBAR)
    nlo, nhi = _wg_dequant(codes, sz, INT_Z, dt, st, al, BITS)
    return acc, nlo, nhi, sz_after


@gluon.jit
def _wg_loop(sz, s_p, x_desc, w_desc, x_ring, c_ring, bars, xbars, empty, steps, s0, off_m, off_n, up0,
             GROUP: gl.constexpr, INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr, al: gl.constexpr,
             mma: gl.constexpr, STAGES: gl.constexpr, BITS: gl.constexpr, KC: gl.constexpr, SWIGLU: gl.constexpr,
             WS: gl.constexpr, XBAR: gl.constexpr):
    """The main loop over the slice's chunks (sz: the first chunk's (scale, zero) words, or None: loaded here);
    with WS, the default partition of the warp-specialized kernel (the ring filled by _wg_produce). Returns (acc,)
    once every wgmma is done."""
    BN: gl.constexpr = c_ring.shape[1]
    BM: gl.constexpr = x_ring.shape[1]
    if sz is None:
        sz = _wg_sz(s_p, 0, steps, s0, GROUP)
    lo, hi = _wg_dequant(_wg_codes(c_ring, bars, xbars, 0, al, STAGES, BITS, KC, XBAR), sz, INT_Z, dt, st, al, BITS)
    if GROUP != PER_CHANNEL:
        sz = _wg_sz(s_p, 1, steps, s0, GROUP)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    # Two steps per iteration, so that the tile in flight and the one being dequantized are different values
    # (registers): a single loop-carried tile made ptxas hold the next tile's dequantization until the wgmma
    # reading the carried registers was done.
    for j in range(steps // 2):
        acc, lo2, hi2, sz = _wg_step(acc, lo, hi, sz, 2 * j, steps, s0, x_desc, w_desc, x_ring, c_ring, bars, xbars,
                                     empty, s_p, off_m, off_n, up0, GROUP, INT_Z, dt, st, al, STAGES, BITS, KC, SWIGLU,
                                     WS, XBAR)
        acc, lo, hi, sz = _wg_step(acc, lo2, hi2, sz, 2 * j + 1, steps, s0, x_desc, w_desc, x_ring, c_ring, bars,
                                   xbars, empty, s_p, off_m, off_n, up0, GROUP, INT_Z, dt, st, al, STAGES, BITS, KC,
                                   SWIGLU, WS, XBAR)
    if steps % 2 == 1:      # the last step's tile was dequantized by the last iteration
        acc = warpgroup_mma_wait(0, deps=[_wg_mma(acc, lo, hi, x_ring.index((steps - 1) % (STAGES * KC)))])
    return (warpgroup_mma_wait(0, deps=[acc]),)


@gluon.jit
def _wg_produce(x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, up0, STAGES: gl.constexpr,
                BITS: gl.constexpr, KC: gl.constexpr, SWIGLU: gl.constexpr, PDL: gl.constexpr):
    """WS's producer warp: the first STAGES stages' code bytes, the wait for the kernel before (PDL), their x tiles;
    then each later stage group g once the consumers have handed its ring stage back (the (g // STAGES - 1)-th
    completion of that stage's `empty` barrier)."""
    for p in gl.static_range(STAGES):
        _wg_expect(x_desc, w_desc, bars, bars, p, p * KC < steps, BITS, KC, SWIGLU, False)
        _wg_issue_codes(w_desc, c_ring, bars, p, off_n, up0, (s0 + p * KC) * BK, p * KC < steps, BITS, KC, SWIGLU)
    _pdl_wait(PDL)
    for p in gl.static_range(STAGES):
        _wg_issue_x(x_desc, x_ring, bars, p, off_m, (s0 + p * KC) * BK, p * KC < steps, KC)
    for g in range(STAGES, steps // KC):
        stage = g % STAGES
        mbarrier.wait(empty.index(stage), (g // STAGES - 1) & 1)
        k0 = (s0 + g * KC) * BK
        _wg_expect(x_desc, w_desc, bars, bars, stage, True, BITS, KC, SWIGLU, False)
        _wg_issue_codes(w_desc, c_ring, bars, stage, off_n, up0, k0, True, BITS, KC, SWIGLU)
        _wg_issue_x(x_desc, x_ring, bars, stage, off_m, k0, True, KC)


@gluon.jit
def _wo_wg_kernel(x_desc, w_desc, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_sn, stride_om, ws_ptr, cnt_ptr, full,
                   GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, INT_Z: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                   SPLIT_K: gl.constexpr = 1, BITS: gl.constexpr = 4, KC: gl.constexpr = 1,
                   SWIGLU: gl.constexpr = False, TAIL: gl.constexpr = 1, WS: gl.constexpr = False,
                   PDL: gl.constexpr = False, XBAR: gl.constexpr = False):
    """W4A16 / W8A16 (BITS) on Hopper, K a multiple of 64, GROUP PER_CHANNEL or a multiple of 64. One program per
    output tile, computed as out.T [BLOCK_N, BLOCK_M] = W tile @ x tile.T (grouped order: GROUP_M x blocks share
    each weight block in L2). x_desc: TMA descriptor of x [M, K], blocks [BLOCK_M, 64]; w_desc: of the code bytes
    ([N, K / 2] at 4 bits, [N, K] at 8), blocks [BLOCK_N, 32] (rows past M / N read as zeros). BLOCK_N: a multiple
    of 16 x num_warps (warpgroups split the weight rows); BLOCK_M <= 256 (the wgmma's n), a multiple of 8.
    The ring has STAGES stages of KC 64-k chunks each (one barrier, one refill per stage: KC > 1 asks for fewer,
    larger copies; the launcher makes K / 64 a multiple of KC). SPLIT_K > 1: program column z covers slice z of
    the stages (the launcher makes every slice non-empty); partials are added up in this kernel (_splitk_fixup:
    ws_ptr [SPLIT_K, M, N] fp32, cnt_ptr one counter per tile). TAIL > 1 (SPLIT_K == 1): the tiles past the first
    `full` (the last, partial wave of programs) are split TAIL ways along K, program full + TAIL t + z computing
    slice z of tile full + t, so that the wave's programs share their work out over the SMs that would otherwise
    idle; their partials go to a compact workspace ws_ptr [tiles - full, TAIL, BLOCK_N, BLOCK_M] (cnt_ptr: one
    counter per split tile) and the last program of each adds them up. WS: warp-specialized, one more warp (the
    producer: every TMA copy, the PDL wait) fills the ring while the kernel's warpgroups (the consumers) only
    dequantize and issue wgmmas, handing each stage back through an `empty` mbarrier (half the barriers in the loop;
    setmaxnreg gives the producer 24 registers, the consumers the rest: 240 at 8 warps). PDL: the first stages' code
    bytes and (scale, zero) words are fetched before the wait for the previous kernel, x after; the next kernel may
    start once every program is past that wait (_pdl_wait; with WS the producer's). SWIGLU: W is a merged [gate; up]
    projection (N = 2 I rows) and out [M, I] = silu(gate) * up: a tile's first BLOCK_N / 2 rows are gate rows c, its
    last the up rows I + c (w_desc blocks [BLOCK_N / 2, 32]), paired in the epilogue (_wg_store). XBAR (not with
    WS): the x tiles complete on barriers of their own, so that a refill's two expects come first and its copies
    after them under one CTA barrier, instead of one barrier after each (the compiler orders operations on the same
    shared allocation, mbarriers included, with a bar.sync between them); each chunk then waits on two barriers."""
    W: gl.constexpr = gl.num_warps()
    gl.static_assert(not (WS and XBAR), "XBAR: the kernel's own TMA issue (not with WS)")
    dt: gl.constexpr = x_desc.dtype
    st: gl.constexpr = sz_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_M, 16])
    al: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    szl: gl.constexpr = gl.SliceLayout(1, al)

    pid = gl.program_id(0)
    split_tile = False
    part = 0
    if TAIL > 1:      # programs past `full`: slice `part` of tile full + (pid - full) // TAIL
        split_tile = pid >= full
        q = gl.maximum(pid - full, 0)
        part = q % TAIL
        pid = gl.where(split_tile, full + q // TAIL, pid)
    num_m = gl.cdiv(M, BLOCK_M)
    TN: gl.constexpr = BLOCK_N // 2 if SWIGLU else BLOCK_N      # output columns per tile
    up0 = N // 2 if SWIGLU else 0                                 # the first up row
    num_n = gl.cdiv(N - up0, TN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % width) % gm) * BLOCK_M
    off_n = ((pid % width) // gm) * TN

    sn = _wg_rows(off_n, up0, BLOCK_N, SWIGLU, szl) % N
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + sn.to(gl.int64) * stride_sn

    x_ring = gl.allocate_shared_memory(dt, [STAGES * KC, BLOCK_M, BK], x_desc.layout)
    c_ring = gl.allocate_shared_memory(gl.uint8, [STAGES * KC * (BITS // 4), BLOCK_N, BK // 2], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(bars.index(p), count=1)
    if XBAR:
        xbars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for p in gl.static_range(STAGES):
            mbarrier.init(xbars.index(p), count=1)
    else:
        xbars = bars

    if TAIL > 1:
        per = gl.cdiv(K // BK // KC, gl.where(split_tile, TAIL, 1)) * KC
        s0 = part * per
        steps = gl.minimum(K // BK - s0, per)
    elif SPLIT_K == 1:
        s0 = 0
        steps = K // BK
    else:
        per = gl.cdiv(K // BK // KC, SPLIT_K) * KC
        s0 = gl.program_id(1) * per
        steps = gl.minimum(K // BK - s0, per)
    if WS:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for p in gl.static_range(STAGES):
            mbarrier.init(empty.index(p), count=1)
        acc, = gl.warp_specialize([
            (_wg_loop, (None, s_p, x_desc, w_desc, x_ring, c_ring, bars, bars, empty, steps, s0, off_m, off_n, up0,
                        GROUP, INT_Z, dt, st, al, mma, STAGES, BITS, KC, SWIGLU, True, False)),
            (_wg_produce, (x_desc, w_desc, x_ring, c_ring, bars, empty, steps, s0, off_m, off_n, up0, STAGES, BITS,
                           KC, SWIGLU, PDL)),
        ], [1], [24])
        for p in gl.static_range(STAGES):
            mbarrier.invalidate(empty.index(p))
    else:
        for p in gl.static_range(STAGES):      # weights only before the wait (PDL)
            _wg_expect(x_desc, w_desc, bars, xbars, p, p * KC < steps, BITS, KC, SWIGLU, XBAR)
            _wg_issue_codes(w_desc, c_ring, bars, p, off_n, up0, (s0 + p * KC) * BK, p * KC < steps, BITS, KC,
                            SWIGLU)
        sz = _wg_sz(s_p, 0, steps, s0, GROUP)
        _pdl_wait(PDL)
        for p in gl.static_range(STAGES):
            _wg_issue_x(x_desc, x_ring, xbars, p, off_m, (s0 + p * KC) * BK, p * KC < steps, KC)
        # (no `empty` barriers without WS: bars stands in for them, unused)
        acc, = _wg_loop(sz, s_p, x_desc, w_desc, x_ring, c_ring, bars, xbars, bars, steps, s0, off_m, off_n, up0,
                        GROUP, INT_Z, dt, st, al, mma, STAGES, BITS, KC, SWIGLU, False, XBAR)
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(p))
        if XBAR:
            mbarrier.invalidate(xbars.index(p))

    if TAIL > 1:
        if split_tile:
            t = pid - full
            acc, last = _wg_tail_sum(acc, x_ring, ws_ptr + t.to(gl.int64) * (TAIL * BLOCK_N * BLOCK_M), cnt_ptr + t,
                                     part, TAIL, W)
            if last:
                _wg_store(acc, bias_ptr, out_ptr, off_m, off_n, up0, M, N, stride_om, HAS_BIAS, SWIGLU, W)
        else:
            _wg_store(acc, bias_ptr, out_ptr, off_m, off_n, up0, M, N, stride_om, HAS_BIAS, SWIGLU, W)
    elif SPLIT_K == 1:
        _wg_store(acc, bias_ptr, out_ptr, off_m, off_n, up0, M, N, stride_om, HAS_BIAS, SWIGLU, W)
    else:
        on = _wg_rows(off_n, up0, BLOCK_N, SWIGLU, gl.SliceLayout(1, mma))       # masked where past the rows
        if SWIGLU:
            ok = _wg_rows(off_n, 0, BLOCK_N, SWIGLU, gl.SliceLayout(1, mma)) < up0      # gate / up column exists
        else:
            ok = on < N
        om = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        acc, last = _splitk_fixup(acc, ws_ptr, cnt_ptr, pid, on, om, ok[:, None] & (om < M)[None, :], M, N, SPLIT_K)
        if last:
            _wg_store(acc, bias_ptr, out_ptr, off_m, off_n, up0, M, N, stride_om, HAS_BIAS, SWIGLU, W)


@gluon.jit
def _wg_tail_sum(acc, x_ring, ws_ptr, cnt_ptr, part, TAIL: gl.constexpr, W: gl.constexpr):
    """TAIL: a split tile's partial acc [BLOCK_N, BLOCK_M] (slice `part` of TAIL) added to the others through the
    compact workspace ws_ptr [TAIL, BLOCK_N * BLOCK_M] (fp32) and the tile's counter cnt_ptr (zero between
    launches, acq_rel): every program stores its partial, the last to finish adds the TAIL of them in slice order
    (deterministic) and resets the counter. The tile goes through the x ring's shared memory (idle after the
    loop; the launcher makes it hold BLOCK_N x BLOCK_M fp32), so the workspace traffic runs in row chunks of a
    plain blocked layout: never the sum beside the partial and their addresses in registers (ptxas spilled in the
    main loop when the fix-up took them in the accumulator's layout). Returns (the sum, in acc's layout; whether
    this program is the last: only then is the sum complete)."""
    BN: gl.constexpr = acc.shape[0]
    BM: gl.constexpr = acc.shape[1]
    TPM: gl.constexpr = min(32, BM // 4)                   # threads along a row, 4 consecutive fp32 each
    CH: gl.constexpr = min(BN, 16 * 32 * W // BM)          # rows per chunk: 16 values per thread
    bl: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPM, TPM], [W, 1], [1, 0])
    tile = x_ring._reinterpret(gl.float32, [BN, BM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    offs = (gl.arange(0, CH, layout=gl.SliceLayout(1, bl))[:, None] * BM
            + gl.arange(0, BM, layout=gl.SliceLayout(0, bl))[None, :])
    gl.thread_barrier()         # every warp is done with the ring
    tile.store(acc)
    gl.thread_barrier()
    mine = ws_ptr + part * (BN * BM)
    for c in gl.static_range(BN // CH):
        gl.store(mine + c * CH * BM + offs, tile.slice(c * CH, CH, dim=0).load(bl))
    gl.thread_barrier()         # the whole partial is stored before the counter says so
    done = gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    last = done == TAIL - 1
    if last:
        for c in gl.static_range(BN // CH):
            s = gl.load(ws_ptr + c * CH * BM + offs, cache_modifier=".cg")
            for sk in gl.static_range(1, TAIL):
                s += gl.load(ws_ptr + sk * (BN * BM) + c * CH * BM + offs, cache_modifier=".cg")
            tile.slice(c * CH, CH, dim=0).store(s)
        gl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
    gl.thread_barrier()
    return tile.load(acc.type.layout), last


@gluon.jit
def _wg_rows(off_n, up0, BLOCK_N: gl.constexpr, SWIGLU: gl.constexpr, layout: gl.constexpr):
    """The weight rows of a tile's BLOCK_N rows: off_n + r, or with SWIGLU gate rows off_n + r, then up rows
    up0 + off_n + r (the tile's second half)."""
    r = gl.arange(0, BLOCK_N, layout=layout)
    if SWIGLU:
        return off_n + r % (BLOCK_N // 2) + (r // (BLOCK_N // 2)) * up0
    return off_n + r


@gluon.jit
def _wg_store(acc, bias_ptr, out_ptr, off_m, off_n, up0, M, N, stride_om, HAS_BIAS: gl.constexpr,
              SWIGLU: gl.constexpr, W: gl.constexpr):
    """out.T tile [BLOCK_N, BLOCK_M] (fp32, + bias) -> out, consecutive n per thread. SWIGLU: the tile's gate and
    up halves, each rounded to out's dtype first (the bits of the product followed by silu_and_mul), are paired in
    one thread (a layout change through shared memory) and silu(gate) * up stored to columns off_n + c."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    BLOCK_M: gl.constexpr = acc.shape[1]
    ty: gl.constexpr = out_ptr.dtype.element_ty
    if HAS_BIAS:
        on = _wg_rows(off_n, up0, BLOCK_N, SWIGLU, gl.SliceLayout(1, acc.type.layout))
        acc += gl.load(bias_ptr + on % N).to(gl.float32)[:, None]
    if SWIGLU:
        HB: gl.constexpr = BLOCK_N // 2
        y = gl.permute(gl.reshape(acc.to(ty).to(gl.float32), [2, HB, BLOCK_M]), (1, 2, 0))
        y = gl.convert_layout(y, gl.BlockedLayout([4, 1, 2], [8, 4, 1], [1, W, 1], [2, 0, 1]))
        gate, up = gl.split(y)
        h = (gl.div_rn(gate, 1.0 + gl.exp(-gate)) * up).to(ty)
        on = off_n + gl.arange(0, HB, layout=gl.SliceLayout(1, h.type.layout))
        om = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, h.type.layout))
        mask = (on < up0)[:, None] & (om < M)[None, :]
        gl.store(out_ptr + om.to(gl.int64)[None, :] * stride_om + on[:, None], h, mask=mask)
    else:
        ol: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, W], [0, 1])
        y = gl.convert_layout(acc.to(ty), ol)
        on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ol))
        om = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ol))
        mask = (on < N)[:, None] & (om < M)[None, :]
        gl.store(out_ptr + om.to(gl.int64)[None, :] * stride_om + on[:, None], y, mask=mask)

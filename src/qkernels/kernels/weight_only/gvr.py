"""Gluon decode GEMV for W4A16 on Hopper with the codes streamed through a TMA ring (path "gvr", M <= 16 per x
tile pair): gvt's dequantization and products (mma.sync on in-register codes, its asm), fed by bulk copies into
shared memory instead of each lane's own loads.
Launcher: ops/weight_only/launch.py (path "gvr"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language GEMV (gemv.py) computes the same thing and is its CPU twin (Gluon has no interpreter); the tests
run this one on Hopper GPUs against the reference.

Why. gv and gvt hold their bytes in flight in registers: at 100-128 registers a SM keeps 16 one-warp programs, and
on the H200 they move 2.2-2.4 TB/s at M = 1, where cuBLAS's fp16 GEMV moves 4.1 TB/s with one CTA per SM issuing on
9% of cycles, its bytes in flight bulk copies (ncu, docs/design.md). A ring of TMA boxes streams 4.0 TB/s with 4
warps per CTA reading every box from shared memory (scripts/probe_tma_stream.py). So here:

  - persistent programs (a few per SM) walk work units (16 W weight rows x one K slice) in a flat sequence of boxes
    [16 W rows, 64 NB code bytes] (128 NB k): box i + STAGES is requested as soon as every warp has read box i,
    across unit boundaries, so the ring never drains between units;
  - the grid is a multiple of SPLIT_K, so a program keeps one K slice (its units differ in rows and x tile only)
    and every unit of it has the same number of boxes;
  - a ring stage also holds the x tile for its k (a TMA box of 8 or 16 x rows), so nothing the MMAs need waits
    on a global load but the (scale, zero) words (plain loads, one box ahead);
  - each warp reads its 16-row tile of a box from shared memory in gvt's register layout (rows g and g + 8 of
    lane (g, t), 4 words of each 128-k block: 16-byte loads), and the x words each lane multiplies them with, and
    runs gvt's asm on them;
  - a unit's sums are fixed up across the K slices by the last of its SPLIT_K programs (the workspace and tile
    counters of the other kernels, the slice index explicit) and stored with gvt's epilogue (bias; SWIGLU: rows g
    and g + 8 are gate c and up c, from two half-height boxes: gate rows into the box's first half, up rows
    into its second).
Numerics as gvt (integer zero points, products exact in fp32 sums, scale per 128-k block).
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_shared import PER_CHANNEL, _pdl_wait, _tile_sums_at
from .gvt import _axis, _gvt_epilogue, _layout, _load_sz, _mma_step, _out_index, _x_regs

BLOCK: gl.constexpr = gl.constexpr(128)       # k per block: 16 code words of a row


@gluon.constexpr_function
def _codes_layout(W, NB, SWIGLU):
    """Linear layout of a warp-shared box of code words [16 W, 16 NB] (int32) such that, reshaped to
    [W, 2, 8, NB, 4, 4] (tile, h, g, block, t, e) and permuted to (tile, g, t, block, e, h), splitting off h gives
    gvt's layout of the words of rows g (h = 0) and g + 8 (h = 1): registers e (2 bits), block, h; lanes t, g; warps
    the tile. SWIGLU: h selects the box's second half (the up rows; reshaped [2, W, 8, ...] instead) and the tiles
    are 8 rows apart."""
    nb_bits = NB.bit_length() - 1
    w_bits = W.bit_length() - 1
    tile_rows = 8 if SWIGLU else 16
    h_row = 8 * W if SWIGLU else 8
    reg = [[0, 1], [0, 2]] + [[0, 16 << b] for b in range(nb_bits)] + [[h_row, 0]]
    lane = [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]]
    warp = [[tile_rows << b, 0] for b in range(w_bits)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [16 * W, 16 * NB])


@gluon.constexpr_function
def _x_layout(W, NB, MT):
    """Linear layout of a box's x tile as 8-byte words [8 MT, 32 NB] such that, reshaped to [MT, 8, NB, 2, 2, 2, 4]
    (x tile q, g, block, t // 2, h, t % 2, e: word 32 block + 16 (t // 2) + 8 h + 4 (t % 2) + e, the words gvt's lane
    (g, t) reads at a code word's low-nibble k (h = 0) and high-nibble k (h = 1)) and permuted to
    (g, t // 2, t % 2, block, e, h, q), the splits (h, then q) leave gvt's layout: registers e, block, q, h; lanes
    t % 2, t // 2, g; every warp the same words."""
    nb_bits = NB.bit_length() - 1
    reg = [[0, 1], [0, 2]] + [[0, 32 << b] for b in range(nb_bits)] + ([[8, 0]] if MT == 2 else []) + [[0, 8]]
    lane = [[0, 4], [0, 16], [1, 0], [2, 0], [4, 0]]
    warp = [[0, 0] for _ in range(W.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [8 * MT, 32 * NB])


@gluon.jit
def _box_x(x_ring, st, W: gl.constexpr, NB: gl.constexpr, MT: gl.constexpr, L: gl.constexpr):
    """Ring stage st's x tile(s) as gvt's B registers: 4 int32 tensors [1, 8, 4, NB, 4] per x tile (MT == 1: the
    first tile's twice)."""
    xl: gl.constexpr = _x_layout(W, NB, MT)
    words = x_ring.index(st)._reinterpret(gl.int64, [8 * MT, 32 * NB], x_ring.layout).load(xl)
    w7 = gl.permute(gl.reshape(words, [MT, 8, NB, 2, 2, 2, 4]), (1, 3, 5, 2, 6, 4, 0))
    lo, hi = gl.split(gl.permute(gl.reshape(w7, [8, 4, NB, 4, 2, MT]), (0, 1, 2, 3, 5, 4)))
    if MT == 2:
        lo0, lo1 = gl.split(lo)
        hi0, hi1 = gl.split(hi)
        x0, x1, x2, x3 = _x_tile(lo0, hi0, L)
        y0, y1, y2, y3 = _x_tile(lo1, hi1, L)
    else:
        x0, x1, x2, x3 = _x_tile(gl.reshape(lo, [8, 4, NB, 4]), gl.reshape(hi, [8, 4, NB, 4]), L)
        y0, y1, y2, y3 = x0, x1, x2, x3
    return x0, x1, x2, x3, y0, y1, y2, y3


@gluon.jit
def _x_tile(lo, hi, L: gl.constexpr):
    """One x tile's 8-byte words [8, 4, NB, 4] at the low- and high-nibble k -> its B registers in layout L."""
    NB: gl.constexpr = lo.shape[2]
    lo = gl.convert_layout(gl.reshape(lo, [1, 8, 4, NB, 4]), L, assert_trivial=True)
    hi = gl.convert_layout(gl.reshape(hi, [1, 8, 4, NB, 4]), L, assert_trivial=True)
    return _x_regs(lo.to(gl.int32), (lo >> 32).to(gl.int32), hi)


@gluon.jit
def _box_codes(ring, st, W: gl.constexpr, NB: gl.constexpr, L: gl.constexpr, SWIGLU: gl.constexpr):
    """Ring stage st's code words in gvt's layout L: (rows g, rows g + 8) of each warp's tile, [W, 8, 4, NB, 4]."""
    lc: gl.constexpr = _codes_layout(W, NB, SWIGLU)
    box = ring.index(st)._reinterpret(gl.int32, [16 * W, 16 * NB], ring.layout).load(lc)
    if SWIGLU:      # rows: h (the box's half), tile, g
        six = gl.permute(gl.reshape(box, [2, W, 8, NB, 4, 4]), (1, 2, 4, 3, 5, 0))
    else:           # rows: tile, h, g
        six = gl.permute(gl.reshape(box, [W, 2, 8, NB, 4, 4]), (0, 2, 4, 3, 5, 1))
    wa, wb = gl.split(six)
    return gl.convert_layout(wa, L, assert_trivial=True), gl.convert_layout(wb, L, assert_trivial=True)


@gluon.jit
def _unit_rows(u, KS: gl.constexpr, n_rb):
    """Unit u -> (its row block, its x tile); its K slice is u mod KS, the program's own."""
    rest = u // KS
    return rest % n_rb, rest // n_rb


@gluon.jit
def _issue_codes(w_desc, x_desc, ring, bars, st, rb, kbox, up0, pred, SWIGLU: gl.constexpr):
    """Request the code box of row block rb and K box kbox into ring stage st (pred: it exists); the stage's
    barrier also expects its x tile (_issue_x)."""
    HB: gl.constexpr = w_desc.block_type.shape[0]
    BOXB: gl.constexpr = w_desc.block_type.shape[1]
    bar = bars.index(st)
    if SWIGLU:
        mbarrier.expect(bar, 2 * w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(w_desc, [rb * HB, kbox * BOXB], bar, ring.index(st).slice(0, HB, dim=0),
                                        pred=pred)
        tma.async_copy_global_to_shared(w_desc, [up0 + rb * HB, kbox * BOXB], bar,
                                        ring.index(st).slice(HB, HB, dim=0), pred=pred)
    else:
        mbarrier.expect(bar, w_desc.block_type.nbytes + x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(w_desc, [rb * HB, kbox * BOXB], bar, ring.index(st), pred=pred)


@gluon.jit
def _issue_x(x_desc, x_ring, bars, st, mt, kbox, pred):
    """Request x tile mt's rows for K box kbox into ring stage st (rows past M read as zeros)."""
    XR: gl.constexpr = x_desc.block_type.shape[0]
    XK: gl.constexpr = x_desc.block_type.shape[1]
    tma.async_copy_global_to_shared(x_desc, [mt * XR, kbox * XK], bars.index(st), x_ring.index(st), pred=pred)


@gluon.jit
def _sz_ptrs(rb, s32, stride_sn, tile, g, N, W: gl.constexpr, SWIGLU: gl.constexpr):
    """The (scale, zero) word pointers of rows g and g + 8 of row block rb (one per lane)."""
    ra, rb_ = _rows(rb, tile, g, N, W, SWIGLU)
    return s32 + ra.to(gl.int64) * stride_sn, s32 + rb_.to(gl.int64) * stride_sn


@gluon.jit
def _sz(pa, pb, kbox, K, blk, NB: gl.constexpr, GROUP: gl.constexpr):
    """K box kbox's (scale, zero) words of rows g and g + 8."""
    if GROUP == PER_CHANNEL:
        return gl.load(pa + blk * 0), gl.load(pb + blk * 0)
    k0 = kbox * (BLOCK * NB)
    return _load_sz(pa, k0, K, blk, BLOCK, GROUP, True), _load_sz(pb, k0, K, blk, BLOCK, GROUP, True)


@gluon.jit
def _rows(rb, tile, g, N, W: gl.constexpr, SWIGLU: gl.constexpr):
    """The weight rows (wrapped into [0, N): loads need no masks) of lanes' rows g and g + 8 in row block rb."""
    if SWIGLU:
        c = (rb * (8 * W) + tile * 8 + g) % (N // 2)
        return c, c + N // 2
    r = rb * (16 * W) + tile * 16 + g
    return r % N, (r + 8) % N


@gluon.jit
def _wo_gvr_kernel(w_desc, x_desc, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_sn, stride_om, ws_ptr, cnt_ptr,
                   GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, NB: gl.constexpr, STAGES: gl.constexpr,
                   MT: gl.constexpr, SPLIT_K: gl.constexpr, SWIGLU: gl.constexpr = False, PDL: gl.constexpr = False):
    """W4A16, fp16 x, integer zero points, K a multiple of 128 NB, GROUP PER_CHANNEL or a multiple of 128. w_desc: TMA
    descriptor of the code bytes [N, K / 2], blocks [16 W, 64 NB] (SWIGLU: [8 W, 64 NB], gate and up halves; rows past
    N read as zeros); x_desc: of x [M, K], blocks [8 MT, 128 NB] (rows past M read as zeros). Units: (x tile of 8 MT
    rows, row block of 16 W weight rows, K slice), the slice fastest; the grid is a multiple of SPLIT_K, program p
    takes units p, p + P, ... (so always slice p mod SPLIT_K: equal runs of cdiv(boxes, SPLIT_K) boxes, the last cut
    at K). A ring stage holds a box of codes and the x tile for its k. SPLIT_K > 1: fp32 partials in ws_ptr
    [SPLIT_K, M, N], added by the last program of the unit's tile (cnt_ptr: one counter per (x tile, row block), zero
    between launches). PDL: the first STAGES code boxes are requested before the wait for the previous kernel,
    their x tiles after."""
    W: gl.constexpr = gl.num_warps()
    L: gl.constexpr = _layout(1, NB, W)
    st_t: gl.constexpr = sz_ptr.dtype.element_ty

    pid = gl.program_id(0)
    P = gl.num_programs(0)
    up0 = N // 2 if SWIGLU else 0
    n_rb = gl.cdiv(N - up0, 8 * W if SWIGLU else 16 * W)
    units = gl.cdiv(M, 8 * MT) * n_rb * SPLIT_K
    nbox = K // (BLOCK * NB)
    per = gl.cdiv(nbox, SPLIT_K)
    ks = pid % SPLIT_K
    k_box0 = ks * per
    nb = gl.minimum(nbox - k_box0, per)          # boxes per unit (>= 1: the launcher leaves no slice empty)
    mine = gl.cdiv(units - pid, P)               # units of this program (>= 1: the grid is at most the units)

    ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 16 * W, 64 * NB], w_desc.layout)
    x_ring = gl.allocate_shared_memory(gl.float16, [STAGES, 8 * MT, BLOCK * NB], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    # the producer's cursor: unit pj (row block prb, x tile pmt), box pb of it. The first STAGES code boxes before
    # the wait (PDL), their x tiles after it (the same cursor run again)
    pj = 0
    pb = 0
    prb, pmt = _unit_rows(pid, SPLIT_K, n_rb)
    for s in gl.static_range(STAGES):
        _issue_codes(w_desc, x_desc, ring, bars, s, prb, k_box0 + pb, up0, pj < mine, SWIGLU)
        pb += 1
        if pb == nb:
            pb = 0
            pj += 1
            prb, pmt = _unit_rows(pid + pj * P, SPLIT_K, n_rb)

    tile = _axis(W, 0, L)
    g = _axis(8, 1, L)
    t = _axis(4, 2, L)
    blk = _axis(NB, 3, L)
    e = _axis(4, 4, L)
    s32 = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    rb, mt = _unit_rows(pid, SPLIT_K, n_rb)
    pa, pb_ = _sz_ptrs(rb, s32, stride_sn, tile, g, N, W, SWIGLU)
    sa, sb = _sz(pa, pb_, k_box0, K, blk, NB, GROUP)
    _pdl_wait(PDL)
    xj = 0
    xb = 0
    xmt = mt
    for s in gl.static_range(STAGES):
        _issue_x(x_desc, x_ring, bars, s, xmt, k_box0 + xb, xj < mine)
        xb += 1
        if xb == nb:
            xb = 0
            xj += 1
            xmt = _unit_rows(pid + xj * P, SPLIT_K, n_rb)[1]
    i = 0
    for j in range(mine):
        rbn, mtn = _unit_rows(pid + (j + 1) * P, SPLIT_K, n_rb)     # the next unit's (past the last: unused)
        qa, qb = _sz_ptrs(rbn, s32, stride_sn, tile, g, N, W, SWIGLU)
        acc0 = gl.zeros([W, 8, 4, NB, 4], gl.float32, layout=L)
        acc1 = acc0
        for b in range(nb):
            st = i % STAGES
            mbarrier.wait(bars.index(st), (i // STAGES) & 1)
            wa, wb = _box_codes(ring, st, W, NB, L, SWIGLU)
            x0, x1, x2, x3, y0, y1, y2, y3 = _box_x(x_ring, st, W, NB, MT, L)
            gl.thread_barrier()          # every warp has read stage st: refill it
            _issue_codes(w_desc, x_desc, ring, bars, st, prb, k_box0 + pb, up0, pj < mine, SWIGLU)
            _issue_x(x_desc, x_ring, bars, st, pmt, k_box0 + pb, pj < mine)
            pb += 1
            if pb == nb:
                pb = 0
                pj += 1
                prb, pmt = _unit_rows(pid + pj * P, SPLIT_K, n_rb)
            # the next box's (scale, zero) words, loaded while this one's MMAs run (past the unit's last box: the
            # next unit's first)
            nu = b + 1 == nb
            sa2, sb2 = _sz(gl.where(nu, qa, pa), gl.where(nu, qb, pb_), k_box0 + gl.where(nu, 0, b + 1), K, blk, NB,
                           GROUP)
            acc0, acc1 = _mma_step(acc0, acc1, wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3, e, st_t, 4, MT)
            sa, sb = sa2, sb2
            i += 1
        _unit_out(acc0, acc1, ws_ptr, cnt_ptr, bias_ptr, out_ptr, stride_om, rb, mt, ks, n_rb, tile, g, t, e, M, N,
                  HAS_BIAS, W, MT, SPLIT_K, SWIGLU)
        rb = rbn
        mt = mtn
        pa, pb_ = qa, qb
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))


@gluon.jit
def _unit_out(acc0, acc1, ws_ptr, cnt_ptr, bias_ptr, out_ptr, stride_om, rb, mt, ks, n_rb, tile, g, t, e, M, N,
              HAS_BIAS: gl.constexpr, W: gl.constexpr, MT: gl.constexpr, SPLIT_K: gl.constexpr, SWIGLU: gl.constexpr):
    """A unit's sums (element (tile, g, t, e): weight row g (e < 2) or g + 8 of the tile, x row 2 t + e % 2 of the
    x tile), fixed up across the K slices, then stored by gvt's epilogue."""
    if SWIGLU:
        col = rb * (8 * W) + tile * 8 + g
        row_a = col
        row_b = col + N // 2
    else:
        row_a = rb * (16 * W) + tile * 16 + g
        row_b = row_a + 8
    row, tok, ok_row, e4 = _out_index(row_a, row_b, t, e, mt * (8 * MT), N, SWIGLU)
    out0, out1, last = _tile_sums_at(acc0, acc1, ws_ptr, cnt_ptr, mt * n_rb + rb, ks, tok, row, ok_row, M, N, MT,
                                     SPLIT_K)
    if last:
        _gvt_epilogue(out0, out1, bias_ptr, out_ptr, stride_om, tok, row, ok_row, e4, M, N, HAS_BIAS, MT, SWIGLU)

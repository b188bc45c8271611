"""Gluon decode GEMV for W4A16 / W8A16 on tensor cores (M <= 16): gv's explicit layouts, the products in mma.sync.
Launcher: ops/weight_only/launch.py (path "gvt"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language GEMV (gemv.py) and tensor-core GEMM (mm.py) compute the same thing and are its CPU twins
(Gluon has no interpreter); the tests run this one on GPUs against the reference.

Why. gv spends 3.07 instructions per weight in its loop (~0.9 of them on the products and their sums), and on the
H200 it looks issue-bound below the memory bandwidth (docs/design/weight-only.md). Here the products go to the tensor
cores, which also serve M = 2..16 at about the cost of M = 1 (the dequantization is shared by all rows of x):

  out.T = W @ x.T with mma.sync m16n8k16 (fp16 operands, exact products, fp32 sums): A = a 16-row weight tile,
  B = up to 8 rows of x (a second set of MMAs on the same A for x rows 8..15, MT = 2).

A lane (g, t) (g = lane / 4, t = lane % 4) holds the A fragments of rows g and g + 8 and the B fragments of x row
g. It loads 4 consecutive code words (one 16-byte load) per row and 128-k block: the 4 lanes of a quad cover the
block's 16 words. The order in which k is summed is free, as long as A and B follow the same one, so each word's
nibbles go to the A registers as lop3 leaves them (the pairs (low nibble of byte 0, of byte 2), (high nibble of
byte 0, of byte 2), and the same for bytes 1 and 3), and x (read as 8-byte words: a word's 4 low-nibble k, and its
4 high-nibble k) is permuted to match with one prmt per register.
Per code word: 4 lop3 + 1 shift (1024 + u and 1024 + 16 u as fp16 pairs), 4 paired fp16 operations that leave
u - z exactly ((1024 + u) - (1024 + z) and (1024 + 16 u) / 16 - (64 + z)), and half an MMA. In the loop (offline
SASS, sm_90, groups of 128): 2.1 instructions per weight with two 16-row tiles per thread, 1.8 with four (gv:
3.07), 1.1 of them the conversion; 2.6 with two x tiles (M = 9..16) for twice the rows of x. PAIRS (two steps per
loop iteration, each in its own registers) drops the register copies ptxas puts around a loop-carried prefetch:
1.9 / 1.7 per weight, at 128 / 172 registers instead of 100 / 136. With fp16 scales the asm takes each row's
(1024 + z) pair from its (scale, zero) word itself (a prmt and an add).

8-bit codes (BITS = 8; the PackedWeight layout is plain bytes along k): a block is 64 k, a word's bytes k, k + 1
and k + 2, k + 3 become fp16 pairs 1024 + u by one prmt each (the exponent byte of 1024 beside each code byte),
then (1024 + u) - (1024 + z); x pairs come in their natural order. One MMA per word and row pair: 1.6
instructions per weight (offline SASS, per channel, two tiles), so per byte a third of the 4-bit kernel's.

Numerics: the MMA multiplies u - z (an integer in [-16, 15]; 8-bit [-256, 255]) by x exactly and sums in fp32; the scale is applied
per 128-k block and row in fp32. So integer zero points only (PackedWeight.int_zeros: symmetric, GPTQ, AWQ and
round-to-nearest weights); others run the config's fallback. Not bit-identical to the reference (summation order),
within the weight-only tolerance.

Layout [TILES, 8, 4, NB, 4]: 16-row tiles (TILES / num_warps per thread, warps along them), the lane group g, the
lane t of the quad, the step's NB = WPT / 4 blocks (128 k; 8-bit 64), and a thread's 4 words of a block (the asm's
pack). One asm instance takes those 4 words of rows g and g + 8 and chains 8 MMAs (8-bit 4; twice that with
MT = 2); its 4 outputs per
x tile are the accumulator fragment (rows g, g, g + 8, g + 8; x rows 2 t, 2 t + 1, 2 t, 2 t + 1).
SWIGLU: rows g and g + 8 of a tile are gate c and up c of a merged [gate; up] projection, so silu(gate) * up is
in the thread. SPLIT_K > 1: the slices' fp32 partials are added by the last program of each output tile.
Hopper: programmatic dependent launch, the first step's codes and scales fetched before the wait.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .gluon_shared import PER_CHANNEL, _k_slice, _pdl_wait, _tile_sums



def _mma_asm(mt: int, bits: int, z_word: bool) -> str:
    """PTX: one block of rows g and g + 8 for mt x tiles (4-bit: 128 k, 8-bit: 64 k). Operands: the outputs (4 per x
    tile: the accumulator fragment), then 4 elements each of: the words of row g, of row g + 8, the (1024 + z) pairs
    of the two rows (z_word: the rows' (scale, zero) words with fp16 halves, from which the asm makes them), and per
    x tile the B registers (b0 / b1 of MMA j = 0 and j = 1; 8-bit: one MMA per word, its b0 / b1 first)."""
    n_out = 4 * mt
    wa, wb, za, zb = n_out, n_out + 4, n_out + 8, n_out + 12
    xb = n_out + 16                                   # per x tile: 4 registers, 4 elements each
    # one x tile: two accumulators (words e = 0, 2 and e = 1, 3), added at the end, so that the asm has two chains
    # of MMAs, as with two x tiles (one chain each)
    nacc = 2 if mt == 1 else 1
    d = [[[f"d{q}{c}{i}" for i in range(4)] for c in range(nacc)] for q in range(mt)]
    lines = [".reg .b32 pa0, pa1, pa2, pa3, pb0, pb1, pb2, pb3, ta, tb, zla, zlb, zha, zhb, m1, c960, s16, mg;",
             ".reg .f32 " + ", ".join(v for q in d for c in q for v in c) + ";",
             "mov.b32 m1, 0xBC00BC00;", "mov.b32 c960, 0x63806380;", "mov.b32 s16, 0x2C002C00;",
             "mov.b32 mg, 0x64646464;"]
    if z_word:    # the zero point (the word's high half) in both halves, plus 1024: exact for integer z
        lines += [".reg .b32 k1024;", "mov.b32 k1024, 0x64006400;",
                  f"prmt.b32 zla, ${za}, ${za}, 0x3232;", f"prmt.b32 zlb, ${zb}, ${zb}, 0x3232;",
                  "add.f16x2 zla, zla, k1024;", "add.f16x2 zlb, zlb, k1024;"]
    else:
        lines += [f"mov.b32 zla, ${za};", f"mov.b32 zlb, ${zb};"]
    lines += [
             # -(64 + z) = (1024 + z) * -1 + 960, exactly
             "fma.rn.f16x2 zha, zla, m1, c960;", "fma.rn.f16x2 zhb, zlb, m1, c960;"]
    lines += [f"mov.f32 {v}, 0f00000000;" for q in d for c in q for v in c]
    for e in range(4):
        if bits == 4:
            lines += [
                f"lop3.b32 pa0, ${wa + e}, 0x000F000F, 0x64006400, 0xEA;",
                f"lop3.b32 pa1, ${wa + e}, 0x00F000F0, 0x64006400, 0xEA;",
                f"shr.u32 ta, ${wa + e}, 8;",
                "lop3.b32 pa2, ta, 0x000F000F, 0x64006400, 0xEA;",
                "lop3.b32 pa3, ta, 0x00F000F0, 0x64006400, 0xEA;",
                f"lop3.b32 pb0, ${wb + e}, 0x000F000F, 0x64006400, 0xEA;",
                f"lop3.b32 pb1, ${wb + e}, 0x00F000F0, 0x64006400, 0xEA;",
                f"shr.u32 tb, ${wb + e}, 8;",
                "lop3.b32 pb2, tb, 0x000F000F, 0x64006400, 0xEA;",
                "lop3.b32 pb3, tb, 0x00F000F0, 0x64006400, 0xEA;",
                "sub.f16x2 pa0, pa0, zla;", "sub.f16x2 pa2, pa2, zla;",
                "fma.rn.f16x2 pa1, pa1, s16, zha;", "fma.rn.f16x2 pa3, pa3, s16, zha;",
                "sub.f16x2 pb0, pb0, zlb;", "sub.f16x2 pb2, pb2, zlb;",
                "fma.rn.f16x2 pb1, pb1, s16, zhb;", "fma.rn.f16x2 pb3, pb3, s16, zhb;",
            ]
            mmas = [("{pa0, pb0, pa1, pb1}", 0, 1), ("{pa2, pb2, pa3, pb3}", 2, 3)]
        else:    # bytes k, k + 1 and k + 2, k + 3 under the exponent byte of 1024: 1024 + u as fp16 pairs
            lines += [
                f"prmt.b32 pa0, ${wa + e}, mg, 0x4140;", f"prmt.b32 pa1, ${wa + e}, mg, 0x4342;",
                f"prmt.b32 pb0, ${wb + e}, mg, 0x4140;", f"prmt.b32 pb1, ${wb + e}, mg, 0x4342;",
                "sub.f16x2 pa0, pa0, zla;", "sub.f16x2 pa1, pa1, zla;",
                "sub.f16x2 pb0, pb0, zlb;", "sub.f16x2 pb1, pb1, zlb;",
            ]
            mmas = [("{pa0, pb0, pa1, pb1}", 0, 1)]
        for q in range(mt):
            acc = "{" + ", ".join(d[q][e % nacc]) + "}"
            for a, r0, r1 in mmas:
                b0, b1 = f"${xb + 16 * q + 4 * r0 + e}", f"${xb + 16 * q + 4 * r1 + e}"
                lines.append(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {acc}, {a}, {{{b0}, {b1}}}, {acc};")
    lines += [f"add.f32 ${4 * q + i}, {d[q][0][i]}, {d[q][1][i]};" if nacc == 2
              else f"mov.f32 ${4 * q + i}, {d[q][0][i]};" for q in range(mt) for i in range(4)]
    return "{\n" + "\n".join(lines) + "\n}"


# by x tiles (1, 2), bits (4, 8) and whether the zero points come as (scale, zero) words with fp16 halves
_MMA1: gl.constexpr = gl.constexpr(_mma_asm(1, 4, False))
_MMA2: gl.constexpr = gl.constexpr(_mma_asm(2, 4, False))
_MMA1_8: gl.constexpr = gl.constexpr(_mma_asm(1, 8, False))
_MMA2_8: gl.constexpr = gl.constexpr(_mma_asm(2, 8, False))
_MMA1_W: gl.constexpr = gl.constexpr(_mma_asm(1, 4, True))
_MMA2_W: gl.constexpr = gl.constexpr(_mma_asm(2, 4, True))
_MMA1_8W: gl.constexpr = gl.constexpr(_mma_asm(1, 8, True))
_MMA2_8W: gl.constexpr = gl.constexpr(_mma_asm(2, 8, True))
_MMA1_C: gl.constexpr = gl.constexpr(",".join(["=f"] * 4 + ["r"] * 32))
_MMA2_C: gl.constexpr = gl.constexpr(",".join(["=f"] * 8 + ["r"] * 48))
# x words (k, k + 1), (k + 2, k + 3) of a word's low nibbles and the same of its high nibbles -> the B registers
# (k, k + 2), (k + 32, k + 34), (k + 1, k + 3), (k + 33, k + 35): b0 / b1 of MMA j = 0 and j = 1
_XPERM: gl.constexpr = gl.constexpr("prmt.b32 $0, $4, $5, 0x5410; prmt.b32 $1, $6, $7, 0x5410; "
                                    "prmt.b32 $2, $4, $5, 0x7632; prmt.b32 $3, $6, $7, 0x7632;")


@gluon.constexpr_function
def _layout(TPT, NB, num_warps):
    """[TILES, 8, 4, NB, 4]: see the module docstring. Lanes: t the fastest (the MMA's quad), then g."""
    return gl.BlockedLayout([TPT, 1, 1, NB, 4], [1, 8, 4, 1, 1], [num_warps, 1, 1, 1, 1], [4, 3, 2, 1, 0])


@gluon.constexpr_function
def _axis_layout(dim, L):
    """The 1-d layout of axis dim of the 5-d layout L: L with the other axes sliced off, the highest first, so
    expand_dims at 0, 1, .. (skipping dim) rebuilds L."""
    for d in reversed([d for d in range(5) if d != dim]):
        L = gl.SliceLayout(d, L)
    return L


@gluon.jit
def _axis(n: gl.constexpr, dim: gl.constexpr, L: gl.constexpr):
    """arange(n) along dim of the 5-d layout L, expanded to rank 5 (size 1 elsewhere)."""
    a = gl.arange(0, n, layout=_axis_layout(dim, L))
    for d in gl.static_range(5):
        if d != dim:
            a = gl.expand_dims(a, d)
    return a


@gluon.jit
def _step_mask(in_k, live, EVEN_K: gl.constexpr):
    """A step's load mask: in_k (the elements before K) unless EVEN_K, and live (a scalar) unless None."""
    if live is None:
        ok = in_k
    elif EVEN_K:
        ok = live
    else:
        ok = in_k & live
    return ok


@gluon.jit
def _load_codes(p, k0, K, okc, BITS: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """One step's code words of one row set (16-byte loads, streamed past L1); not EVEN_K: 64-k units past K as 0.
    live (a scalar): False for a step past the slice's end, whose address wraps in bounds and which loads nothing."""
    if EVEN_K and live is None:
        w = gl.load(p + k0 // (32 // BITS), cache_modifier=".cg")
    else:
        w = gl.load(p + k0 // (32 // BITS), mask=_step_mask(k0 + okc < K, live, EVEN_K), other=0,
                    cache_modifier=".cg")
    return w


@gluon.jit
def _copy_codes(slot, p, k0, K, okc, BITS: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """_load_codes into a shared-memory slot by async copies (each thread its own 16 bytes; not EVEN_K: 64-k units
    past K as zeros; not live: nothing copied); the caller commits the group."""
    if EVEN_K and live is None:
        async_copy.async_copy_global_to_shared(slot, p + k0 // (32 // BITS), cache_modifier=".cg")
    else:
        async_copy.async_copy_global_to_shared(slot, p + k0 // (32 // BITS),
                                               mask=_step_mask(k0 + okc < K, live, EVEN_K), cache_modifier=".cg")


@gluon.constexpr_function
def _ring_layout():
    """A ring slot [TILES, 8, 4, NB, 4] of code words: a thread's 4 words (e) contiguous, then the lanes (t, g), the
    tiles and the blocks: each thread's 16 bytes next to its neighbours' (async copies and reads without bank
    conflicts)."""
    return gl.SwizzledSharedLayout(1, 1, 1, [4, 2, 1, 0, 3])


@gluon.jit
def _load_sz(p, k0, K, blk, BLOCK: gl.constexpr, GROUP: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """The (scale, zero) words of one row set for the step's blocks [.., NB, 1]; not EVEN_K: blocks past K (whose
    group may lie past the row's last) as 0 (scale 0: their codes and x are masked to 0 too); not live: nothing."""
    k = k0 + blk * BLOCK
    if EVEN_K and live is None:
        sz = gl.load(p + k // GROUP)
    else:
        sz = gl.load(p + k // GROUP, mask=_step_mask(k < K, live, EVEN_K), other=0)
    return sz


@gluon.jit
def _load_x(p, k0, K, xm, okc, BITS: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """One x tile's B registers for a step: 4 int32 tensors [1, 8, 4, NB, 4] (4-bit: b0 j0, b1 j0, b0 j1, b1 j1;
    8-bit: b0, b1, and the same again). xm: the lane group's x row exists; not EVEN_K: 64-k units past K read as
    zeros; not live: nothing read."""
    ok = xm
    if not EVEN_K:
        ok = ok & (k0 + okc < K)
    if live is not None:
        ok = ok & live
    lo = gl.load(p + k0 // 4, mask=ok, other=0)            # x[k .. k + 3], 8 bytes (4-bit: and x[k + 32 .. k + 35])
    lo1 = (lo >> 32).to(gl.int32)
    lo = lo.to(gl.int32)
    if BITS == 8:
        return lo, lo1, lo, lo1
    return _x_regs(lo, lo1, gl.load(p + k0 // 4 + 8, mask=ok, other=0))


@gluon.jit
def _x_regs(lo, lo1, hi):
    """4-bit: the B registers of a step from x's 8-byte words at a code word's low-nibble k (lo, as its low and high
    halves lo and lo1) and high-nibble k (hi)."""
    hi1 = (hi >> 32).to(gl.int32)
    hi = hi.to(gl.int32)
    return gl.inline_asm_elementwise(asm=_XPERM, constraints="=r,=r,=r,=r,r,r,r,r", args=[lo, lo1, hi, hi1],
                                     dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _zero_pairs(sz, st: gl.constexpr):
    """(scale, zero) words -> (1024 + z) as an fp16 pair (exact for integer z in [0, 2**BITS])."""
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32) + 1024.0
    h = z.to(gl.float16).to(gl.uint16, bitcast=True).to(gl.int32)
    return h | (h << 16)


@gluon.jit
def _scales(sz, st: gl.constexpr):
    return (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)


@gluon.jit
def _fetch(wa_p, wb_p, sa_p, sb_p, x0_p, x1_p, k0, K, okc, blk, xm0, xm1, sa, sb, BITS: gl.constexpr,
           BLOCK: gl.constexpr, GROUP: gl.constexpr, MT: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """One step's operands: the code words of both row sets, their (scale, zero) words (per channel: sa, sb as
    they are) and the B registers of each x tile (MT == 1: the first tile's twice). Not live: nothing loaded."""
    wa = _load_codes(wa_p, k0, K, okc, BITS, EVEN_K, live)
    wb = _load_codes(wb_p, k0, K, okc, BITS, EVEN_K, live)
    sa, sb, x0, x1, x2, x3, y0, y1, y2, y3 = _fetch_sx(sa_p, sb_p, x0_p, x1_p, k0, K, okc, blk, xm0, xm1, sa, sb,
                                                       BITS, BLOCK, GROUP, MT, EVEN_K, live)
    return wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3


@gluon.jit
def _fetch_sx(sa_p, sb_p, x0_p, x1_p, k0, K, okc, blk, xm0, xm1, sa, sb, BITS: gl.constexpr, BLOCK: gl.constexpr,
              GROUP: gl.constexpr, MT: gl.constexpr, EVEN_K: gl.constexpr, live=None):
    """_fetch without the code words (the ring brings them)."""
    if GROUP != PER_CHANNEL:
        sa = _load_sz(sa_p, k0, K, blk, BLOCK, GROUP, EVEN_K, live)
        sb = _load_sz(sb_p, k0, K, blk, BLOCK, GROUP, EVEN_K, live)
    x0, x1, x2, x3 = _load_x(x0_p, k0, K, xm0, okc, BITS, EVEN_K, live)
    y0, y1, y2, y3 = x0, x1, x2, x3
    if MT == 2:
        y0, y1, y2, y3 = _load_x(x1_p, k0, K, xm1, okc, BITS, EVEN_K, live)
    return sa, sb, x0, x1, x2, x3, y0, y1, y2, y3


@gluon.jit
def _mma_step(acc0, acc1, wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3, e, st: gl.constexpr, BITS: gl.constexpr,
              MT: gl.constexpr):
    """acc + s (sum over the step's blocks of (u - z) x) for each x tile (MT == 1: acc1 as it is)."""
    s = gl.where(e < 2, _scales(sa, st), _scales(sb, st))
    if st == gl.float16:    # the asm takes the zero points from the words
        za = sa
        zb = sb
        asm1: gl.constexpr = _MMA1_W if BITS == 4 else _MMA1_8W
        asm2: gl.constexpr = _MMA2_W if BITS == 4 else _MMA2_8W
    else:
        za = _zero_pairs(sa, st)
        zb = _zero_pairs(sb, st)
        asm1: gl.constexpr = _MMA1 if BITS == 4 else _MMA1_8
        asm2: gl.constexpr = _MMA2 if BITS == 4 else _MMA2_8
    if MT == 1:
        d = gl.inline_asm_elementwise(asm=asm1, constraints=_MMA1_C, args=[wa, wb, za, zb, x0, x1, x2, x3],
                                      dtype=gl.float32, is_pure=True, pack=4)
        acc0 += s * d
    else:
        d0, d1 = gl.inline_asm_elementwise(asm=asm2, constraints=_MMA2_C,
                                           args=[wa, wb, za, zb, x0, x1, x2, x3, y0, y1, y2, y3],
                                           dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        acc0 += s * d0
        acc1 += s * d1
    return acc0, acc1


@gluon.jit
def _wo_gvt_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K,
                   stride_xm, stride_wn, stride_sn, stride_om, ws_ptr, cnt_ptr,
                   GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, TILES: gl.constexpr, WPT: gl.constexpr,
                   MT: gl.constexpr, SPLIT_K: gl.constexpr, EVEN_K: gl.constexpr, SWIGLU: gl.constexpr = False,
                   PAIRS: gl.constexpr = False, BITS: gl.constexpr = 4, PDL: gl.constexpr = False,
                   STAGES: gl.constexpr = 1):
    """W4A16, fp16 x, integer zero points, K a multiple of 64 (EVEN_K: of 32 WPT), GROUP PER_CHANNEL or a
    multiple of 128. Program (n, k-slice, m): TILES 16-row tiles (SWIGLU: 8 gate rows and their 8 up rows each),
    8 MT rows of x. PAIRS: two steps per loop iteration. STAGES > 1 (not with PAIRS): the code words stream
    through a shared-memory ring of async copies STAGES - 1 steps ahead instead of registers one step ahead (each
    thread reads back only the words it copied: no barrier); the (scale, zero) words and x stay a step ahead in
    registers. SPLIT_K > 1: program column z
    covers slice z of K (whole steps) and writes its fp32 partials to ws_ptr [SPLIT_K, M, N]; the tile's last
    program adds them up (cnt_ptr: one int32 counter per (n, m) program, zero between launches)."""
    W: gl.constexpr = gl.num_warps()
    NB: gl.constexpr = WPT // 4
    BLOCK: gl.constexpr = 16 * (32 // BITS)            # k per block: 16 words of a row (4-bit: 128, 8-bit: 64)
    STEP: gl.constexpr = NB * BLOCK
    L: gl.constexpr = _layout(TILES // W, NB, W)
    st: gl.constexpr = sz_ptr.dtype.element_ty

    pid_n = gl.program_id(0)
    m0 = gl.program_id(2) * (8 * MT)
    tile = _axis(TILES, 0, L)
    g = _axis(8, 1, L)
    t = _axis(4, 2, L)
    blk = _axis(NB, 3, L)
    e = _axis(4, 4, L)
    if SWIGLU:    # rows a: gate c, rows b: up c
        col = pid_n * (8 * TILES) + tile * 8 + g                      # [TILES, 8, 1, 1, 1]
        row_a = col
        row_b = col + N // 2
        ra = (col % (N // 2)).to(gl.int64)                            # wrapped: no row masks on loads
        rb = ra + N // 2
    else:
        row_a = pid_n * (16 * TILES) + tile * 16 + g
        row_b = row_a + 8
        ra = (row_a % N).to(gl.int64)
        rb = (row_b % N).to(gl.int64)
    wi = blk * 16 + t * 4 + e                                         # the step's word [1, 1, 4, NB, 4]
    okc = (wi * (32 // BITS) // 64) * 64                              # its 64-k unit's first k, from the step's
    # the launcher guarantees 16-byte aligned code and x rows
    w32 = w_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    wa_p = w32 + ra * gl.multiple_of(stride_wn // 4, 4) + wi
    wb_p = w32 + rb * gl.multiple_of(stride_wn // 4, 4) + wi
    s32 = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    sa_p = s32 + ra * stride_sn
    sb_p = s32 + rb * stride_sn
    # x as 8-byte words (rows 16-byte aligned: the launcher copies x otherwise) from word wi's first k: 4-bit
    # 64 c + 4 i (its low nibbles; the high ones 32 on), 8-bit 4 wi
    x64 = x_ptr.to(gl.pointer_type(gl.int64), bitcast=True)
    if BITS == 4:
        xw = wi + 8 * (wi // 8)
    else:
        xw = wi
    x0_p = x64 + (m0 + g).to(gl.int64) * (stride_xm // 4) + xw
    xm0 = (m0 + g) < M
    x1_p = x64 + (m0 + 8 + g).to(gl.int64) * (stride_xm // 4) + xw   # the second x tile's (MT == 2)
    xm1 = (m0 + 8 + g) < M

    k_lo, k_hi = _k_slice(K, STEP, SPLIT_K)      # slices of whole steps

    acc0 = gl.zeros([TILES, 8, 4, NB, 4], gl.float32, layout=L)
    acc1 = acc0                                                       # MT == 2: the second x tile's
    # each step's operands are loaded a step ahead of its MMAs (STAGES > 1: the codes STAGES - 1 steps ahead, in
    # the ring). A step past the slice's end loads nothing: its loads are masked off (live), their addresses those
    # of the first step (in bounds). Stopping the loop a step short instead, as gv does, costs gvt ~70 registers.
    if STAGES > 1:
        ring_a = gl.allocate_shared_memory(gl.int32, [STAGES, TILES, 8, 4, NB, 4], _ring_layout())
        ring_b = gl.allocate_shared_memory(gl.int32, [STAGES, TILES, 8, 4, NB, 4], _ring_layout())
        for j in gl.static_range(STAGES - 1):
            kj = k_lo + j * STEP
            live = kj < k_hi
            kj = gl.where(live, kj, k_lo)
            _copy_codes(ring_a.index(j), wa_p, kj, K, okc, BITS, EVEN_K, live)
            _copy_codes(ring_b.index(j), wb_p, kj, K, okc, BITS, EVEN_K, live)
            async_copy.commit_group()
    else:
        wa, wb = _load_codes(wa_p, k_lo, K, okc, BITS, EVEN_K), _load_codes(wb_p, k_lo, K, okc, BITS, EVEN_K)
    if GROUP == PER_CHANNEL:    # one word per row, for every step
        sa, sb = gl.load(sa_p + blk * 0), gl.load(sb_p + blk * 0)
    else:
        sa, sb = (_load_sz(sa_p, k_lo, K, blk, BLOCK, GROUP, EVEN_K),
                  _load_sz(sb_p, k_lo, K, blk, BLOCK, GROUP, EVEN_K))
    _pdl_wait(PDL)
    x0, x1, x2, x3 = _load_x(x0_p, k_lo, K, xm0, okc, BITS, EVEN_K)
    y0, y1, y2, y3 = x0, x1, x2, x3
    if MT == 2:
        y0, y1, y2, y3 = _load_x(x1_p, k_lo, K, xm1, okc, BITS, EVEN_K)
    if PAIRS:
        # two steps per iteration, each step's operands in their own registers: each load lands in registers
        # whose last use has been, so nothing is copied around the loop (more registers live)
        for k0 in range(k_lo, k_hi, 2 * STEP):
            kb = k0 + STEP
            b_ok = kb < k_hi
            kb = gl.where(b_ok, kb, k_lo)
            wa2, wb2, sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3 = _fetch(
                wa_p, wb_p, sa_p, sb_p, x0_p, x1_p, kb, K, okc, blk, xm0, xm1, sa, sb, BITS, BLOCK, GROUP, MT, EVEN_K,
                b_ok)
            acc0, acc1 = _mma_step(acc0, acc1, wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3, e, st, BITS, MT)
            ka = k0 + 2 * STEP
            a_ok = ka < k_hi
            ka = gl.where(a_ok, ka, k_lo)
            wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3 = _fetch(
                wa_p, wb_p, sa_p, sb_p, x0_p, x1_p, ka, K, okc, blk, xm0, xm1, sa2, sb2, BITS, BLOCK, GROUP, MT, EVEN_K,
                a_ok)
            if b_ok:
                acc0, acc1 = _mma_step(acc0, acc1, wa2, wb2, sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3, e, st, BITS,
                                       MT)
    elif STAGES > 1:
        for k0 in range(k_lo, k_hi, STEP):
            it = (k0 - k_lo) // STEP
            kf = k0 + (STAGES - 1) * STEP
            f_ok = kf < k_hi
            kf = gl.where(f_ok, kf, k_lo)
            _copy_codes(ring_a.index((it + STAGES - 1) % STAGES), wa_p, kf, K, okc, BITS, EVEN_K, f_ok)
            _copy_codes(ring_b.index((it + STAGES - 1) % STAGES), wb_p, kf, K, okc, BITS, EVEN_K, f_ok)
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            wa = ring_a.index(it % STAGES).load(L)
            wb = ring_b.index(it % STAGES).load(L)
            k1 = k0 + STEP
            live = k1 < k_hi
            k1 = gl.where(live, k1, k_lo)
            sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3 = _fetch_sx(
                sa_p, sb_p, x0_p, x1_p, k1, K, okc, blk, xm0, xm1, sa, sb, BITS, BLOCK, GROUP, MT, EVEN_K, live)
            acc0, acc1 = _mma_step(acc0, acc1, wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3, e, st, BITS, MT)
            sa, sb, x0, x1, x2, x3, y0, y1, y2, y3 = sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3
        async_copy.wait_group(0)
    else:
        for k0 in range(k_lo, k_hi, STEP):
            k1 = k0 + STEP
            live = k1 < k_hi
            k1 = gl.where(live, k1, k_lo)
            wa2, wb2, sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3 = _fetch(
                wa_p, wb_p, sa_p, sb_p, x0_p, x1_p, k1, K, okc, blk, xm0, xm1, sa, sb, BITS, BLOCK, GROUP, MT, EVEN_K,
                live)
            acc0, acc1 = _mma_step(acc0, acc1, wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3, e, st, BITS, MT)
            wa, wb, sa, sb, x0, x1, x2, x3, y0, y1, y2, y3 = wa2, wb2, sa2, sb2, u0, u1, u2, u3, v0, v1, v2, v3

    row, tok, ok_row, e4 = _out_index(row_a, row_b, t, e, m0, N, SWIGLU)
    out0, out1, last = _tile_sums(acc0, acc1, ws_ptr, cnt_ptr, pid_n, tok, row, ok_row, M, N, MT, SPLIT_K)
    if last:
        _gvt_epilogue(out0, out1, bias_ptr, out_ptr, stride_om, tok, row, ok_row, e4, M, N, HAS_BIAS, MT, SWIGLU)


@gluon.jit
def _out_index(row_a, row_b, t, e, m0, N, SWIGLU: gl.constexpr):
    """Where the summed accumulators' elements go: element (tile, g, t, e) of [TILES, 8, 4, 4] is weight row a
    (e < 2) or b and x row m0 (+ 8 for the second x tile) + 2 t + e % 2. Returns (row, tok, ok_row: the row exists
    (SWIGLU: gate c and up c for c < N / 2), e4 [1, 1, 1, 4])."""
    e4 = gl.sum(e, axis=3)                                            # [1, 1, 1, 4]
    t4 = gl.sum(t, axis=3)                                            # [1, 1, 4, 1]
    row = gl.where(e4 < 2, gl.sum(row_a, axis=3), gl.sum(row_b, axis=3)) + 0 * t4      # [TILES, 8, 4, 4]
    tok = m0 + 2 * t4 + e4 % 2 + 0 * row
    if SWIGLU:
        ok_row = gl.sum(row_a, axis=3) + 0 * row < N // 2
    else:
        ok_row = row < N
    return row, tok, ok_row, e4


@gluon.jit
def _gvt_epilogue(out0, out1, bias_ptr, out_ptr, stride_om, tok, row, ok_row, e4, M, N, HAS_BIAS: gl.constexpr,
                  MT: gl.constexpr, SWIGLU: gl.constexpr):
    """The complete sums (after any split-K fix-up): bias added once, then stored (out1: the second x tile's)."""
    if HAS_BIAS:
        bias = gl.load(bias_ptr + row % N).to(gl.float32)
        out0 += bias
        if MT == 2:
            out1 += bias
    _gvt_store(out0, out_ptr, stride_om, tok, row, ok_row, e4, M, SWIGLU)
    if MT == 2:
        _gvt_store(out1, out_ptr, stride_om, tok + 8, row, ok_row, e4, M, SWIGLU)


@gluon.jit
def _pick(v, e4, i: gl.constexpr):
    """Element i of the in-thread last axis of v [TILES, 8, 4, 4]: [TILES, 8, 4] (a select and an in-thread sum)."""
    return gl.sum(gl.where(e4 == i, v, 0 * v), axis=3)


@gluon.jit
def _gvt_store(out, out_ptr, stride_om, tok, row, ok_row, e4, M, SWIGLU: gl.constexpr):
    """out [TILES, 8, 4, 4]: x row tok, weight row row (ok_row: it exists). SWIGLU: silu(gate) * up of elements
    e and e + 2 (gate c and up c), each rounded to out's dtype first (the bits of the product followed by
    silu_and_mul), to column c = row of the gate."""
    ty: gl.constexpr = out_ptr.dtype.element_ty
    if SWIGLU:
        for i in gl.static_range(2):
            gate = _pick(out, e4, i).to(ty).to(gl.float32)
            up = _pick(out, e4, i + 2).to(ty).to(gl.float32)
            h = (gl.div_rn(gate, 1.0 + gl.exp(-gate)) * up).to(ty)
            tk = _pick(tok, e4, i)
            c = _pick(row, e4, i)
            ok = _pick(ok_row.to(gl.int32), e4, i) != 0
            gl.store(out_ptr + tk.to(gl.int64) * stride_om + c, h, mask=(tk < M) & ok)
    else:
        gl.store(out_ptr + tok.to(gl.int64) * stride_om + row, out.to(ty), mask=(tok < M) & ok_row)

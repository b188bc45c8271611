"""Gluon GEMV for W4A16 with fp16 activations (decode, one x row per program column): paired fp16 products.
Launcher: ops/weight_only/launch.py (path "gv"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language GEMV (gemv.py) computes the same thing and is its CPU twin (Gluon has no interpreter); the
tests run this one on GPUs against the reference.

Why. The Triton-language GEMV keeps every product exact in fp32: about 5 instructions per weight (unpack,
u - z, fp16 -> fp32, FMA), which leaves it issue-bound below the memory bandwidth at M = 1. Here a 32-bit code
word (8 codes) costs 14 instructions, and a chain of CH = min(WPT, 4) words of a thread 3 more (about 2.8 per
weight in the whole loop at WPT 4, with x, the scales and the sums):
  - prmt spreads two code bytes into the halves of a register; lop3 ORs a nibble into the mantissa of 1024.0
    (the high nibble in place, as 16 u); a paired fma leaves u / (64 CH) exactly ((1024 + u) / (64 CH) - 16 / CH,
    and (1024 + 16 u) / (1024 CH) - 1 / CH);
  - four paired fp16 fmas per word multiply by x, two k per lane and word, the products of the chain's words
    accumulated in the same two fp16 lanes (4 CH products each); the two lanes are then added in fp32.
    |u / (64 CH)| < 1 / (4 CH), so no lane can overflow for any finite fp16 x;
  - float zero points (HQQ): the zero point leaves the products: sum_k (u_k - z) x_k = sum_k u_k x_k - z sum_k x_k,
    the x sums taken once per run for all rows, in fp32; the scale is applied once per run and row, in fp32;
  - integer zero points (INT_Z: from_float, GPTQ, AWQ; z in [0, 16]): the paired fma subtracts (1024 + z) / (128 CH)
    instead, its bias pairs built from z by two integer multiply-adds per row and chunk, so each weight is (u - z) /
    (128 CH) exactly and no x sums are needed; |u - z| / (128 CH) <= 1 / (8 CH), so a lane's exact sum stays within
    half of x's largest magnitude. The fp32 sum of each chain is scaled per row and chunk in place, and the lanes
    of a chunk are added across threads once, after the loop. 12-18% fewer loop instructions than the float path
    (sm_90: 717 -> 630 per step at WPT 4, 444 -> 362 at WPT 2).
Products and the lanes' running sums are rounded to fp16 (a relative 2**-11 each; below 2**-14 in magnitude,
fp16's subnormal spacing) where the Triton GEMV keeps them exact: within the tests' tolerance (|x| @ |W|.T
relative), not bit-identical. Chains of 4 words cut the loop's instructions by 11% against one word per chain
(sm_90, 8 rows x 1024 k, WPT 4: 810 -> 717 per step) and added error well below the tolerance
(docs/design/weight-only.md).

Layouts (explicit, so x is read once per thread for all its rows and nothing moves through shared memory in the
loop): a step is BLOCK_K k as NC = BLOCK_K / 64 chunks; the code tile is [BLOCK_N, NC, 8] words (word i of chunk c:
bytes 4 i .. 4 i + 3, low nibbles k = 64 c + 4 i + e, high nibbles that + 32), each thread holding all BLOCK_N rows
and WPT consecutive words of a chunk; x is read as [NC, 8, 2] words of fp16 pairs in the same thread order.
The next step's codes, (scale, zero) words and x are loaded a step ahead. Hopper: programmatic dependent launch,
the first step's codes and scales fetched before the wait. SPLIT_K > 1: the slices' fp32 partials are added by
the last program of each output tile (gluon_shared._splitk_fixup).

_wo_gvp_kernel runs the same steps on a persistent grid (config key PERSISTENT): every program an equal run of
(row block, step) units, so no wave of programs ends part full; row blocks split between programs are added up in
the kernel (_gvp_fixup). In the decode chain it moved no more bytes per second than the grid above on the served
shapes (docs/design/weight-only.md, "The persistent GEMV"); the tuner keeps it among its M = 1 candidates.
"""
import numpy as np
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .gluon_shared import PER_CHANNEL, _k_slice, _pdl_wait, _splitk_fixup

CHUNK_K: gl.constexpr = gl.constexpr(64)      # k per chunk: 32 code bytes, 8 words


def _f16_pair(v: float) -> str:
    """The 32-bit word of two fp16 v."""
    h = int(np.float16(v).view(np.uint16))
    return f"0x{h:04X}{h:04X}"


def _dot_asm(ch: int, int_z: bool = False) -> str:
    """PTX: $1 .. $ch code words, then four x pair words per code word: (k, k + 1), (k + 2, k + 3), (k + 32, k + 33),
    (k + 34, k + 35) -> $0: the sum over the ch words' 8 ch codes of u x / (64 ch), in fp32 (a chunk's low and high
    nibbles share a group). The products of all ch words are chained in each fp16 lane (4 ch per lane) and the two
    lanes added in fp32 once: |u / (64 ch)| < 1 / (4 ch), so no lane can overflow for any finite fp16 x.
    int_z (integer zero points z in [0, 16]): two more words after the code words, the row's fp16 pairs
    -(1024 + z) / (128 ch) and -(1024 + 16 z) / (2048 ch) (_int_z_bias), which the dequantizing fmas add instead of
    constants, with 1 / (128 ch) and 1 / (2048 ch) for factors: the sum is of (u - z) x / (128 ch), each weight exact
    (1024 + u and 1024 + z are integers below 2048 in fp16), |u - z| / (128 ch) <= 1 / (8 ch), so a lane's exact
    sum stays within half of x's largest magnitude."""
    sig = 1.0 / (_unit(ch, int_z))
    sl, bl, sh, bh = (_f16_pair(v) for v in (sig, -1024 * sig, sig / 16, -64 * sig))
    xa = 1 + ch + (2 if int_z else 0)          # the first x word
    cl, ch_ = (f"${1 + ch}", f"${2 + ch}") if int_z else ("bl", "bh")
    body = []
    for j in range(ch):
        w, xs = f"${1 + j}", [f"${xa + 4 * j + q}" for q in range(4)]
        body += [f"prmt.b32 t0, {w}, z, 0x4140;", f"prmt.b32 t1, {w}, z, 0x4342;",
                 "lop3.b32 a0, t0, 0x000F000F, 0x64006400, 0xEA;", "lop3.b32 a1, t1, 0x000F000F, 0x64006400, 0xEA;",
                 "lop3.b32 a2, t0, 0x00F000F0, 0x64006400, 0xEA;", "lop3.b32 a3, t1, 0x00F000F0, 0x64006400, 0xEA;",
                 f"fma.rn.f16x2 a0, a0, sl, {cl};", f"fma.rn.f16x2 a1, a1, sl, {cl};",
                 f"fma.rn.f16x2 a2, a2, sh, {ch_};", f"fma.rn.f16x2 a3, a3, sh, {ch_};",
                 f"mul.rn.f16x2 c0, a0, {xs[0]};" if j == 0 else f"fma.rn.f16x2 c0, a0, {xs[0]}, c0;",
                 f"fma.rn.f16x2 c0, a1, {xs[1]}, c0;", f"fma.rn.f16x2 c0, a2, {xs[2]}, c0;",
                 f"fma.rn.f16x2 c0, a3, {xs[3]}, c0;"]
    head = ["{", ".reg .b32 t0, t1, a0, a1, a2, a3, c0, z, sl, bl, sh, bh;", ".reg .f16 h0, h1;", ".reg .f32 f0, f1;",
            "mov.b32 z, 0;", f"mov.b32 sl, {sl};", f"mov.b32 sh, {sh};"]
    if not int_z:
        head += [f"mov.b32 bl, {bl};", f"mov.b32 bh, {bh};"]
    tail = ["mov.b32 {h0, h1}, c0;", "cvt.f32.f16 f0, h0;", "cvt.f32.f16 f1, h1;", "add.f32 $0, f0, f1;", "}"]
    return "\n".join(head + body + tail)


@gluon.constexpr_function
def _unit(ch: int, int_z: bool) -> int:
    """The asm's weights are (u - z) / unit: 64 ch (float zero points, z = 0 in the asm), 128 ch (integer ones)."""
    return (128 if int_z else 64) * ch


@gluon.constexpr_function
def _int_z_consts(ch: int) -> tuple:
    """(the int32 words C_l, C_h) such that for the fp32 word b = bits(z + 2**23) of an integer zero point z in
    [0, 64): b * 0x10001 + C_l and b * 0x100010 + C_h (mod 2**32) are the fp16 pairs -(1024 + z) / (128 ch) and
    -(1024 + 16 z) / (2048 ch). fp16 bits: 0x6400 + v is 1024 + v (v < 1024); dividing by 2**e takes e << 10 off the
    exponent; 0x8000 is the sign. bits(z + 2**23) = 0x4B000000 + z, whose products with 0x10001 and 0x100010 leave
    0x4B000000 and 0xB0000000 (mod 2**32) beside the wanted z * 0x10001 and 16 z * 0x10001."""
    lg = ch.bit_length() - 1
    lo = 0x8000 | (0x6400 - ((7 + lg) << 10))       # -(1024) / (128 ch)
    hi = 0x8000 | (0x6400 - ((11 + lg) << 10))      # -(1024) / (2048 ch)
    wrap = lambda v: (v + 2**31) % 2**32 - 2**31    # noqa: E731  (as int32)
    return wrap(lo * 0x10001 - 0x4B000000), wrap(hi * 0x10001 - 0xB0000000)


# chains of CH = 1, 2 or 4 words (min(WPT, 4)); the constants sl, bl (low nibbles): 1 / (64 CH), -16 / CH;
# sh, bh (high nibbles): 1 / (1024 CH), -1 / CH. The Z variants (integer zero points): factors 1 / (128 CH) and
# 1 / (2048 CH), the biases per row from _int_z_consts
_DOT1: gl.constexpr = gl.constexpr(_dot_asm(1))
_DOT2: gl.constexpr = gl.constexpr(_dot_asm(2))
_DOT4: gl.constexpr = gl.constexpr(_dot_asm(4))
_DOT1Z: gl.constexpr = gl.constexpr(_dot_asm(1, True))
_DOT2Z: gl.constexpr = gl.constexpr(_dot_asm(2, True))
_DOT4Z: gl.constexpr = gl.constexpr(_dot_asm(4, True))


@gluon.constexpr_function
def _chain(WPT):
    """Code words chained per asm: a thread's consecutive words, at most 4."""
    return min(WPT, 4)


@gluon.constexpr_function
def _code_layout(BLOCK_N, WPT, num_warps):
    """[BLOCK_N, NC, 8] code words: a thread holds all BLOCK_N rows and WPT consecutive words of a chunk; 8 / WPT
    lanes along the words, 4 WPT along the chunks, warps along the chunks."""
    return gl.BlockedLayout([BLOCK_N, 1, WPT], [1, 4 * WPT, 8 // WPT], [1, num_warps, 1], [2, 1, 0])


@gluon.constexpr_function
def _x_layout(WPT, num_warps):
    """[NC, 8, 2] x words (fp16 pairs; the last axis: the two pairs a code word's low, or high, nibbles multiply),
    the threads in _code_layout's order."""
    return gl.BlockedLayout([1, WPT, 2], [4 * WPT, 8 // WPT, 1], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def _halves_f32(w, SHIFT: gl.constexpr):
    """The fp16 in bits SHIFT .. SHIFT + 15 of each word, as fp32."""
    return ((w >> SHIFT) & 0xFFFF).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32)


@gluon.jit
def _x_ptrs(x_ptr, m, stride_xm, NC: gl.constexpr, xl: gl.constexpr):
    """x row m's words (fp16 pairs) of a step at k = 0, [NC, 8, 2] in layout xl, and the chunk index [NC]."""
    xc = gl.arange(0, NC, layout=gl.SliceLayout(1, gl.SliceLayout(2, xl)))
    xi = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, xl)))
    xe = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, xl)))
    x_p = (x_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + m.to(gl.int64) * (stride_xm // 2)
           + gl.expand_dims(gl.expand_dims(xc * 32, 1) + gl.expand_dims(xi * 2, 0), 2)
           + gl.expand_dims(gl.expand_dims(xe, 0), 1))
    return xc, x_p


@gluon.jit
def _load_x(x_p, k0, K, xc, sl: gl.constexpr, rl: gl.constexpr, EVEN_K: gl.constexpr, CH: gl.constexpr,
            INT_Z: gl.constexpr = False):
    """One step's x: the four pair tiles [NC, 8] in slice layout sl (the code tile's, less the row axis), and
    the sum of x over each chunk [NC] (fp32, / (64 CH)) in rl's slice along the rows (INT_Z: zeros, not needed).
    xc: the chunks; not EVEN_K: chunks past K read as zeros."""
    if EVEN_K:
        lo = gl.load(x_p + k0 // 2, eviction_policy="evict_last")
        hi = gl.load(x_p + k0 // 2 + 16, eviction_policy="evict_last")
    else:
        ok = gl.expand_dims(gl.expand_dims(k0 + xc * CHUNK_K < K, 1), 2)
        lo = gl.load(x_p + k0 // 2, mask=ok, other=0, eviction_policy="evict_last")
        hi = gl.load(x_p + k0 // 2 + 16, mask=ok, other=0, eviction_policy="evict_last")
    x0, x1 = gl.split(lo)
    x2, x3 = gl.split(hi)
    if INT_Z:
        xs = gl.zeros_like(xc).to(gl.float32)
    else:
        s = _halves_f32(lo, 0) + _halves_f32(lo, 16) + _halves_f32(hi, 0) + _halves_f32(hi, 16)
        xs = gl.sum(gl.sum(s, axis=2), axis=1) * (1.0 / (64 * CH))
    return (gl.convert_layout(x0, sl, assert_trivial=True), gl.convert_layout(x1, sl, assert_trivial=True),
            gl.convert_layout(x2, sl, assert_trivial=True), gl.convert_layout(x3, sl, assert_trivial=True),
            gl.convert_layout(xs, gl.SliceLayout(0, rl), assert_trivial=True))


@gluon.jit
def _load_sz(s_p, k0, K, c, sz, GROUP: gl.constexpr, EVEN_K: gl.constexpr):
    """One step's (scale, zero) words [BLOCK_N, NC] (per channel: sz, loaded once). s_p: the rows' words
    [BLOCK_N, 1]; c: the chunks [NC]; not EVEN_K: chunks past K read as zeros."""
    if GROUP != PER_CHANNEL:
        kc = k0 + c * CHUNK_K
        if EVEN_K:
            sz = gl.load(s_p + gl.expand_dims(kc // GROUP, 0))
        else:
            sz = gl.load(s_p + gl.expand_dims(kc // GROUP, 0), mask=gl.expand_dims(kc < K, 0), other=0)
    return sz


@gluon.jit
def _copy_w(slot, w_p, k0, K, c, live, EVEN_K: gl.constexpr):
    """One step's code words into a shared-memory slot by async copies (16-byte pieces, each thread its own);
    not EVEN_K: chunks past K as zeros; live false: nothing copied (a step past the slice's end; the group is
    still committed)."""
    if EVEN_K:
        async_copy.async_copy_global_to_shared(slot, w_p + k0 // 8, mask=live, cache_modifier=".cg")
    else:
        ok = gl.expand_dims(gl.expand_dims(k0 + c * CHUNK_K < K, 0), 2) & live
        async_copy.async_copy_global_to_shared(slot, w_p + k0 // 8, mask=ok, cache_modifier=".cg")
    async_copy.commit_group()


@gluon.jit
def _load_w(w_p, k0, K, c, EVEN_K: gl.constexpr):
    """One step's code words [BLOCK_N, NC, 8], streamed past L1 (read once); not EVEN_K: chunks past K read as
    zeros."""
    if EVEN_K:
        w = gl.load(w_p + k0 // 8, cache_modifier=".cg")
    else:
        ok = gl.expand_dims(gl.expand_dims(k0 + c * CHUNK_K < K, 0), 2)
        w = gl.load(w_p + k0 // 8, mask=ok, other=0, cache_modifier=".cg")
    return w


@gluon.jit
def _words(t, CH: gl.constexpr):
    """t [R, C, 8] -> CH = 2 or 4 pieces [R, C, 8 / CH] (CH 2: the two repeated, four in all): piece j holds words
    CH a + j, which a thread holds together (WPT >= CH consecutive words). No instructions."""
    R: gl.constexpr = t.shape[0]
    C: gl.constexpr = t.shape[1]
    if CH == 2:
        a, b = gl.split(gl.reshape(t, [R, C, 4, 2]))
        return a, b, a, b
    else:
        p, q = gl.split(gl.reshape(t, [R, C, 2, 2, 2]))
        p0, p2 = gl.split(p)
        p1, p3 = gl.split(q)
        return p0, p1, p2, p3


@gluon.jit
def _x_words(x, cw, CH: gl.constexpr):
    """An x pair tile [C, 8] broadcast to the code tile cw's rows, as _words (no instructions)."""
    xb, _ = gl.broadcast(gl.expand_dims(x, 0), cw)
    return _words(xb, CH)


@gluon.jit
def _int_z_bias(z, cw, CH: gl.constexpr):
    """The dequantizing fmas' bias words of integer zero points z [BLOCK_N, NC] (fp32), broadcast to the code tile
    cw and cut as _words: two integer multiply-adds per row and chunk (_int_z_consts)."""
    ZL: gl.constexpr = _int_z_consts(CH)[0]
    ZH: gl.constexpr = _int_z_consts(CH)[1]
    b = (z + 8388608.0).to(gl.int32, bitcast=True)
    return _pieces(b * 0x10001 + ZL, cw, CH), _pieces(b * 0x100010 + ZH, cw, CH)


@gluon.jit
def _gv_step(acc, cw, sz, x0, x1, x2, x3, xs, st: gl.constexpr, CH: gl.constexpr, INT_Z: gl.constexpr = False):
    """acc + s (sum u x - z sum x) / (64 CH) over each chunk and row of one step (INT_Z: s sum (u - z) x / (128 CH)
    per chained asm, the zero point taken out in the dequantizing fmas); the products of CH words of a thread
    chained in one asm."""
    s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
    if CH == 1:
        if INT_Z:
            bl, bh = _int_z_bias(z, cw, CH)
            p = gl.inline_asm_elementwise(asm=_DOT1Z, constraints="=r" + ",r" * 7,
                                          args=[cw, bl, bh, gl.expand_dims(x0, 0), gl.expand_dims(x1, 0),
                                                gl.expand_dims(x2, 0), gl.expand_dims(x3, 0)],
                                          dtype=gl.float32, is_pure=True, pack=1)
        else:
            p = gl.inline_asm_elementwise(asm=_DOT1, constraints="=r" + ",r" * 5,
                                          args=[cw, gl.expand_dims(x0, 0), gl.expand_dims(x1, 0),
                                                gl.expand_dims(x2, 0), gl.expand_dims(x3, 0)],
                                          dtype=gl.float32, is_pure=True, pack=1)
    else:
        w0, w1, w2, w3 = _words(cw, CH)
        a0, a1, a2, a3 = _x_words(x0, cw, CH)
        b0, b1, b2, b3 = _x_words(x1, cw, CH)
        c0, c1, c2, c3 = _x_words(x2, cw, CH)
        d0, d1, d2, d3 = _x_words(x3, cw, CH)
        if CH == 2:
            xw = [a0, b0, c0, d0, a1, b1, c1, d1]
            if INT_Z:
                bl, bh = _int_z_bias(z, cw, CH)
                p = gl.inline_asm_elementwise(asm=_DOT2Z, constraints="=r" + ",r" * 12, args=[w0, w1, bl, bh] + xw,
                                              dtype=gl.float32, is_pure=True, pack=1)
            else:
                p = gl.inline_asm_elementwise(asm=_DOT2, constraints="=r" + ",r" * 10, args=[w0, w1] + xw,
                                              dtype=gl.float32, is_pure=True, pack=1)
        else:
            xw = [a0, b0, c0, d0, a1, b1, c1, d1, a2, b2, c2, d2, a3, b3, c3, d3]
            if INT_Z:
                bl, bh = _int_z_bias(z, cw, CH)
                p = gl.inline_asm_elementwise(asm=_DOT4Z, constraints="=r" + ",r" * 22,
                                              args=[w0, w1, w2, w3, bl, bh] + xw, dtype=gl.float32, is_pure=True,
                                              pack=1)
            else:
                p = gl.inline_asm_elementwise(asm=_DOT4, constraints="=r" + ",r" * 20, args=[w0, w1, w2, w3] + xw,
                                              dtype=gl.float32, is_pure=True, pack=1)
    if INT_Z:    # acc per thread and piece: its lanes are added once, at the end (_acc_rows)
        return acc + _pieces(s, cw, CH) * p
    else:
        psum = gl.convert_layout(gl.sum(p, axis=2), acc.type.layout, assert_trivial=True)
        return acc + s * (psum - z * gl.expand_dims(xs, 0))


@gluon.jit
def _pieces(v, cw, CH: gl.constexpr):
    """v [BLOCK_N, NC] (per row and chunk) broadcast to the code tile cw and cut as _words' first piece (the
    shape and layout of a chained asm's result; no instructions)."""
    vb, _ = gl.broadcast(gl.expand_dims(v, 2), cw)
    if CH == 1:
        return vb
    else:
        v0, _, _, _ = _words(vb, CH)
        return v0


@gluon.jit
def _acc_zeros(BLOCK_N: gl.constexpr, NC: gl.constexpr, cl: gl.constexpr, CH: gl.constexpr, INT_Z: gl.constexpr):
    """The running sums: [BLOCK_N, NC] per row and chunk (layout cl less the words), or with INT_Z one per chained
    asm of a thread ([BLOCK_N, NC, 8 / CH], the asm's result), so the steps add no cross-lane sums."""
    if INT_Z:
        return _pieces(gl.zeros([BLOCK_N, NC], gl.float32, layout=gl.SliceLayout(2, cl)),
                       gl.zeros([BLOCK_N, NC, 8], gl.int32, layout=cl), CH)
    else:
        return gl.zeros([BLOCK_N, NC], gl.float32, layout=gl.SliceLayout(2, cl))


@gluon.jit
def _acc_rows(acc, rl: gl.constexpr):
    """The running sums added up per row [BLOCK_N], in rl's slice along the chunks."""
    if len(acc.shape) == 3:
        return gl.convert_layout(gl.sum(gl.sum(acc, axis=2), axis=1), gl.SliceLayout(1, rl))
    else:
        return gl.sum(acc, axis=1)


@gluon.jit
def _wo_gv_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K,
                  stride_xm, stride_wn, stride_sn, stride_om, ws_ptr, cnt_ptr,
                  GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                  WPT: gl.constexpr, SPLIT_K: gl.constexpr, EVEN_K: gl.constexpr, STAGES: gl.constexpr = 1,
                  SWIGLU: gl.constexpr = False, PDL: gl.constexpr = False, INT_Z: gl.constexpr = False):
    """W4A16, fp16 x, K a multiple of 64 (EVEN_K: of BLOCK_K), GROUP PER_CHANNEL or a multiple of 64. Program
    (n, k-slice, m): BLOCK_N weight rows, one x row. SPLIT_K > 1: program column z covers slice z of K (whole
    steps) and writes its fp32 partials to ws_ptr [SPLIT_K, M, N]; the tile's last program adds them up (cnt_ptr:
    one int32 counter per (n, m) program, zero between launches). STAGES > 1: the codes stream through a
    shared-memory ring of async copies STAGES - 1 steps ahead; each thread reads back only the words it copied,
    so no barrier is needed. SWIGLU: the N = 2 I rows are a merged [gate; up] projection; a program takes
    BLOCK_N / 2 output columns c, reads gate c and up c alternately and writes silu(gate) * up."""
    W: gl.constexpr = gl.num_warps()
    NC: gl.constexpr = BLOCK_K // CHUNK_K
    cl: gl.constexpr = _code_layout(BLOCK_N, WPT, W)
    xl: gl.constexpr = _x_layout(WPT, W)
    rl: gl.constexpr = gl.SliceLayout(2, cl)          # [BLOCK_N, NC]: per chunk and row
    xsl: gl.constexpr = gl.SliceLayout(0, cl)         # [NC, 8]: per word, shared by the rows
    st: gl.constexpr = sz_ptr.dtype.element_ty
    CH: gl.constexpr = _chain(WPT)

    pid_n = gl.program_id(0)
    m = gl.program_id(2)
    rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rl))
    if SWIGLU:    # gate c, up c, gate c + 1, ... (wrapped)
        rn = ((rows // 2) % (N // 2) + (rows % 2) * (N // 2)).to(gl.int64)
    else:
        rn = (rows % N).to(gl.int64)                  # wrapped: no row masks
    c = gl.arange(0, NC, layout=gl.SliceLayout(0, rl))
    i = gl.arange(0, 8, layout=gl.SliceLayout(0, xsl))
    # the launcher guarantees 16-byte aligned rows for the codes and 4-byte aligned x rows
    w_p = (w_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
           + gl.expand_dims(gl.expand_dims(rn, 1) * gl.multiple_of(stride_wn // 4, 4) + gl.expand_dims(c, 0) * 8, 2)
           + gl.expand_dims(gl.expand_dims(i, 0), 0))
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + gl.expand_dims(rn, 1) * stride_sn
    xc, x_p = _x_ptrs(x_ptr, m, stride_xm, NC, xl)

    k_lo, k_hi = _k_slice(K, BLOCK_K, SPLIT_K)      # slices of whole steps
    acc = _acc_zeros(BLOCK_N, NC, cl, CH, INT_Z)
    if GROUP == PER_CHANNEL:
        sz = gl.load(s_p + gl.expand_dims(c * 0, 0))  # the one word per row, for every step
    else:
        sz = _load_sz(s_p, k_lo, K, c, 0, GROUP, EVEN_K)
    if STAGES == 1:
        nw = _load_w(w_p, k_lo, K, c, EVEN_K)
    else:
        ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, NC, 8],
                                         gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
        for j in gl.static_range(STAGES - 1):
            kj = k_lo + j * BLOCK_K
            _copy_w(ring.index(j), w_p, gl.where(kj < k_hi, kj, k_lo), K, c, kj < k_hi, EVEN_K)
    nsz = sz
    _pdl_wait(PDL)
    nx0, nx1, nx2, nx3, nxs = _load_x(x_p, k_lo, K, xc, xsl, rl, EVEN_K, CH, INT_Z)
    # every step but the last loads the next one's codes, (scale, zero) words and x (the ring: copies STAGES - 1
    # steps ahead, none past the slice's end); the last step loads nothing, so no load is in flight when the
    # program ends (one would hold its exit up by a round trip)
    for k0 in range(k_lo, k_hi - BLOCK_K, BLOCK_K):
        sz, x0, x1, x2, x3, xs = nsz, nx0, nx1, nx2, nx3, nxs
        k1 = k0 + BLOCK_K
        if STAGES == 1:
            cw = nw
            nw = _load_w(w_p, k1, K, c, EVEN_K)
        else:
            it = (k0 - k_lo) // BLOCK_K
            kf = k0 + (STAGES - 1) * BLOCK_K
            _copy_w(ring.index((it + STAGES - 1) % STAGES), w_p, gl.where(kf < k_hi, kf, k_lo), K, c, kf < k_hi,
                    EVEN_K)
            async_copy.wait_group(STAGES - 1)
            cw = ring.index(it % STAGES).load(cl)
        nsz = _load_sz(s_p, k1, K, c, sz, GROUP, EVEN_K)
        nx0, nx1, nx2, nx3, nxs = _load_x(x_p, k1, K, xc, xsl, rl, EVEN_K, CH, INT_Z)
        acc = _gv_step(acc, cw, sz, x0, x1, x2, x3, xs, st, CH, INT_Z)
    if k_lo < k_hi:
        if STAGES == 1:
            cw = nw
        else:
            async_copy.wait_group(0)
            cw = ring.index(((k_hi - k_lo - 1) // BLOCK_K) % STAGES).load(cl)
        acc = _gv_step(acc, cw, nsz, nx0, nx1, nx2, nx3, nxs, st, CH, INT_Z)
    if STAGES > 1:
        async_copy.wait_group(0)

    out = _acc_rows(acc, rl) * _unit(CH, INT_Z)
    if SPLIT_K > 1:    # the fix-up works on [BLOCK_N, 1] tiles (its Gluon twin is shared with tc)
        om = m + gl.arange(0, 1, layout=gl.SliceLayout(0, rl))
        mask = gl.expand_dims(rows < N, 1) & gl.expand_dims(om < M, 0)
        out2, last = _splitk_fixup(gl.expand_dims(out, 1), ws_ptr, cnt_ptr, m * gl.num_programs(0) + pid_n, rows, om,
                                   mask, M, N, SPLIT_K)
        if last:
            _gv_store(gl.sum(out2, axis=1), bias_ptr, out_ptr + m.to(gl.int64) * stride_om, pid_n, rows, rn, N,
                      HAS_BIAS, SWIGLU)
    else:
        _gv_store(out, bias_ptr, out_ptr + m.to(gl.int64) * stride_om, pid_n, rows, rn, N, HAS_BIAS, SWIGLU)


@gluon.jit
def _gv_store(out, bias_ptr, out_row, pid_n, rows, rn, N, HAS_BIAS: gl.constexpr, SWIGLU: gl.constexpr):
    """The output row: out [BLOCK_N] for weight rows rn (tile index rows); SWIGLU: silu(gate) * up of the (gate,
    up) pairs, each rounded to out's dtype first (the bits of the product followed by silu_and_mul)."""
    ty: gl.constexpr = out_row.dtype.element_ty
    if HAS_BIAS:
        out += gl.load(bias_ptr + rn).to(gl.float32)
    if SWIGLU:
        BN: gl.constexpr = out.shape[0]
        g, u = gl.split(gl.reshape(out, [BN // 2, 2]))
        g = g.to(ty).to(gl.float32)
        u = u.to(ty).to(gl.float32)
        h = (gl.div_rn(g, 1.0 + gl.exp(-g)) * u).to(ty)
        cols = pid_n * (BN // 2) + gl.arange(0, BN // 2, layout=h.type.layout)
        gl.store(out_row + cols, h, mask=cols < N // 2)
    else:
        gl.store(out_row + rows, out.to(ty), mask=rows < N)


@gluon.jit
def _gvp_rows(r, ar, N, BLOCK_N: gl.constexpr, SWIGLU: gl.constexpr):
    """Row block r of the persistent grid: its tile rows and the weight rows they read (past N the last row: in
    bounds, not stored; SWIGLU: gate c, up c, gate c + 1, ...)."""
    rows = r * BLOCK_N + ar
    if SWIGLU:
        rn = gl.minimum(rows // 2, N // 2 - 1) + (rows % 2) * (N // 2)
    else:
        rn = gl.minimum(rows, N - 1)
    return rows, rn


@gluon.jit
def _gvp_load(w_ptr, sz_ptr, rn, k0, K, c, i, stride_wn, stride_sn, GROUP: gl.constexpr, EVEN_K: gl.constexpr):
    """One unit's code words [BLOCK_N, NC, 8] and (scale, zero) words [BLOCK_N, NC] for weight rows rn from k0.
    Offsets in int32 words (the launcher keeps the codes under 2**31 bytes): one wide multiply-add per row and
    pointer instead of 64-bit arithmetic."""
    w_p = (w_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
           + gl.expand_dims(gl.expand_dims(rn * (stride_wn // 4) + k0 // 8, 1) + gl.expand_dims(c, 0) * 8, 2)
           + gl.expand_dims(gl.expand_dims(i, 0), 0))
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + gl.expand_dims(rn * stride_sn, 1)
    w = _load_w(w_p, 0, K - k0, c, EVEN_K)
    if GROUP == PER_CHANNEL:
        sz = gl.load(s_p + gl.expand_dims(c * 0, 0))
    else:
        sz = _load_sz(s_p, k0, K, c, 0, GROUP, EVEN_K)
    return w, sz


@gluon.jit
def _gvp_fixup(out, ws_ptr, cnt_ptr, m, r, R, s0, n, S, U, P, ar, BLOCK_N: gl.constexpr):
    """A row block r whose units are split between programs: this program's piece (units s0 .. s0 + n - 1 of the
    block) stores its fp32 sums [BLOCK_N] to slot s0 of the block's workspace [S, BLOCK_N] (of x row m), then adds
    n to the block's counter (acq_rel, zero between launches); the program that completes the count adds the slots
    where a piece starts (the block's first unit, or some program's first unit), in slot order (deterministic), and
    resets the counter. Returns (the sum, whether this program is the one: only then is the sum complete)."""
    blk = m.to(gl.int64) * R + r
    base = ws_ptr + blk * S * BLOCK_N + ar
    gl.store(base + s0 * BLOCK_N, out)
    gl.thread_barrier()     # the whole piece is stored before the counter says so
    done = gl.atomic_add(cnt_ptr + blk, n, sem="acq_rel", scope="gpu")
    last = done + n == S
    if last:
        out = gl.zeros_like(out)
        for s in range(0, S):
            v = r.to(gl.int64) * S + s
            q = (v * P + U - 1) // U            # the first program starting at or after unit v
            if (s == 0) | ((q * U) // P == v):
                out += gl.load(base + s * BLOCK_N, cache_modifier=".cg")
        gl.atomic_xchg(cnt_ptr + blk, 0, sem="relaxed", scope="gpu")
    return out, last


@gluon.jit
def _wo_gvp_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K,
                   stride_xm, stride_wn, stride_sn, stride_om, ws_ptr, cnt_ptr,
                   GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                   WPT: gl.constexpr, EVEN_K: gl.constexpr, SWIGLU: gl.constexpr = False, PDL: gl.constexpr = False,
                   INT_Z: gl.constexpr = False):
    """_wo_gv_kernel on a persistent grid (path "gv" with PERSISTENT): the work of one x row is R x S units (row
    block of BLOCK_N rows, step of BLOCK_K k; unit u = r S + s), and program p of the P in grid dimension 0 takes
    units [p U / P, (p + 1) U / P): every program the same bytes (one unit more or less), so no wave of programs
    ends part full; the launcher sizes P to the programs the GPU holds at once. A row block wholly inside one
    program's range is stored directly; one split between programs goes through _gvp_fixup (ws_ptr [M, R, S,
    BLOCK_N] fp32, cnt_ptr one int32 counter per (x row, row block)). The next unit's codes, (scale, zero) words
    and x are loaded a unit ahead, across row blocks."""
    W: gl.constexpr = gl.num_warps()
    NC: gl.constexpr = BLOCK_K // CHUNK_K
    cl: gl.constexpr = _code_layout(BLOCK_N, WPT, W)
    xl: gl.constexpr = _x_layout(WPT, W)
    rl: gl.constexpr = gl.SliceLayout(2, cl)
    xsl: gl.constexpr = gl.SliceLayout(0, cl)
    st: gl.constexpr = sz_ptr.dtype.element_ty
    CH: gl.constexpr = _chain(WPT)

    p = gl.program_id(0).to(gl.int64)
    P = gl.num_programs(0).to(gl.int64)
    m = gl.program_id(2)
    R = gl.cdiv(N, BLOCK_N)
    S = gl.cdiv(K, BLOCK_K)
    U = R.to(gl.int64) * S
    u0 = (p * U // P).to(gl.int32)
    u1 = ((p + 1) * U // P).to(gl.int32)
    ar = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, rl))
    c = gl.arange(0, NC, layout=gl.SliceLayout(0, rl))
    i = gl.arange(0, 8, layout=gl.SliceLayout(0, xsl))
    xc, x_p = _x_ptrs(x_ptr, m, stride_xm, NC, xl)
    out_row = out_ptr + m.to(gl.int64) * stride_om

    nr = u0 // S                             # the next unit's row block and step, carried (no division per unit)
    ns = u0 - nr * S
    nrows, nrn = _gvp_rows(nr, ar, N, BLOCK_N, SWIGLU)
    nw, nsz = _gvp_load(w_ptr, sz_ptr, nrn, ns * BLOCK_K, K, c, i, stride_wn, stride_sn, GROUP, EVEN_K)
    _pdl_wait(PDL)
    nx0, nx1, nx2, nx3, nxs = _load_x(x_p, ns * BLOCK_K, K, xc, xsl, rl, EVEN_K, CH, INT_Z)
    acc = _acc_zeros(BLOCK_N, NC, cl, CH, INT_Z)
    for u in range(u0, u1):
        r, s, rows, rn = nr, ns, nrows, nrn
        cw, sz, x0, x1, x2, x3, xs = nw, nsz, nx0, nx1, nx2, nx3, nxs
        # the next unit a unit ahead (past the range's end too: its rows clamp to the last, in bounds, unused)
        ns = s + 1
        nr = gl.where(ns == S, r + 1, r)
        ns = gl.where(ns == S, 0, ns)
        nrows, nrn = _gvp_rows(nr, ar, N, BLOCK_N, SWIGLU)
        nw, nsz = _gvp_load(w_ptr, sz_ptr, nrn, ns * BLOCK_K, K, c, i, stride_wn, stride_sn, GROUP, EVEN_K)
        nx0, nx1, nx2, nx3, nxs = _load_x(x_p, ns * BLOCK_K, K, xc, xsl, rl, EVEN_K, CH, INT_Z)
        acc = _gv_step(acc, cw, sz, x0, x1, x2, x3, xs, st, CH, INT_Z)
        if (s == S - 1) | (u == u1 - 1):    # the row block, or this program's range, ends with this unit
            out = _acc_rows(acc, rl) * _unit(CH, INT_Z)
            first = gl.maximum(u0, r * S)   # this program's first unit of the block
            if (first == r * S) & (s == S - 1):
                _gv_store(out, bias_ptr, out_row, r, rows, rn, N, HAS_BIAS, SWIGLU)
            else:
                out, last = _gvp_fixup(out, ws_ptr, cnt_ptr, m, r, R, first - r * S, u - first + 1, S, U, P, ar,
                                       BLOCK_N)
                if last:
                    _gv_store(out, bias_ptr, out_row, r, rows, rn, N, HAS_BIAS, SWIGLU)
            acc = _acc_zeros(BLOCK_N, NC, cl, CH, INT_Z)

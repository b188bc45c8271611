"""Gluon GEMV for W8A8 (int8 and fp8 e4m3) on tensor cores at decode sizes (M <= 16), quantizing x itself.
Launcher: ops/gemm.py (path "gvt" of the "w8a8" / "w8a8-fp8" tables). Reference: reference.w8a8_linear. The
Triton-language 8-bit GEMV (_gemm._gemv8_kernel with QUANT_A) computes the same and is its CPU twin (Gluon has no
interpreter); the tests run this one on GPUs against the reference.

Why. The Triton GEMV decodes every weight and x code to fp32 and multiplies on the CUDA cores; quantizing x in the
same kernel, it spends ~7 instructions per weight byte (docs/design/gemm.md), over an H200's issue budget at its memory
bandwidth. Here the weight bytes go to mma.sync m16n8k32 as they are loaded (int8: s8 x s8 -> s32, exact; fp8:
e4m3 x e4m3 -> f32), x is quantized once per step and lane for all the weight rows of the lane, and M = 2..16 rows
of x cost about what one does.

  out.T = W @ xq.T: A = a 16-row weight tile (rows g and g + 8 in lane (g, t), g = lane / 4, t = lane % 4), B = up
  to 8 rows of quantized x (a second set of MMAs on the same A for x rows 8..15, MT = 2).

The layout is weight_only/gvt.py's for 8-bit codes ([TILES, 8, 4, NB, 4]: 16-row tiles, the lane group g, the lane
t of the quad, the step's NB = WPT / 4 blocks of 64 k, and a lane's 4 code words of a block: one 16-byte load per
row). The order in which k is summed is free as long as A and B follow the same one: MMA j of a block takes a lane's
words 2 j and 2 j + 1 as its k = 4 t .. 4 t + 3 and 16 + 4 t .. 16 + 4 t + 3, and lane (g, t) reads x row g at
the same 16 k as its code words (two 8-byte loads of 4 values per MMA), so B follows A with no permutation.

Activation quantization: the quantize kernel's arithmetic, so its codes and scales: the row's absmax over the
finite values (every program reads its rows of x whole, the warp's lanes along k), scale = max(absmax / Q, the
smallest normal) (1 for a zero row), and per value x * (1 / scale) in fp32, then fp8: the satfinite conversion
(clamp to +-448, round to nearest even, NaN stays NaN); int8: round to nearest even, NaN -> 0, clamped to
[-128, 127]. QUANT_A = False: x is already codes (4 to a 32-bit word) with per-row scales sa_ptr.

Epilogue as _gemm._epilogue_after_a: acc * scale_a (fp32), * scale_b, * scale_c, + bias, cast. int8 sums are exact
(int32 partials, int32 split-K workspace), so the bits are those of quantize + GEMM and of the reference; fp8 sums
are fp32 in another order (on sm_90 ptxas runs the fp8 MMA as two fp16 ones: e4m3 values are exact in fp16).
SPLIT_K > 1: the slices' partials are added by the last program of each output tile (no second launch).
Hopper: programmatic dependent launch, the first step's codes fetched before the wait.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .weight_only.gluon_shared import _k_slice, _pdl_wait, _tile_sums
from .weight_only.gvt import _axis, _layout


def _mma_asm(mt: int, fp8: bool) -> str:
    """PTX: one 64-k block of rows g and g + 8 for mt x tiles, added to the accumulators. Operands: the outputs (4
    per x tile: the accumulator fragment, rows g, g, g + 8, g + 8 and x rows 2 t, 2 t + 1, 2 t, 2 t + 1), then the
    4 code words of row g, of row g + 8, per x tile the 4 x words at the same k, and per x tile the 4 accumulators
    coming in."""
    n_out = 4 * mt
    wa, wb, xb, cb = n_out, n_out + 4, n_out + 8, n_out + 8 + 4 * mt
    shape, reg = ("f32.e4m3.e4m3.f32", "f32") if fp8 else ("s32.s8.s8.s32", "b32")
    d = [[f"d{q}{i}" for i in range(4)] for q in range(mt)]
    lines = [f".reg .{reg} " + ", ".join(v for q in d for v in q) + ";"]
    for q in range(mt):
        acc = "{" + ", ".join(d[q]) + "}"
        for j in range(2):
            a = f"{{${wa + 2 * j}, ${wb + 2 * j}, ${wa + 2 * j + 1}, ${wb + 2 * j + 1}}}"
            b = f"{{${xb + 4 * q + 2 * j}, ${xb + 4 * q + 2 * j + 1}}}"
            c = "{" + ", ".join(f"${cb + 4 * q + i}" for i in range(4)) + "}" if j == 0 else acc
            lines.append(f"mma.sync.aligned.m16n8k32.row.col.{shape} {acc}, {a}, {b}, {c};")
    lines += [f"mov.{reg} ${4 * q + i}, {d[q][i]};" for q in range(mt) for i in range(4)]
    return "{\n" + "\n".join(lines) + "\n}"


def _quant_asm(fp8: bool, bf16: bool) -> str:
    """PTX: 4 consecutive x values (two 32-bit words of 16-bit floats) and 1 / scale -> one word of 4 codes, value i
    in byte i: y = x * inv in fp32; fp8: cvt.rn.satfinite (the pair's first value in the low byte); int8: cvt.rni to
    s32 (NaN -> 0, saturating), clamped to [-128, 127], the low bytes packed by prmt."""
    lines = [".reg .f32 f0, f1, f2, f3;"]
    if bf16:     # bf16 -> fp32: its bits in the high half
        lines += ["shl.b32 f0, $1, 16;", "and.b32 f1, $1, 0xFFFF0000;",
                  "shl.b32 f2, $2, 16;", "and.b32 f3, $2, 0xFFFF0000;"]
    else:
        lines += [".reg .b16 h0, h1, h2, h3;", "mov.b32 {h0, h1}, $1;", "mov.b32 {h2, h3}, $2;"]
        lines += [f"cvt.f32.f16 f{i}, h{i};" for i in range(4)]
    lines += [f"mul.rn.f32 f{i}, f{i}, $3;" for i in range(4)]
    if fp8:
        lines += [".reg .b16 p0, p1;",
                  "cvt.rn.satfinite.e4m3x2.f32 p0, f1, f0;", "cvt.rn.satfinite.e4m3x2.f32 p1, f3, f2;",
                  "mov.b32 $0, {p0, p1};"]
    else:
        lines += [".reg .s32 i0, i1, i2, i3, lo, hi;"]
        for i in range(4):
            lines += [f"cvt.rni.sat.s8.f32 i{i}, f{i};"]
        lines += ["prmt.b32 lo, i0, i1, 0x0040;", "prmt.b32 hi, i2, i3, 0x0040;", "prmt.b32 $0, lo, hi, 0x5410;"]
    return "{\n" + "\n".join(lines) + "\n}"


# by x tiles (1, 2) and code format
_MMA1_I8: gl.constexpr = gl.constexpr(_mma_asm(1, False))
_MMA2_I8: gl.constexpr = gl.constexpr(_mma_asm(2, False))
_MMA1_F8: gl.constexpr = gl.constexpr(_mma_asm(1, True))
_MMA2_F8: gl.constexpr = gl.constexpr(_mma_asm(2, True))
_MMA1_CI: gl.constexpr = gl.constexpr(",".join(["=r"] * 4 + ["r"] * 16))
_MMA2_CI: gl.constexpr = gl.constexpr(",".join(["=r"] * 8 + ["r"] * 24))
_MMA1_CF: gl.constexpr = gl.constexpr(",".join(["=f"] * 4 + ["r"] * 12 + ["f"] * 4))
_MMA2_CF: gl.constexpr = gl.constexpr(",".join(["=f"] * 8 + ["r"] * 16 + ["f"] * 8))
# by code format and x dtype
_Q_I8_F16: gl.constexpr = gl.constexpr(_quant_asm(False, False))
_Q_I8_BF16: gl.constexpr = gl.constexpr(_quant_asm(False, True))
_Q_F8_F16: gl.constexpr = gl.constexpr(_quant_asm(True, False))
_Q_F8_BF16: gl.constexpr = gl.constexpr(_quant_asm(True, True))


@gluon.jit
def _row_scale(x_row, ok, K, QSYM: gl.constexpr, XB: gl.constexpr, W: gl.constexpr):
    """The quantize kernel's per-row scale of x_row[0:K] (ok: the row exists; else 1): max(absmax / QSYM, the
    smallest normal) over the finite values, 1 for a zero row. All the program's lanes along k, XB elements per round
    of loads (up to 64 per lane: one round for the rows of most layers, all its loads in flight at once), each
    round's maximum taken in the lane before the next."""
    V: gl.constexpr = XB // (32 * W)
    XL: gl.constexpr = gl.BlockedLayout([1, V], [32, 1], [W, 1], [1, 0])
    m = gl.zeros([32 * W], gl.float32, layout=gl.SliceLayout(1, XL))
    lane = gl.expand_dims(gl.arange(0, 32 * W, layout=gl.SliceLayout(1, XL)), 1) * V
    for k0 in range(0, K, XB):
        k = k0 + lane + gl.expand_dims(gl.arange(0, V, layout=gl.SliceLayout(0, XL)), 0)
        v = gl.abs(gl.load(x_row + k, mask=(k < K) & ok, other=0.0))
        m = gl.maximum(m, gl.max(gl.where(v < float("inf"), v, gl.zeros_like(v)), axis=1))
    amax = gl.max(m, axis=0)
    scale = gl.maximum(gl.div_rn(amax, QSYM), 1.1754943508222875e-38)
    return gl.where(amax == 0.0, 1.0, scale)


@gluon.jit
def _codes(p, k0, K, okc, EVEN_K: gl.constexpr):
    """One step's code words of one row set (16-byte loads, streamed past L1); not EVEN_K: 64-k units past K as
    zeros (an fp8 NaN there would make 0 x NaN)."""
    if EVEN_K:
        w = gl.load(p + k0 // 4, cache_modifier=".cg")
    else:
        w = gl.load(p + k0 // 4, mask=k0 + okc < K, other=0, cache_modifier=".cg")
    return w


@gluon.jit
def _x_words(p, k0, K, xm, okc, QUANT_A: gl.constexpr, EVEN_K: gl.constexpr):
    """One x tile's words for a step [1, 8, 4, NB, 4] (x row g of the tile at the k of the lane's code words):
    QUANT_A, 8-byte words of 4 float values; else 32-bit words of 4 codes. xm: the row exists; not EVEN_K: 64-k
    units past K as zeros."""
    ok = xm
    if not EVEN_K:
        ok = ok & (k0 + okc < K)
    return gl.load(p + k0 // 4, mask=ok, other=0)


@gluon.jit
def _x_codes(v, inv, QUANT_A: gl.constexpr, FP8: gl.constexpr, BF16: gl.constexpr):
    """_x_words' words -> the B words of 4 codes: QUANT_A, quantized with 1 / scale `inv` (per lane: its x row's);
    else as they are."""
    if QUANT_A:
        lo = v.to(gl.int32)
        hi = (v >> 32).to(gl.int32)
        if FP8:
            asm: gl.constexpr = _Q_F8_BF16 if BF16 else _Q_F8_F16
        else:
            asm: gl.constexpr = _Q_I8_BF16 if BF16 else _Q_I8_F16
        inv, lo = gl.broadcast(inv, lo)
        q = gl.inline_asm_elementwise(asm=asm, constraints="=r,r,r,f", args=[lo, hi, inv], dtype=gl.int32,
                                      is_pure=True, pack=1)
    else:
        q = v
    return q


@gluon.jit
def _mma_block(acc0, acc1, wa, wb, x0, x1, FP8: gl.constexpr, MT: gl.constexpr):
    """acc + the step's sums for each x tile (MT == 1: acc1 as it is): int32 (exact) or fp32."""
    if MT == 1:
        asm1: gl.constexpr = _MMA1_F8 if FP8 else _MMA1_I8
        c1: gl.constexpr = _MMA1_CF if FP8 else _MMA1_CI
        acc0 = gl.inline_asm_elementwise(asm=asm1, constraints=c1, args=[wa, wb, x0, acc0], dtype=acc0.dtype,
                                         is_pure=True, pack=4)
    else:
        asm2: gl.constexpr = _MMA2_F8 if FP8 else _MMA2_I8
        c2: gl.constexpr = _MMA2_CF if FP8 else _MMA2_CI
        acc0, acc1 = gl.inline_asm_elementwise(asm=asm2, constraints=c2, args=[wa, wb, x0, x1, acc0, acc1],
                                               dtype=(acc0.dtype, acc1.dtype), is_pure=True, pack=4)
    return acc0, acc1


@gluon.jit
def _w8a8_gvt_kernel(x_ptr, w_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, scale_c, ws_ptr, cnt_ptr, M, N, K,
                     stride_xm, stride_wn, stride_cm,
                     SB_PER_COL: gl.constexpr, HAS_BIAS: gl.constexpr, FP8: gl.constexpr, QUANT_A: gl.constexpr,
                     QSYM: gl.constexpr, TILES: gl.constexpr, WPT: gl.constexpr, MT: gl.constexpr,
                     XR: gl.constexpr, XB: gl.constexpr, SPLIT_K: gl.constexpr, EVEN_K: gl.constexpr,
                     PDL: gl.constexpr = False):
    """C[m, n] = (sum_k xq[m, k] wq[n, k]) * scale_a[m] * scale_b[n] * scale_c (+ bias[n]). x: QUANT_A, fp16 / bf16
    [M, K] (stride in elements, rows 16-byte aligned); else codes (stride in bytes) with per-row scales sa_ptr. w:
    [N, K] codes (stride in bytes, rows 16-byte aligned). K a multiple of 64 (EVEN_K: of 16 WPT). Program (n,
    k-slice, m): TILES 16-row tiles of w, 8 MT rows of x, XR of which exist at most (the rows whose scales it
    works out, XB elements of a row per round of loads). SPLIT_K > 1: program column z covers slice z of K (whole
    steps) and writes its partials to ws_ptr [SPLIT_K, M, N] (int8: int32); the tile's last program adds them up
    (cnt_ptr: an int32 counter per (n, m) program, zero between launches)."""
    W: gl.constexpr = gl.num_warps()
    NB: gl.constexpr = WPT // 4
    STEP: gl.constexpr = NB * 64
    L: gl.constexpr = _layout(TILES // W, NB, W)
    BF16: gl.constexpr = x_ptr.dtype.element_ty == gl.bfloat16
    acc_ty: gl.constexpr = gl.float32 if FP8 else gl.int32

    pid_n = gl.program_id(0)
    m0 = gl.program_id(2) * (8 * MT)
    tile = _axis(TILES, 0, L)
    g = _axis(8, 1, L)
    t = _axis(4, 2, L)
    blk = _axis(NB, 3, L)
    e = _axis(4, 4, L)
    row_a = pid_n * (16 * TILES) + tile * 16 + g
    row_b = row_a + 8
    ra = (row_a % N).to(gl.int64)                                    # wrapped: no row masks on loads
    rb = (row_b % N).to(gl.int64)
    wi = blk * 16 + t * 4 + e                                         # the step's word [1, 1, 4, NB, 4]
    okc = (wi * 4 // 64) * 64                                         # its 64-k unit's first k, from the step's
    w32 = w_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
    wa_p = w32 + ra * gl.multiple_of(stride_wn // 4, 4) + wi
    wb_p = w32 + rb * gl.multiple_of(stride_wn // 4, 4) + wi
    if QUANT_A:    # x as 8-byte words of 4 values, word wi at k = 4 wi
        xw_ptr = x_ptr.to(gl.pointer_type(gl.int64), bitcast=True)
        x_stride = stride_xm // 4
    else:          # x codes as 32-bit words
        xw_ptr = x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
        x_stride = stride_xm // 4
    x0_p = xw_ptr + (m0 + g).to(gl.int64) * x_stride + wi
    xm0 = (m0 + g) < M
    x1_p = xw_ptr + (m0 + 8 + g).to(gl.int64) * x_stride + wi         # the second x tile's (MT == 2)
    xm1 = (m0 + 8 + g) < M

    k_lo, k_hi = _k_slice(K, STEP, SPLIT_K)      # slices of whole steps
    wa = _codes(wa_p, k_lo, K, okc, EVEN_K)
    wb = _codes(wb_p, k_lo, K, okc, EVEN_K)
    _pdl_wait(PDL)

    # the scale of each x row of the program: inv0 / inv1 per lane (its x rows g and 8 + g), sa per accumulator
    # element (x row 2 t + e % 2, and + 8 for the second tile)
    e4 = gl.sum(e, axis=3)                                            # [1, 1, 1, 4]
    t4 = gl.sum(t, axis=3)                                            # [1, 1, 4, 1]
    tok = m0 + 2 * t4 + e4 % 2                                        # [1, 1, 4, 4]
    inv0 = gl.zeros([1, 8, 1, 1, 1], gl.float32, layout=L)
    inv1 = inv0
    sa0 = gl.zeros([1, 1, 4, 4], gl.float32, layout=gl.SliceLayout(3, L))
    sa1 = sa0
    for r in gl.static_range(XR):
        if QUANT_A:
            s = _row_scale(x_ptr + (m0 + r).to(gl.int64) * stride_xm, m0 + r < M, K, QSYM, XB, W)
            inv = gl.div_rn(1.0, s)
            if r < 8:
                inv0 = gl.where(g == r, inv, inv0)
            else:
                inv1 = gl.where(g == r - 8, inv, inv1)
        else:
            s = gl.load(sa_ptr + gl.minimum(m0 + r, M - 1))
        if r < 8:
            sa0 = gl.where(tok == m0 + r, s, sa0)
        else:
            sa1 = gl.where(tok + 8 == m0 + r, s, sa1)

    acc0 = gl.zeros([TILES, 8, 4, NB, 4], acc_ty, layout=L)
    acc1 = acc0                                                       # MT == 2: the second x tile's
    v0 = _x_words(x0_p, k_lo, K, xm0, okc, QUANT_A, EVEN_K)
    v1 = v0
    if MT == 2:
        v1 = _x_words(x1_p, k_lo, K, xm1, okc, QUANT_A, EVEN_K)
    # each step's code and x words are loaded a step ahead of their use (x quantized just before its MMAs)
    for k0 in range(k_lo, k_hi, STEP):
        k1 = k0 + STEP
        k1 = gl.where(k1 < k_hi, k1, k_lo)     # past the slice's end: the first step again (in bounds, unused)
        wa2 = _codes(wa_p, k1, K, okc, EVEN_K)
        wb2 = _codes(wb_p, k1, K, okc, EVEN_K)
        u0 = _x_words(x0_p, k1, K, xm0, okc, QUANT_A, EVEN_K)
        u1 = u0
        if MT == 2:
            u1 = _x_words(x1_p, k1, K, xm1, okc, QUANT_A, EVEN_K)
        x0 = _x_codes(v0, inv0, QUANT_A, FP8, BF16)
        x1 = x0
        if MT == 2:
            x1 = _x_codes(v1, inv1, QUANT_A, FP8, BF16)
        acc0, acc1 = _mma_block(acc0, acc1, wa, wb, x0, x1, FP8, MT)
        wa = wa2
        wb = wb2
        v0 = u0
        v1 = u1

    # element (tile, g, t, e): weight row a (e < 2) or b, x row m0 (+ 8 for acc1) + 2 t + e % 2
    row = gl.where(e4 < 2, gl.sum(row_a, axis=3), gl.sum(row_b, axis=3)) + 0 * t4      # [TILES, 8, 4, 4]
    tok = tok + 0 * row
    ok_row = row < N
    out0, out1, last = _tile_sums(acc0, acc1, ws_ptr, cnt_ptr, pid_n, tok, row, ok_row, M, N, MT, SPLIT_K)
    if last:
        _store(out0, sa0, c_ptr, sb_ptr, bias_ptr, scale_c, stride_cm, tok, row, ok_row, M, N, SB_PER_COL, HAS_BIAS)
        if MT == 2:
            _store(out1, sa1, c_ptr, sb_ptr, bias_ptr, scale_c, stride_cm, tok + 8, row, ok_row, M, N, SB_PER_COL,
                   HAS_BIAS)


@gluon.jit
def _store(acc, sa, c_ptr, sb_ptr, bias_ptr, scale_c, stride_cm, tok, row, ok_row, M, N, SB_PER_COL: gl.constexpr,
           HAS_BIAS: gl.constexpr):
    """The complete sums of one x tile [TILES, 8, 4, 4] -> C (x row tok, weight row row): _epilogue_after_a's
    arithmetic in its order (acc * scale_a, * scale_b, * scale_c, + bias), then the cast."""
    out = acc.to(gl.float32) * sa
    if SB_PER_COL:
        out = out * gl.load(sb_ptr + row, mask=ok_row, other=0.0)
    else:
        out = out * gl.load(sb_ptr + 0 * row)
    out = out * scale_c
    if HAS_BIAS:
        out = out + gl.load(bias_ptr + row, mask=ok_row, other=0.0).to(gl.float32)
    ty: gl.constexpr = c_ptr.dtype.element_ty
    gl.store(c_ptr + tok.to(gl.int64) * stride_cm + row, out.to(ty), mask=(tok < M) & ok_row)

"""Private Triton kernels for weight-only quantized linears (W4A16 / W8A16).
Launchers: ops/weight_only.py. Layout: packed_weight.py. Reference: reference.weight_only_linear.

The weight is read in chunks of 64 k-values. `_tile` turns BLOCK_K / 64 chunks of BLOCK_N rows into
two [BLOCK_N, BLOCK_K / 64, 32] tiles of x's dtype: w_lo holds k = 64 c + j and w_hi k = 64 c + 32 + j
of chunk c. For 4-bit weights these are the low and high nibbles of the same contiguous bytes (the
layout puts k and k + 32 in one byte, so no interleaving is needed); for 8-bit weights two runs of 32
bytes. Group sizes are >= 32, so each run of 32 has one scale and zero per row, broadcast along the
last axis: w = (u - z) * s. The GEMV multiplies the 3-D tiles with x directly; the tensor-core
kernel reshapes them to [BLOCK_N, BLOCK_K / 2] and loads x.T rows in the matching k order.

Codes become floats without integer->float conversions (quarter-rate instructions): on GPUs an
inline-PTX block spreads each byte into a half of a 32-bit register (prmt), ORs the nibble into the
mantissa of 1024.0 (fp16) or 128.0 (bf16) with one lop3 per pair, and subtracts the magic number
with a paired fma: two codes per instruction, exact. The Triton interpreter (no inline PTX) and the
one case where the magic number cannot hold a code exactly (8-bit codes in bf16) use plain
conversions; both give the same bits, as u - z is exact and (u - z) * s rounds once either way.

  _wo_gemv_kernel:    one x row per program column (decode, M = 1): (u - z) times x in an fp32 FMA
                      chain, the scale applied once per 32-run and row.
  _wo_mm_kernel:      tensor cores, computed as out.T = W @ x.T ("swap AB"): the dequantized
                      weight tile is the MMA's A operand (BLOCK_N rows), x.T the B operand, so a
                      small M (>= 1, padded to BLOCK_M >= 16) wastes no weight bandwidth.
                      SPLIT_K > 1 splits K over program columns (small grids: few weight row-blocks
                      and a long K); the last program of a tile adds the partials in a fixed order
                      (_splitk_fixup, as in the GEMV).
  _wo_dequant_kernel: writes the dequantized weight, for a cuBLAS GEMM at large M.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _cast, _grouped_pid, _k_slice, _pdl_launch, _pdl_wait, _splitk_fixup

CHUNK: tl.constexpr = tl.constexpr(64)
HALF: tl.constexpr = tl.constexpr(32)


def _nibbles_asm(magic: str, one: str, neg_magic: str, fma: str) -> str:
    """PTX: 4 bytes in $4 -> low nibbles in $0, $1 and high nibbles in $2, $3, as 16-bit float pairs:
    prmt spreads two bytes into the halves of a register, lop3 ORs each nibble into the mantissa of
    the magic number, and a paired fma (x * 1 - magic) leaves the code, exactly."""
    return f"""{{
        .reg .b32 t0, t1, z, m, mg, one, nm;
        mov.b32 z, 0;
        mov.b32 m, 0x000F000F;
        mov.b32 mg, {magic};
        mov.b32 one, {one};
        mov.b32 nm, {neg_magic};
        prmt.b32 t0, $4, z, 0x4140;
        prmt.b32 t1, $4, z, 0x4342;
        lop3.b32 $0, t0, m, mg, 0xEA;
        lop3.b32 $1, t1, m, mg, 0xEA;
        shr.b32 t0, t0, 4;
        shr.b32 t1, t1, 4;
        lop3.b32 $2, t0, m, mg, 0xEA;
        lop3.b32 $3, t1, m, mg, 0xEA;
        fma.rn.{fma} $0, $0, one, nm;
        fma.rn.{fma} $1, $1, one, nm;
        fma.rn.{fma} $2, $2, one, nm;
        fma.rn.{fma} $3, $3, one, nm;
        }}"""


_NIBBLES_F16: tl.constexpr = tl.constexpr(_nibbles_asm("0x64006400", "0x3C003C00", "0xE400E400", "f16x2"))    # 1024.0
_NIBBLES_BF16: tl.constexpr = tl.constexpr(_nibbles_asm("0x43004300", "0x3F803F80", "0xC300C300", "bf16x2"))  # 128.0
# the same without the final fmas: magic + code, for kernels that fold the magic into the zero point
_NIBBLES_RAW_F16: tl.constexpr = tl.constexpr("\n".join(
    ln for ln in _nibbles_asm("0x64006400", "0x3C003C00", "0xE400E400", "f16x2").splitlines() if "fma" not in ln))
_NIBBLES_RAW_BF16: tl.constexpr = tl.constexpr("\n".join(
    ln for ln in _nibbles_asm("0x43004300", "0x3F803F80", "0xC300C300", "bf16x2").splitlines() if "fma" not in ln))
MAGIC_F16: tl.constexpr = tl.constexpr(1024.0)
MAGIC_BF16: tl.constexpr = tl.constexpr(128.0)


@triton.jit
def _nibbles(b, dt: tl.constexpr, RAW: tl.constexpr = False):
    """uint8 -> (low nibble, high nibble) as dt (float16 / bfloat16) integers, two codes per instruction;
    RAW: magic + nibble instead (magic: 1024 for float16, 128 for bfloat16)."""
    if dt == tl.bfloat16:
        lo, hi = tl.inline_asm_elementwise(asm=_NIBBLES_RAW_BF16 if RAW else _NIBBLES_BF16,
                                           constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        lo, hi = tl.inline_asm_elementwise(asm=_NIBBLES_RAW_F16 if RAW else _NIBBLES_F16,
                                           constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _bytes_f16_raw(b):
    """uint8 -> 1024 + byte as float16 (one prmt per two bytes)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 mg;
        mov.b32 mg, 0x64646464;
        prmt.b32 $0, $2, mg, 0x4140;
        prmt.b32 $1, $2, mg, 0x4342;
        }""",
        constraints="=r,=r,r", args=[b], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _bytes_f16(b):
    """uint8 -> float16 integers (magic 1024.0)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 mg, one, nm;
        mov.b32 mg, 0x64646464;
        mov.b32 one, 0x3C003C00;
        mov.b32 nm, 0xE400E400;
        prmt.b32 $0, $2, mg, 0x4140;
        prmt.b32 $1, $2, mg, 0x4342;
        fma.rn.f16x2 $0, $0, one, nm;
        fma.rn.f16x2 $1, $1, one, nm;
        }""",
        constraints="=r,=r,r", args=[b], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _sz_words(sz_ptr, s_row, kc, K, GROUP: tl.constexpr, CHUNK_FIRST: tl.constexpr):
    """The (scale, zero point) words of the 32-runs starting at kc [NC], for the rows at word offsets
    s_row: one 32-bit word per group (PackedWeight.scale_zero), [BLOCK_N, NC] ([NC, BLOCK_N] with
    CHUNK_FIRST). Masked: kc may run past K, as the kernels fetch a step ahead."""
    if GROUP == 0:
        g = kc * 0
    else:
        g = kc // GROUP
    words = sz_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    if CHUNK_FIRST:
        w = tl.load(words + s_row[None, :] + g[:, None], mask=(kc < K)[:, None], other=0)
    else:
        w = tl.load(words + s_row[:, None] + g[None, :], mask=(kc < K)[None, :], other=0)
    return w


@triton.jit
def _unpack_sz(w, st: tl.constexpr):
    """(scale, zero point) words -> two tensors of the scales' dtype st."""
    s = (w & 0xFFFF).to(tl.uint16).to(st, bitcast=True)
    z = ((w >> 16) & 0xFFFF).to(tl.uint16).to(st, bitcast=True)
    return s, z


@triton.jit
def _sz_step(sz_ptr, s_row, k0, K, GROUP: tl.constexpr, NC: tl.constexpr, CHUNK_FIRST: tl.constexpr):
    """Words of the step at k0: lo for k = k0 + 64 c + [0, 32), hi for the next 32 (the same group
    unless GROUP == 32)."""
    kc = k0 + tl.arange(0, NC) * CHUNK
    w_lo = _sz_words(sz_ptr, s_row, kc, K, GROUP, CHUNK_FIRST)
    if GROUP == 32:
        w_hi = _sz_words(sz_ptr, s_row, kc + HALF, K, GROUP, CHUNK_FIRST)
    else:
        w_hi = w_lo
    return w_lo, w_hi


@triton.jit
def _scales(sz_ptr, s_row, k0, K, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """(s_lo, z_lo, s_hi, z_hi) for the step at k0: [BLOCK_N, NC] each, in the scales' dtype."""
    w_lo, w_hi = _sz_step(sz_ptr, s_row, k0, K, GROUP, BLOCK_K // CHUNK, False)
    s_lo, z_lo = _unpack_sz(w_lo, sz_ptr.dtype.element_ty)
    s_hi, z_hi = _unpack_sz(w_hi, sz_ptr.dtype.element_ty)
    return s_lo, z_lo, s_hi, z_hi


@triton.jit
def _apply(u, s, z, dt: tl.constexpr):
    """(u - z) * s for a [BLOCK_N, NC, 32] code tile u with s, z [BLOCK_N, NC]."""
    if u.dtype == tl.float32:       # portable path: exact in fp32, one rounding to dt
        w = _cast((u - z.to(tl.float32)[:, :, None]) * s.to(tl.float32)[:, :, None], dt)
    else:
        w = (u - z.to(dt)[:, :, None]) * s.to(dt)[:, :, None]
    return w


@triton.jit
def _tile(w_ptr, offs_n, k0, K, stride_wn, s_lo, z_lo, s_hi, z_hi,
          BITS: tl.constexpr, MASKED: tl.constexpr, dt: tl.constexpr, BLOCK_K: tl.constexpr):
    """Dequantized weights of rows offs_n, k in [k0, k0 + BLOCK_K), as two [BLOCK_N, NC, 32] tiles
    (NC = BLOCK_K / 64) in x's dtype dt: w_lo[n, c, j] is k = k0 + 64 c + j, w_hi[n, c, j] is that + 32.
    s_* / z_*: this step's scales and zero points (_scales)."""
    NC: tl.constexpr = BLOCK_K // CHUNK
    c = tl.arange(0, NC)
    j = tl.arange(0, HALF)
    kc = k0 + c * CHUNK                                        # [NC]
    row = offs_n[:, None, None].to(tl.int64) * stride_wn
    if BITS == 4:
        kb = tl.multiple_of(k0 // 2, HALF)
        p = w_ptr + row + kb + (c * HALF)[:, None][None, :, :] + j[None, None, :]    # k0 / 2 + 32 c + j
        if MASKED:
            b = tl.load(p, mask=(kc < K)[None, :, None], other=0)       # 4-bit rows are padded to whole chunks
        else:
            b = tl.load(p)
        if INTERPRET:
            bi = b.to(tl.int32)
            lo, hi = (bi & 15).to(tl.float32), (bi >> 4).to(tl.float32)
        else:
            lo, hi = _nibbles(b, dt)
    else:
        k0 = tl.multiple_of(k0, CHUNK)
        k = k0 + (c * CHUNK)[None, :, None] + j[None, None, :]
        p = w_ptr + row + k
        if MASKED:
            b_lo = tl.load(p, mask=k < K, other=0)
            b_hi = tl.load(p + HALF, mask=k + HALF < K, other=0)
        else:
            b_lo = tl.load(p)
            b_hi = tl.load(p + HALF)
        if INTERPRET or dt == tl.bfloat16:
            lo, hi = b_lo.to(tl.float32), b_hi.to(tl.float32)
        else:
            lo, hi = _bytes_f16(b_lo), _bytes_f16(b_hi)
    return _apply(lo, s_lo, z_lo, dt), _apply(hi, s_hi, z_hi, dt)


@triton.jit
def _codes_bytes_t(w_ptr, row, k0, K, BITS: tl.constexpr, MASKED: tl.constexpr, NC: tl.constexpr):
    """Code bytes of the GEMV step at k0, chunk first: [NC, BLOCK_N, 32] (two tiles for 8-bit codes, k and
    k + 32; one for 4-bit, whose bytes hold both); MASKED: zeros past K."""
    c = tl.arange(0, NC)
    j = tl.arange(0, HALF)
    kc = k0 + c * CHUNK
    if BITS == 4:
        p = w_ptr + row[None, :, None] + k0 // 2 + (c * HALF)[:, None, None] + j[None, None, :]
        if MASKED:
            b_lo = tl.load(p, mask=(kc < K)[:, None, None], other=0)    # 4-bit rows are padded to whole chunks
        else:
            b_lo = tl.load(p)
        b_hi = b_lo
    else:
        kx = kc[:, None] + j[None, :]
        p = w_ptr + row[None, :, None] + kx[:, None, :]
        if MASKED:
            b_lo = tl.load(p, mask=kx[:, None, :] < K, other=0)
            b_hi = tl.load(p + HALF, mask=kx[:, None, :] + HALF < K, other=0)
        else:
            b_lo = tl.load(p)
            b_hi = tl.load(p + HALF)
    return b_lo, b_hi


@triton.jit
def _x_t(x_row, k0, K, MASKED: tl.constexpr, NC: tl.constexpr):
    """x of the GEMV step at k0 as two [NC, 32] tiles: k = k0 + 64 c + j and that + 32; MASKED: zeros past K."""
    kx = k0 + tl.arange(0, NC)[:, None] * CHUNK + tl.arange(0, HALF)[None, :]
    if MASKED:
        x_lo = tl.load(x_row + kx, mask=kx < K, other=0.0)
        x_hi = tl.load(x_row + kx + HALF, mask=kx + HALF < K, other=0.0)
    else:
        x_lo = tl.load(x_row + kx)
        x_hi = tl.load(x_row + kx + HALF)
    return x_lo, x_hi


@triton.jit
def _codes_t(b_lo, b_hi, BITS: tl.constexpr, dt: tl.constexpr, INT_Z: tl.constexpr):
    """Code bytes (_load_t) -> two tiles of exact integers (dt; fp32 where the magic-number conversion
    does not apply): lo[c, n, j] for k = k0 + 64 c + j, hi for that + 32. INT_Z (zero points known to be
    integers): the codes come back as magic + u (_magic: the constant), which _run_dot folds into the
    zero point: (magic + u) - (magic + z) is exact for integer z, one instruction per pair fewer."""
    if BITS == 4:
        if INTERPRET:
            bi = b_lo.to(tl.int32)
            lo, hi = (bi & 15).to(tl.float32), (bi >> 4).to(tl.float32)
            if INT_Z:
                lo, hi = lo + _magic(BITS, dt), hi + _magic(BITS, dt)
        elif INT_Z:
            lo, hi = _nibbles(b_lo, dt, True)
        else:
            lo, hi = _nibbles(b_lo, dt)
    else:
        if INTERPRET or dt == tl.bfloat16:
            lo, hi = b_lo.to(tl.float32), b_hi.to(tl.float32)
            if INT_Z:
                lo, hi = lo + _magic(BITS, dt), hi + _magic(BITS, dt)
        elif INT_Z:
            lo, hi = _bytes_f16_raw(b_lo), _bytes_f16_raw(b_hi)
        else:
            lo, hi = _bytes_f16(b_lo), _bytes_f16(b_hi)
    return lo, hi


@triton.jit
def _magic(BITS: tl.constexpr, dt: tl.constexpr):
    """The constant _codes_t adds to each code with INT_Z (0 where it converts without a magic number)."""
    if dt == tl.bfloat16:
        if BITS == 4:
            m = MAGIC_BF16
        else:
            m = 0.0
    else:
        m = MAGIC_F16
    return m


@triton.jit
def _run_dot(u, sz, x, st: tl.constexpr, BITS: tl.constexpr, dt: tl.constexpr, INT_Z: tl.constexpr):
    """[NC, BLOCK_N]: s * sum_j (u - z) x over each 32-run; u - z in u's dtype (two per instruction,
    exact for integer zero points), the sum an fp32 FMA chain, the scale applied once. INT_Z: u carries
    _magic, added to z here once per run instead of subtracted from every code."""
    s, z = _unpack_sz(sz, st)
    if INT_Z:
        zz = (z.to(tl.float32) + _magic(BITS, dt)).to(u.dtype)
    else:
        zz = z.to(u.dtype)
    d = (u - zz[:, :, None]).to(tl.float32)
    return s.to(tl.float32) * tl.sum(d * x.to(tl.float32)[:, None, :], axis=2)


@triton.jit
def _gemv_step(b_lo, b_hi, x_lo, x_hi, sz_lo, sz_hi, st: tl.constexpr, BITS: tl.constexpr, dt: tl.constexpr,
               INT_Z: tl.constexpr):
    """[NC, BLOCK_N] partial sums of one GEMV step from its code bytes, x and (scale, zero) words."""
    u_lo, u_hi = _codes_t(b_lo, b_hi, BITS, dt, INT_Z)
    return _run_dot(u_lo, sz_lo, x_lo, st, BITS, dt, INT_Z) + _run_dot(u_hi, sz_hi, x_hi, st, BITS, dt, INT_Z)


@triton.jit
def _next_k(k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Where the step after k0 starts. EVEN_K: the step after the last wraps to the first, so a load a step
    ahead stays in bounds without masks (its values go unused)."""
    if EVEN_K:
        k1 = tl.multiple_of((k0 + BLOCK_K) % K, BLOCK_K)
    else:
        k1 = tl.multiple_of(k0 + BLOCK_K, BLOCK_K)
    return k1


@triton.jit
def _wo_gemv_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K,
                    stride_xm, stride_wn, stride_sn, stride_om,
                    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                    INT_Z: tl.constexpr = False, PDL: tl.constexpr = False):
    """One x row per program column. INT_Z: the zero points are integers (PackedWeight.int_zeros), so the magic
    number of the code conversion folds into them (_codes_t). SPLIT_K > 1: program z covers BLOCK_K-aligned
    slice z of K (none empty); the tile's partial sums are added in slice order by its last program
    (_splitk_fixup: workspace ws_ptr, counters cnt_ptr). The scale is factored out of each run of 32 k sharing
    one group: sum_k (u_k - z) s x_k = s sum_k (u_k - z) x_k, so the integer differences u - z (exact) enter an
    fp32 FMA chain and the scale is applied once per run and row, not once per weight. Tiles are chunk first
    ([NC, BLOCK_N, 32]): a thread holds several rows at the same k and converts x once for all of them.
    The first step is peeled: its code bytes and (scale, zero) words are fetched before _pdl_wait (with PDL,
    while the kernel before still runs), and the loop takes the rest. The (scale, zero) words are loaded a step
    ahead (Triton does not pipeline loops without a dot); the code bytes are not: carried across iterations as
    u8 tensors they cost a byte shuffle each."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = rows % N                                   # wrapped: loads need no row mask
    NC: tl.constexpr = BLOCK_K // CHUNK
    dt: tl.constexpr = x_ptr.dtype.element_ty
    st: tl.constexpr = sz_ptr.dtype.element_ty
    row = offs_n.to(tl.int64) * stride_wn
    s_row = offs_n.to(tl.int64) * stride_sn
    x_row = x_ptr + m * stride_xm
    k_lo, k_hi = _k_slice(K, tl.program_id(2), BLOCK_K, SPLIT_K)
    _pdl_launch(PDL)
    sz_lo, sz_hi = _sz_step(sz_ptr, s_row, k_lo, K, GROUP, NC, True)
    b_lo, b_hi = _codes_bytes_t(w_ptr, row, k_lo, K, BITS, not EVEN_K, NC)
    _pdl_wait(PDL)
    x_lo, x_hi = _x_t(x_row, k_lo, K, not EVEN_K, NC)
    nsz_lo, nsz_hi = _sz_step(sz_ptr, s_row, _next_k(k_lo, K, BLOCK_K, EVEN_K), K, GROUP, NC, True)
    acc = _gemv_step(b_lo, b_hi, x_lo, x_hi, sz_lo, sz_hi, st, BITS, dt, INT_Z)
    sz_lo, sz_hi = nsz_lo, nsz_hi
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        k0 = tl.multiple_of(k0, BLOCK_K)
        b_lo, b_hi = _codes_bytes_t(w_ptr, row, k0, K, BITS, not EVEN_K, NC)
        x_lo, x_hi = _x_t(x_row, k0, K, not EVEN_K, NC)
        # the next step's (scale, zero) words, a step ahead: small, and their latency would otherwise be
        # exposed every step
        nsz_lo, nsz_hi = _sz_step(sz_ptr, s_row, _next_k(k0, K, BLOCK_K, EVEN_K), K, GROUP, NC, True)
        acc += _gemv_step(b_lo, b_hi, x_lo, x_hi, sz_lo, sz_hi, st, BITS, dt, INT_Z)
        sz_lo, sz_hi = nsz_lo, nsz_hi
    out = tl.sum(acc, axis=0)
    o_mask = rows < N
    last = True
    if SPLIT_K > 1:
        out, last = _splitk_fixup(out, ws_ptr, cnt_ptr, m * tl.num_programs(0) + pid_n, m * N + rows, o_mask,
                                  M * N, tl.program_id(2), SPLIT_K)
    if last:
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n).to(tl.float32)
        tl.store(out_ptr + m * stride_om + rows, _cast(out, out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _dot(a, b, acc):
    if INTERPRET:   # the interpreter's bf16 tl.dot is wrong: same operand values, multiplied in fp32
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _wo_mm_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K,
                  stride_xm, stride_wn, stride_sn, stride_om,
                  BITS: tl.constexpr, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                  EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_N: tl.constexpr, SPLIT_K: tl.constexpr):
    """out.T = W @ x.T with the weight tile as the MMA's A operand in registers (the weight rows fill the MMA's
    M side, so a small M wastes no weight bandwidth). SPLIT_K > 1: program column pid_k covers K_STEP-aligned
    slice pid_k of K; the tile's last program adds the slices' partials in order (_splitk_fixup)."""
    pid = tl.program_id(0)
    # GROUP_N weight row-blocks share their x tiles in L2
    pid_n, pid_m = _grouped_pid(pid, tl.cdiv(N, BLOCK_N), tl.cdiv(M, BLOCK_M), GROUP_N)

    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = rows_n % N
    offs_m = rows_m % M
    NC: tl.constexpr = BLOCK_K // CHUNK
    r = tl.arange(0, NC * HALF)
    kr = (r // HALF) * CHUNK + r % HALF               # k - k0 of row r of the reshaped w_lo tile
    kr = tl.max_contiguous(tl.multiple_of(kr, HALF), HALF)
    dt: tl.constexpr = x_ptr.dtype.element_ty
    xt_base = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm     # x.T tiles: [NC * 32, BLOCK_M]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    s_row = offs_n.to(tl.int64) * stride_sn
    k_lo, k_hi = _k_slice(K, tl.program_id(1), BLOCK_K, SPLIT_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k0 = tl.multiple_of(k0, BLOCK_K)
        # 32-bit scale/zero words: Triton pipelines these loads with the codes and x (async copies), and
        # the dequantized tile stays in registers as the MMA's A operand
        s_lo, z_lo, s_hi, z_hi = _scales(sz_ptr, s_row, k0, K, GROUP, BLOCK_K)
        w_lo, w_hi = _tile(w_ptr, offs_n, k0, K, stride_wn, s_lo, z_lo, s_hi, z_hi, BITS, not EVEN_K, dt, BLOCK_K)
        w_lo = tl.reshape(w_lo, (BLOCK_N, NC * HALF))
        w_hi = tl.reshape(w_hi, (BLOCK_N, NC * HALF))
        p_lo = xt_base + (k0 + kr)[:, None]
        if EVEN_K:
            x_lo = tl.load(p_lo)
            x_hi = tl.load(p_lo + HALF)
        else:
            x_lo = tl.load(p_lo, mask=(k0 + kr < K)[:, None], other=0.0)
            x_hi = tl.load(p_lo + HALF, mask=(k0 + kr < K - HALF)[:, None], other=0.0)
        acc = _dot(w_lo, x_lo, acc)
        acc = _dot(w_hi, x_hi, acc)
    rm = rows_m[None, :]
    rn = rows_n[:, None]
    o_mask = (rn < N) & (rm < M)
    last = True
    if SPLIT_K > 1:
        acc, last = _splitk_fixup(acc, ws_ptr, cnt_ptr, pid, rm.to(tl.int64) * N + rn, o_mask, M * N,
                                  tl.program_id(1), SPLIT_K)
    if last:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n[:, None]).to(tl.float32)
        tl.store(out_ptr + rm.to(tl.int64) * stride_om + rn, _cast(acc, out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _wo_dequant_kernel(w_ptr, sz_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_on,
                       BITS: tl.constexpr, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    k0 = tl.program_id(1) * BLOCK_K
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    NC: tl.constexpr = BLOCK_K // CHUNK
    kx = k0 + tl.arange(0, NC)[:, None] * CHUNK + tl.arange(0, HALF)[None, :]     # [NC, 32]
    dt: tl.constexpr = out_ptr.dtype.element_ty
    s_lo, z_lo, s_hi, z_hi = _scales(sz_ptr, (rows % N).to(tl.int64) * stride_sn, k0, K, GROUP, BLOCK_K)
    w_lo, w_hi = _tile(w_ptr, rows % N, k0, K, stride_wn, s_lo, z_lo, s_hi, z_hi, BITS, not EVEN_K, dt, BLOCK_K)
    o = out_ptr + rows[:, None, None].to(tl.int64) * stride_on + kx[None, :, :]
    rmask = (rows < N)[:, None, None]
    tl.store(o, w_lo, mask=rmask & (kx < K)[None, :, :])
    tl.store(o + HALF, w_hi, mask=rmask & (kx + HALF < K)[None, :, :])

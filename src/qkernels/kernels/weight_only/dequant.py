"""Dequantization shared by the Triton-language weight-only kernels (gemv.py, mm.py), and the dequantize
kernel of the "dequant" path. Launchers: ops/weight_only/. Layout: packed_weight.py. Reference:
reference.weight_only_linear.

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

  _wo_dequant_kernel: writes the dequantized weight, for a cuBLAS GEMM at large M.
"""
import triton
import triton.language as tl

from ... import schemes
from .._common import INTERPRET, _cast

CHUNK: tl.constexpr = tl.constexpr(64)
PER_CHANNEL: tl.constexpr = tl.constexpr(schemes.PER_CHANNEL)   # GROUP of one group per row
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
    if GROUP == PER_CHANNEL:
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

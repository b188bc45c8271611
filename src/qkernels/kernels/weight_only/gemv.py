"""Weight-only GEMV (decode): one x row per program column, (u - z) times x in an fp32 FMA chain, the scale
applied once per 32-run and row. K is split over programs when the grid is small (_common._k_slice); the last
program of a tile adds the partials in slice order (_common._splitk_fixup). On Hopper it is launched with
programmatic dependent launch and fetches its first weight step before it waits. SWIGLU: the weight is a
merged [gate; up] projection and the kernel writes silu(gate) * up (the SwiGLU of an MLP) from its epilogue.
Launcher:
ops/weight_only/launch.py (path "gemv"). Dequantization: dequant.py.
"""
import triton
import triton.language as tl

from .._common import INTERPRET, _cast, _k_slice, _pdl_wait, _silu_mul_narrow, _splitk_fixup
from .dequant import CHUNK, HALF, MAGIC_BF16, MAGIC_F16, _bytes_f16, _bytes_f16_raw, _nibbles, _sz_step, _unpack_sz


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
                    INT_Z: tl.constexpr = False, SWIGLU: tl.constexpr = False, PDL: tl.constexpr = False):
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
    u8 tensors they cost a byte shuffle each.
    SWIGLU: the N = 2 I weight rows are gate (rows < I) then up; a program takes BLOCK_N / 2 columns c of the
    output h [M, I] and reads weight rows gate c and up c alternately, then writes h = silu(gate) * up with both
    rounded to out's dtype first: the bits of this GEMV's [M, 2 I] output followed by silu_and_mul."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)     # index of the tile's outputs (the workspace's too)
    if SWIGLU:
        half = N // 2
        offs_n = (rows // 2) % half + (rows % 2) * half     # gate c, up c, gate c + 1, ...; wrapped
    else:
        offs_n = rows % N                               # wrapped: loads need no row mask
    NC: tl.constexpr = BLOCK_K // CHUNK
    dt: tl.constexpr = x_ptr.dtype.element_ty
    st: tl.constexpr = sz_ptr.dtype.element_ty
    row = offs_n.to(tl.int64) * stride_wn
    s_row = offs_n.to(tl.int64) * stride_sn
    x_row = x_ptr + m * stride_xm
    k_lo, k_hi = _k_slice(K, tl.program_id(2), BLOCK_K, SPLIT_K)
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
        if SWIGLU:
            g, u = tl.split(tl.reshape(out, (BLOCK_N // 2, 2)))
            ty: tl.constexpr = out_ptr.dtype.element_ty
            h = _silu_mul_narrow(_cast(g, ty).to(tl.float32), _cast(u, ty).to(tl.float32), ty)
            cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            tl.store(out_ptr + m * stride_om + cols, h, mask=cols < N // 2)
        else:
            tl.store(out_ptr + m * stride_om + rows, _cast(out, out_ptr.dtype.element_ty), mask=o_mask)


"""Gluon kernel for small-M weight-only linears (W4A16, M <= 16 per program): tensor cores at decode.
Launcher: ops/weight_only/launch.py (path "tc"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language kernels (gemv.py, mm.py) compute the same thing and are its CPU twin (Gluon has no
interpreter); the tests run this one on GPUs against the reference.

Why Gluon. The Triton-language tensor-core kernel moves every dequantized tile into the MMA's operand layout
through shared memory, and the GEMV spends ~5 instructions per weight. Here the layouts are explicit, so the
codes go from global memory straight into the registers the MMA reads:

  out.T = W @ x.T with the weight tile as the MMA's A operand (mma.sync m16n8k16, fp32 accumulation) and up
  to BLOCK_M (8 or 16) rows of x as its B operand (rows past M read row M - 1; their outputs are dropped).

The A operand layout gives a thread, for rows n and n + 8, the k positions {2t, 2t + 1, 2t + 8, 2t + 9}
+ 16 r (t: lane % 4) of each 64-wide tile: not contiguous. But the order in which k is summed is free, as
long as x is read in the same order. So each thread loads 16 contiguous code bytes per row and step (one
128-bit load) into `_k_layout`, whose register bits are the byte offset's low bits, and `_kprime`
renames the byte offset's bits (reshape + permute: no data moves) so that the tile is the A operand, with
k' <- byte k'' a fixed bit permutation; x is loaded in byte order and renamed the same way (its conversion to
the B operand is checked trivial at compile time). Low and high nibbles (k and k + 32 in the PackedWeight
chunk layout) are two MMAs per step, each with its own x tile.

The loop carries the next step's x (and with STAGES 1 its codes) as 32-bit words (bytes would cost a register
each); `gluon_shared._bytes_of` / `_halves_of` turn them back into byte / half tensors with identity asm (no instructions).
STAGES > 1 streams the codes through a shared-memory ring of async copies instead. SPLIT_K > 1: the last
program of each output tile adds the slices' fp32 partials in order, in this kernel.

Per weight: half a prmt and a lop3 (`_NIBBLES_TC_F16`: magic + u, and magic + 16 u for the high nibble, no
shift), half a paired subtract of (magic + zero point) (exact for integer zero points), 1/256 of an MMA.
The scale is applied per row after the MMA, once per 128-k step (group sizes of a multiple of 128; per
channel: once at the end), in fp32. Measured on the H100 (docs/design/weight-only.md): ~2.2
instructions per weight in the loop, yet 1.6-1.8 TB/s of weights at M = 1 (ncu): latency-bound, not
issue-bound. Launched with programmatic dependent launch on Hopper (the first steps' codes fetched before the
wait, as the GEMV does): in a decode chain ahead of the GEMV at M = 1 on long-K shapes (4096x14336) and of the
other kernels at M = 2-16 on most decode shapes (the H100 table, tuned by tune_weight_only.py --chain).
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from .dequant import _NIBBLES_RAW_BF16
from .gluon_shared import PER_CHANNEL, _bytes_of, _halves_of, _k_slice, _pdl_wait, _splitk_fixup

TILE_K: gl.constexpr = gl.constexpr(128)     # k per step: two 64-k chunks = 64 code bytes per row
BYTES: gl.constexpr = gl.constexpr(64)


@gluon.constexpr_function
def _k_layout(rows, V, num_warps, weights):
    """Layout of a [rows, 4 V] step tile (4 V elements along k per row): V contiguous elements per thread and
    row (register bits), 4 threads along the row, one row per lane group of 4.
    weights (the codes): rows n and n + 8 in one thread (the MMA's A fragment holds both), 16 rows per warp,
    warps and then registers along N. Otherwise (x): 8 rows per lane set, then registers; every warp holds the
    whole tile.
    The code bytes are _k_layout(BLOCK_N, 16, ..., True), the 32-bit words carrying them V = 4; x values V = 16,
    x value pairs V = 8: the word layouts are the element layouts without the register bits inside a word."""
    reg = [[0, 1 << i] for i in range(V.bit_length() - 1)]
    if weights:
        reg += [[8, 0]] + [[16 * num_warps << i, 0] for i in range((rows // (16 * num_warps)).bit_length() - 1)]
        warp = [[16 << i, 0] for i in range(num_warps.bit_length() - 1)]
    else:
        reg += [[8 << i, 0] for i in range((rows // 8).bit_length() - 1)]
        warp = [[0, 0] for _ in range(num_warps.bit_length() - 1)]
    lane = [[0, V], [0, 2 * V], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(reg, lane, warp, [], [rows, 4 * V])


@gluon.jit
def _kprime_bits(t):
    """[R, 64] indexed by byte offset k'' -> [R, 2, 2, 2, 2, 2, 2] indexed by (r, bits of k' high to low):
    k'0 = k''0, k'1 = k''4, k'2 = k''5, k'3 = k''1, k'4 = k''2, k'5 = k''3. Renames only: no data moves."""
    R: gl.constexpr = t.shape[0]
    t = gl.reshape(t, [R, 2, 2, 2, 2, 2, 2])      # (r, k''5, k''4, k''3, k''2, k''1, k''0)
    return gl.permute(t, [0, 3, 4, 5, 1, 2, 6])


@gluon.jit
def _kprime(t):
    """[R, 64] in byte order k'' -> [R, 64] in k' order (the A operand's k)."""
    return gl.reshape(_kprime_bits(t), [t.shape[0], 64])


@gluon.jit
def _kprime_t(t):
    """[R, 64] in byte order k'' -> [64, R] in k' order (the B operand's k)."""
    return gl.reshape(gl.permute(_kprime_bits(t), [1, 2, 3, 4, 5, 6, 0]), [64, t.shape[0]])


# fp16: 4 code bytes -> $0, $1: 1024 + low nibble of bytes (0, 1), (2, 3); $2, $3: 1024 + 16 * high nibble (the
# nibble stays in bits 4-7, inside fp16's mantissa: no shift). One prmt per byte pair, one lop3 per code pair.
_NIBBLES_TC_F16: gl.constexpr = gl.constexpr("""{
        .reg .b32 t0, t1;
        prmt.b32 t0, $4, 0, 0x4140;
        prmt.b32 t1, $4, 0, 0x4342;
        lop3.b32 $0, t0, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 $1, t1, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 $2, t0, 0x00F000F0, 0x64006400, 0xEA;
        lop3.b32 $3, t1, 0x00F000F0, 0x64006400, 0xEA;
        }""")


@gluon.jit
def _codes(b, dt: gl.constexpr):
    """uint8 codes -> (magic + low nibble, magic + HI * high nibble) as dt, exact: fp16 magic 1024 and HI = 16
    (_NIBBLES_TC_F16); bf16 magic 128 and HI = 1 (its 7-bit mantissa cannot hold the nibble in bits 4-7)."""
    if dt == gl.bfloat16:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_RAW_BF16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
    else:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_TC_F16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
    return lo, hi


@gluon.jit
def _tc_load_w(w_p, k0):
    """One step's codes as 32-bit words [BLOCK_N, 16], streamed past L1 (read once; L1 keeps x)."""
    return gl.load(w_p + k0 // 8, cache_modifier=".cg")


@gluon.jit
def _tc_load_sz(s_p, k0, sz, GROUP: gl.constexpr):
    """One step's (scale, zero) words [BLOCK_N] (per channel: sz, loaded once)."""
    if GROUP != PER_CHANNEL:
        sz = gl.load(s_p + k0 // GROUP)
    return sz


@gluon.jit
def _tc_load_x(x_p, k0):
    """One step's x pairs for the low and high nibbles [BLOCK_M, 32] each (word pointers), kept in L1 for the
    other programs."""
    return (gl.load(x_p + k0 // 2, eviction_policy="evict_last"),
            gl.load(x_p + k0 // 2 + 16, eviction_policy="evict_last"))


@gluon.jit
def _tc_math(acc, b, sz, x_lo, x_hi, a_l: gl.constexpr, b_l: gl.constexpr, mma: gl.constexpr, GROUP: gl.constexpr,
             INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr):
    """acc + this step's sum over k of (u - z) x, times the step's scale per row (per channel: the caller scales at
    the end). Products exact in fp32; the high nibbles' factor HI (a power of two) is divided out in fp32."""
    if dt == gl.bfloat16:
        MAGIC: gl.constexpr = 128.0
        HI: gl.constexpr = 1.0
    else:
        MAGIC: gl.constexpr = 1024.0
        HI: gl.constexpr = 16.0
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
    lo, hi = _codes(b, dt)       # MAGIC + u, MAGIC + HI * u
    if INT_Z:    # (MAGIC + u) - (MAGIC + z): exact
        d_lo = lo - (z + MAGIC).to(dt)[:, None]
        d_hi = hi - (z * HI + MAGIC).to(dt)[:, None]
    else:        # u exact, then u - z rounded to dt (non-integer zero points), as the other kernels
        d_lo = (lo - MAGIC) - z.to(dt)[:, None]
        d_hi = (hi - MAGIC) - (z * HI).to(dt)[:, None]
    part = mma_v2(gl.convert_layout(_kprime(d_hi), a_l), gl.convert_layout(_kprime_t(x_hi), b_l, assert_trivial=True),
                  gl.zeros(acc.shape, gl.float32, layout=mma))
    if HI != 1.0:
        part = part * (1.0 / HI)
    part = mma_v2(gl.convert_layout(_kprime(d_lo), a_l), gl.convert_layout(_kprime_t(x_lo), b_l, assert_trivial=True),
                  part)
    if GROUP == PER_CHANNEL:
        acc += part
    else:
        s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
        acc += part * gl.convert_layout(s, gl.SliceLayout(1, mma))[:, None]
    return acc


@gluon.jit
def _wo_tc_kernel(x_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, M, N, K,
                  stride_xm, stride_wn, stride_sn, stride_om, ws_ptr, cnt_ptr,
                  GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, INT_Z: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr = 1,
                  PDL: gl.constexpr = False):
    """W4A16, K a multiple of 128, GROUP PER_CHANNEL or a multiple of 128. Program (n, k-slice, m):
    BLOCK_N weight rows x BLOCK_M (8 or 16) rows of x. SPLIT_K > 1: program column z covers slice z of K and
    writes its fp32 partials to ws_ptr [SPLIT_K, M, N]; the tile's last program adds them up (cnt_ptr: one int32
    counter per (n, m) program, zero between launches). INT_Z: integer zero points, the conversion's magic
    number folds into them ((magic + u) - (magic + z) is exact). STAGES > 1: codes through a shared-memory
    ring of async copies, STAGES - 1 steps ahead. PDL (programmatic dependent launch): the first steps' codes and
    (scale, zero) words are fetched before waiting for the kernel before, x after."""
    W: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_l: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    cl: gl.constexpr = _k_layout(BLOCK_N, 16, W, True)        # code bytes
    xl: gl.constexpr = _k_layout(BLOCK_M, 16, W, False)       # x values
    dt: gl.constexpr = x_ptr.dtype.element_ty
    st: gl.constexpr = sz_ptr.dtype.element_ty

    pid_n = gl.program_id(0)
    pid_m = gl.program_id(2)
    cwl: gl.constexpr = _k_layout(BLOCK_N, 4, W, True)        # code bytes as 32-bit words
    xwl: gl.constexpr = _k_layout(BLOCK_M, 8, W, False)       # x value pairs as 32-bit words
    rn = (pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cwl))) % N    # wrapped: no row masks
    kw = gl.arange(0, BYTES // 4, layout=gl.SliceLayout(0, cwl))
    # the launcher guarantees 16-byte aligned rows (4 words) for x and the codes
    w_p = (w_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
           + rn.to(gl.int64)[:, None] * gl.multiple_of(stride_wn // 4, 4) + kw[None, :])
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + rn.to(gl.int64) * stride_sn
    # x rows past M read row M - 1 (no masks, no zero fills): their outputs are not stored
    xm = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, xwl)), M - 1)
    xk = gl.arange(0, BYTES // 2, layout=gl.SliceLayout(0, xwl))
    xk = (xk // 16) * 32 + xk % 16      # word of byte k'' = 2 xk: k = 64 (k'' // 32) + k'' % 32 (+ 32), in pairs
    x_p = (x_ptr.to(gl.pointer_type(gl.int32), bitcast=True)
           + xm.to(gl.int64)[:, None] * gl.multiple_of(stride_xm // 2, 4) + xk[None, :])

    k_lo, k_hi = _k_slice(K, TILE_K, SPLIT_K)      # slices of whole steps
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    sz = gl.load(s_p)     # per channel: the one scale per row, applied at the end
    # the next step's (scale, zero) words and x in registers, a step ahead; the codes either the same way
    # (STAGES 1) or through a ring of STAGES shared-memory buffers filled by async copies STAGES - 1 steps ahead
    # (many more bytes in flight, without registers). Steps past the slice's end read its first step again:
    # in bounds, unused. Each thread reads back only the bytes it copied: no barriers.
    nsz = _tc_load_sz(s_p, k_lo, sz, GROUP)
    if STAGES == 1:
        nw = _tc_load_w(w_p, k_lo)
    else:
        ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, 16], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        for i in gl.static_range(STAGES - 1):
            ki = k_lo + i * TILE_K
            async_copy.async_copy_global_to_shared(ring.index(i), w_p + gl.where(ki < k_hi, ki, k_lo) // 8,
                                                   cache_modifier=".cg")
            async_copy.commit_group()
    _pdl_wait(PDL)
    nxl, nxh = _tc_load_x(x_p, k_lo)
    for k0 in range(k_lo, k_hi, TILE_K):
        sz, xwl_, xwh_ = nsz, nxl, nxh
        k1 = k0 + TILE_K
        k1 = gl.where(k1 < k_hi, k1, k_lo)
        nsz = _tc_load_sz(s_p, k1, sz, GROUP)
        nxl, nxh = _tc_load_x(x_p, k1)
        if STAGES == 1:
            words = nw
            nw = _tc_load_w(w_p, k1)
        else:
            it = (k0 - k_lo) // TILE_K
            kf = k0 + (STAGES - 1) * TILE_K
            async_copy.async_copy_global_to_shared(ring.index((it + STAGES - 1) % STAGES),
                                                   w_p + gl.where(kf < k_hi, kf, k_lo) // 8, cache_modifier=".cg")
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            words = ring.index(it % STAGES).load(cwl)
        acc = _tc_math(acc, _bytes_of(words, cl), gl.convert_layout(sz, gl.SliceLayout(1, cl)),
                       _halves_of(xwl_, dt, xl), _halves_of(xwh_, dt, xl), a_l, b_l, mma, GROUP, INT_Z, dt, st)
    if STAGES > 1:
        async_copy.wait_group(0)
    if GROUP == PER_CHANNEL:
        s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(gl.float32)
        acc = acc * gl.convert_layout(s, gl.SliceLayout(1, mma))[:, None]

    on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    om = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
    mask = (on < N)[:, None] & (om < M)[None, :]
    if SPLIT_K > 1:
        acc, last = _splitk_fixup(acc, ws_ptr, cnt_ptr, pid_m * gl.num_programs(0) + pid_n, on, om, mask, M, N,
                                  SPLIT_K)
        if last:
            _tc_store(acc, bias_ptr, out_ptr, on, om, mask, N, stride_om, HAS_BIAS)
    else:
        _tc_store(acc, bias_ptr, out_ptr, on, om, mask, N, stride_om, HAS_BIAS)


@gluon.jit
def _tc_store(acc, bias_ptr, out_ptr, on, om, mask, N, stride_om, HAS_BIAS: gl.constexpr):
    if HAS_BIAS:
        acc += gl.load(bias_ptr + on % N).to(gl.float32)[:, None]
    gl.store(out_ptr + om.to(gl.int64)[None, :] * stride_om + on[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=mask)

"""Gluon kernel for large-M weight-only linears on Hopper (sm_90): wgmma fed by in-kernel dequantization.
Launcher: ops/weight_only.py (path "wg"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language kernels in _weight_only.py compute the same thing and are its CPU twin (Gluon has no
interpreter); the tests run this one on Hopper GPUs against the reference.

Why. In the Triton-language mm kernel the dequantized tile is an MMA operand that Triton must wait for
before it dequantizes the next one, so tensor cores and the dequantization ALU work take turns (~0.6x fp16
cuBLAS at M >= 1024), and dequantize + cuBLAS pays a full fp16 copy of the weight (0.75x at M = 1024). Here
the schedule is explicit: out[BM, BN] tile = x tile (A, shared memory) @ dequantized weight tile.T (B, shared
memory), one 64-k step at a time, with

  - x and the code bytes of a step copied into a STAGES-deep shared-memory ring by TMA (one mbarrier per
    stage), STAGES - 1 - WQ steps ahead; the (scale, zero point) words loaded a step ahead into registers;
  - the weight tile of step i dequantized (registers) and stored into one of WQ + 2 shared-memory buffers while
    the asynchronous wgmmas of the WQ steps before run on the tensor cores.

Per step and thread: one 64-bit shared load of code bytes, per code pair half a prmt and a lop3 (magic
number + code), one paired subtract and one paired multiply ((u - z) s rounded once to x's dtype, as the other
kernels), then two 128-bit shared stores. 4-bit weights, K a multiple of 64, groups of a multiple of 64 or per channel.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                            warpgroup_mma_wait)

from ._weight_only import _NIBBLES_RAW_BF16, _NIBBLES_RAW_F16

BK: gl.constexpr = gl.constexpr(64)     # k per step: one 64-k chunk (32 code bytes per row)


@gluon.constexpr_function
def _mma_layout(BM, BN, W):
    """wgmma accumulator layout of a [BM, BN] tile on W warps: warpgroups along M while BM has 64 rows for
    each, then along N; the instruction's n is the widest that fits a warpgroup's share of BN (<= 256)."""
    wm = 4
    while wm < W and BM >= 16 * wm * 2:
        wm *= 2
    wn = W // wm
    n = min(BN // wn, 256)
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[wm, wn], instr_shape=[16, n, 16])


@gluon.jit
def _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, stage, off_m, off_n, k0, pred):
    """TMA copies of step k0's x tile and code bytes into ring stage `stage`, arriving on its barrier."""
    bar = bars.index(stage)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [off_m, k0], bar, x_ring.index(stage), pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, k0 // 2], bar, c_ring.index(stage), pred=pred)


@gluon.jit
def _wg_dequant(b, sz, INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr):
    """Code bytes [BN, 32] (byte j of the chunk: k = j low nibble, k = 32 + j high nibble) and their rows'
    (scale, zero) words [BN] -> the dequantized [BN, 64] tile (u - z) s in k order, in x's dtype dt."""
    if dt == gl.bfloat16:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_RAW_BF16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
        MAGIC: gl.constexpr = 128.0
    else:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_RAW_F16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
        MAGIC: gl.constexpr = 1024.0
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True)
    if INT_Z:    # (MAGIC + u) - (MAGIC + z): exact
        zz = (z.to(gl.float32) + MAGIC).to(dt)[:, None]
        d_lo = lo - zz
        d_hi = hi - zz
    else:        # u exact, then u - z rounded to dt (non-integer zero points), as the other kernels
        zz = z.to(dt)[:, None]
        d_lo = (lo - MAGIC) - zz
        d_hi = (hi - MAGIC) - zz
    s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(dt)[:, None]
    d_lo = d_lo * s
    d_hi = d_hi * s
    BN: gl.constexpr = b.shape[0]
    # [BN, 32] x2 -> [BN, 2, 32] -> [BN, 64]: k = 32 h + j (register renaming only)
    return gl.reshape(gl.permute(gl.join(d_lo, d_hi), [0, 2, 1]), [BN, 64])


@gluon.jit
def _wo_wg_kernel(x_desc, w_desc, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_sn, stride_om,
                  GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, INT_Z: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                  WQ: gl.constexpr = 1):
    """W4A16 on Hopper, K a multiple of 64, GROUP 0 (per channel) or a multiple of 64. One program per
    [BLOCK_M, BLOCK_N] output tile (grouped order: GROUP_M row blocks share each weight block in L2).
    x_desc: TMA descriptor of x [M, K], blocks [BLOCK_M, 64]; w_desc: of the code bytes [N, K / 2], blocks
    [BLOCK_N, 32] (rows past M / N read as zeros). WQ: wgmma steps left in flight while the next tile is
    dequantized. A buffer or ring stage is rewritten only after a CTA barrier that every warp passed after its
    last wgmma on it completed: WQ + 2 weight buffers, and copies STAGES - 1 - WQ (>= 1) steps ahead."""
    W: gl.constexpr = gl.num_warps()
    dt: gl.constexpr = x_desc.dtype
    st: gl.constexpr = sz_ptr.dtype.element_ty
    mma: gl.constexpr = _mma_layout(BLOCK_M, BLOCK_N, W)
    dl: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [W, 1], [1, 0])       # dequantization: 8 bytes
    szl: gl.constexpr = gl.SliceLayout(1, dl)

    # grouped tile order
    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % width) % gm) * BLOCK_M
    off_n = ((pid % width) // gm) * BLOCK_N

    # (scale, zero) words of this block's rows (rows past N wrap: their outputs are not stored)
    sn = (off_n + gl.arange(0, BLOCK_N, layout=szl)) % N
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + sn.to(gl.int64) * stride_sn

    x_ring = gl.allocate_shared_memory(dt, [STAGES, BLOCK_M, BK], x_desc.layout)
    c_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, BK // 2], w_desc.layout)
    NBUF: gl.constexpr = WQ + 2
    w_buf = gl.allocate_shared_memory(dt, [NBUF, BLOCK_N, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(bars.index(p), count=1)

    steps = K // BK
    LOOK: gl.constexpr = STAGES - 1 - WQ
    for p in gl.static_range(LOOK):
        _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, p, off_m, off_n, p * BK, p < steps)
    nsz = gl.load(s_p)       # the (scale, zero) words a step ahead, in registers (GROUP 0: one for all)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    for i in range(steps):
        sz = nsz
        if GROUP != 0:
            nsz = gl.load(s_p + ((i + 1) % steps) * BK // GROUP)
        stage = i % STAGES
        mbarrier.wait(bars.index(stage), (i // STAGES) & 1)
        w = _wg_dequant(c_ring.index(stage).load(dl), sz, INT_Z, dt, st)    # overlaps wgmma i - 1
        wb = w_buf.index(i % NBUF)
        wb.store(w)
        fence_async_shared()
        # every warp has stored its part of the tile, read its codes of step i, and waited for wgmma i - 1 - WQ:
        # ring stage (i - 1 - WQ) % STAGES is free (and buffer (i + 1) % NBUF for the next step)
        gl.thread_barrier()
        nxt = i + LOOK
        _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, nxt % STAGES, off_m, off_n, nxt * BK, nxt < steps)
        acc = warpgroup_mma(x_ring.index(stage), wb.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(WQ, deps=(acc, ))
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(p))

    on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
    om = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
    if HAS_BIAS:
        acc += gl.load(bias_ptr + on % N).to(gl.float32)[None, :]
    mask = (om < M)[:, None] & (on < N)[None, :]
    gl.store(out_ptr + om.to(gl.int64)[:, None] * stride_om + on[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask)

"""Gluon kernel for large-M weight-only linears on Hopper (sm_90): wgmma fed by in-register dequantization.
Launcher: ops/weight_only.py (path "wg"). Layout: packed_weight.py. Reference: reference.weight_only_linear.
The Triton-language kernels in _weight_only.py compute the same thing and are its CPU twin (Gluon has no
interpreter); the tests run this one on Hopper GPUs against the reference.

Why. In the Triton-language mm kernel Triton waits for each wgmma before it dequantizes the next tile, so
tensor cores and the dequantization take turns (~0.6x fp16 cuBLAS at M >= 1024). Here the schedule is
explicit, per 64-k step:

  - x and the code bytes of each step come through a STAGES-deep shared-memory ring by TMA (one mbarrier per
    stage), refilled as soon as every warp is done with a stage; the (scale, zero) words are plain loads;
  - out.T = W @ x.T: the weight tile is the wgmma's A operand straight from registers (64 rows per warpgroup),
    x.T its B operand from the ring; the code bytes are read from shared memory in the A-operand layout, so
    the dequantized values need no layout change, and low / high nibbles (k and k + 32 of the packed chunk)
    are two wgmmas on the two halves of the x tile;
  - the next step's tile is dequantized while this step's wgmmas run (is_async, waited one step later).

Measured against other designs in benchmarks/NOTES.md (session 16): the same pipeline with the dequantized
tile stored to shared memory as the B operand (x as A) lost ~40% to the extra shared-memory traffic.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ._weight_only import _NIBBLES_RAW_BF16, _NIBBLES_RAW_F16

BK: gl.constexpr = gl.constexpr(64)     # k per step: one 64-k chunk (32 code bytes per row)


@gluon.jit
def _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, stage, off_m, off_n, k0, pred):
    """TMA copies of step k0's x tile and code bytes into ring stage `stage`, arriving on its barrier."""
    bar = bars.index(stage)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(x_desc, [off_m, k0], bar, x_ring.index(stage), pred=pred)
    tma.async_copy_global_to_shared(w_desc, [off_n, k0 // 2], bar, c_ring.index(stage), pred=pred)


@gluon.jit
def _wg_dequant(b, sz, INT_Z: gl.constexpr, dt: gl.constexpr, st: gl.constexpr):
    """Code bytes [BN, 32] in the wgmma A-operand layout -> (lo, hi): the dequantized k = j and k = 32 + j
    halves of the step's 64-k chunk, [BN, 32] each, in the same layout."""
    if dt == gl.bfloat16:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_RAW_BF16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
        MAGIC: gl.constexpr = 128.0
    else:
        lo, hi = gl.inline_asm_elementwise(asm=_NIBBLES_RAW_F16, constraints="=r,=r,=r,=r,r", args=[b],
                                           dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
        MAGIC: gl.constexpr = 1024.0
    z = ((sz >> 16) & 0xFFFF).to(gl.uint16).to(st, bitcast=True)
    if INT_Z:
        zz = (z.to(gl.float32) + MAGIC).to(dt)[:, None]
        lo = lo - zz
        hi = hi - zz
    else:
        zz = z.to(dt)[:, None]
        lo = (lo - MAGIC) - zz
        hi = (hi - MAGIC) - zz
    s = (sz & 0xFFFF).to(gl.uint16).to(st, bitcast=True).to(dt)[:, None]
    return lo * s, hi * s


@gluon.jit
def _wo_wg_kernel(x_desc, w_desc, sz_ptr, bias_ptr, out_ptr, M, N, K, stride_sn, stride_om,
                   GROUP: gl.constexpr, HAS_BIAS: gl.constexpr, INT_Z: gl.constexpr,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """W4A16 on Hopper, K a multiple of 64, GROUP 0 (per channel) or a multiple of 64. One program per output
    tile, computed as out.T [BLOCK_N, BLOCK_M] = W tile @ x tile.T (grouped order: GROUP_M x blocks share each
    weight block in L2). x_desc: TMA descriptor of x [M, K], blocks [BLOCK_M, 64]; w_desc: of the code bytes
    [N, K / 2], blocks [BLOCK_N, 32] (rows past M / N read as zeros). BLOCK_N: a multiple of 16 x num_warps
    (warpgroups split the weight rows); BLOCK_M <= 256 (the wgmma's n)."""
    W: gl.constexpr = gl.num_warps()
    dt: gl.constexpr = x_desc.dtype
    st: gl.constexpr = sz_ptr.dtype.element_ty
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_M, 16])
    al: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    szl: gl.constexpr = gl.SliceLayout(1, al)

    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % width) % gm) * BLOCK_M
    off_n = ((pid % width) // gm) * BLOCK_N

    sn = (off_n + gl.arange(0, BLOCK_N, layout=szl)) % N
    s_p = sz_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + sn.to(gl.int64) * stride_sn

    x_ring = gl.allocate_shared_memory(dt, [STAGES, BLOCK_M, BK], x_desc.layout)
    c_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_N, BK // 2], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(bars.index(p), count=1)

    steps = K // BK
    for p in gl.static_range(STAGES):
        _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, p, off_m, off_n, p * BK, p < steps)
    sz = gl.load(s_p)
    mbarrier.wait(bars.index(0), 0)
    lo, hi = _wg_dequant(c_ring.index(0).load(al), sz, INT_Z, dt, st)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
    for i in range(steps):
        stage = i % STAGES
        xs = x_ring.index(stage)
        acc = warpgroup_mma(lo, xs.slice(0, BK // 2, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(hi, xs.slice(BK // 2, BK // 2, dim=1).permute((1, 0)), acc, is_async=True)
        # the next step's tile, while these run (the last step re-reads its own codes: unused)
        nx = gl.minimum(i + 1, steps - 1)
        if GROUP != 0:
            sz = gl.load(s_p + nx * BK // GROUP)
        ns = nx % STAGES
        mbarrier.wait(bars.index(ns), (nx // STAGES) & 1)
        nlo, nhi = _wg_dequant(c_ring.index(ns).load(al), sz, INT_Z, dt, st)
        acc = warpgroup_mma_wait(0, deps=(acc, lo, hi))[0]
        lo = nlo
        hi = nhi
        # every warp is done with step i's x and codes: its stage takes step i + STAGES
        gl.thread_barrier()
        nxt = i + STAGES
        _wg_issue(x_desc, w_desc, x_ring, c_ring, bars, stage, off_m, off_n, nxt * BK, nxt < steps)
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(p))

    on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
    if HAS_BIAS:
        acc += gl.load(bias_ptr + on % N).to(gl.float32)[:, None]
    ol: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, W], [0, 1])     # 8 consecutive n per thread
    y = gl.convert_layout(acc.to(out_ptr.dtype.element_ty), ol)
    on = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ol))
    om = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ol))
    mask = (on < N)[:, None] & (om < M)[None, :]
    gl.store(out_ptr + om.to(gl.int64)[None, :] * stride_om + on[:, None], y, mask=mask)

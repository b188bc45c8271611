"""Gluon kernel for the int8 GEMM on Hopper (sm_90) at prefill sizes: TMA ring + wgmma kept in flight.
Launcher: ops/gemm.py (table path "wg"). Reference: reference.scaled_mm / int_mm. The Triton-language
_scaled_mm_kernel (kernels/_gemm.py) computes the same thing and is its CPU twin (Gluon has no interpreter).

Why. Triton 3.6's pipeliner keeps a wgmma in flight only for an fp32 accumulator; with int8's int32 accumulator it
waits for every wgmma before the next k step, so the tensor cores idle while the step's operands are checked in and
the next wgmma is issued (docs/design/gemm.md). Here the schedule is explicit:

  - A [M, K] (activations) and B's rows ([N, K] weight, K-major: wgmma's B operand as the permuted tile) come
    through a STAGES-deep shared-memory ring by TMA, one mbarrier per stage; rows and k past the tensor read as
    zeros, so the k tail adds nothing and the product stays exact;
  - each step issues its wgmma and then waits only for the previous step's (one in flight); once every warp is
    past that wait (CTA barrier), the previous step's stage is refilled with the step STAGES - 1 ahead, which near
    a tile's end is the first steps of the program's next tile (persistent grid, one program per SM at most), so
    those loads run while this tile finishes and stores its output;
  - the epilogue is _scaled_mm_kernel's, in the same order (int32 -> fp32, * scale_a, * scale_b, * scale_c,
    + bias), so both kernels give the same bits; its output goes through shared memory into 16-byte stores.
"""
import triton  # noqa: F401  (Gluon needs Triton's runtime)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def _i8_issue(a_desc, b_desc, a_ring, b_ring, bars, stage, off_m, off_n, k0, pred):
    """TMA copies of step k0's A and B tiles into ring stage `stage`, arriving on its barrier."""
    bar = bars.index(stage)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [off_m, k0], bar, a_ring.index(stage), pred=pred)
    tma.async_copy_global_to_shared(b_desc, [off_n, k0], bar, b_ring.index(stage), pred=pred)


@gluon.jit
def _tile_offsets(tile, num_m, num_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(row, column) offsets of output tile `tile` in grouped order."""
    width = GROUP_M * num_n
    first_m = (tile // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    return (first_m + (tile % width) % gm) * BLOCK_M, ((tile % width) // gm) * BLOCK_N


@gluon.jit
def _i8_wg_kernel(a_desc, b_desc, c_ptr, sa_ptr, sb_ptr, bias_ptr, scale_c, M, N, K, stride_cm,
                  HAS_SCALES: gl.constexpr, SA_PER_ROW: gl.constexpr, SB_PER_COL: gl.constexpr,
                  HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                  GROUP_M: gl.constexpr, STAGES: gl.constexpr):
    """C[M, N] = A @ B.T, int32-exact, with _scaled_mm_kernel's epilogue (no activation). a_desc: TMA descriptor of
    A [M, K] int8, blocks [BLOCK_M, BLOCK_K]; b_desc: of the weight [N, K] int8, blocks [BLOCK_N, BLOCK_K] (the
    block sizes are also constexprs, so that the launch cache, which sees a descriptor only by its class, tells
    them apart). Persistent: program p takes tiles p, p + num_programs, ... in grouped order (GROUP_M row blocks
    share each weight block in L2). BLOCK_M a multiple of 16 x num_warps (the warps split the tile's rows),
    BLOCK_N a power of two <= 128. Every tile takes at least STAGES - 1 k steps (the launcher checks): the refills
    of a tile's last steps are then exactly the next tile's first STAGES - 1 steps."""
    W: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_N, 32])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_m * num_n
    steps = gl.cdiv(K, BLOCK_K)

    a_ring = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_ring = gl.allocate_shared_memory(gl.int8, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for p in gl.static_range(STAGES):
        mbarrier.init(bars.index(p), count=1)

    off_m, off_n = _tile_offsets(pid, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
    for p in gl.static_range(STAGES - 1):
        _i8_issue(a_desc, b_desc, a_ring, b_ring, bars, p, off_m, off_n, p * BLOCK_K, (p < steps) & (pid < num_tiles))
    # the output: 8 consecutive columns per thread (16-byte stores of fp16), through shared memory
    ol: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // BLOCK_N, BLOCK_N // 8], [W, 1], [1, 0])
    it = 0      # ring steps this program has taken: stage it % STAGES, phase (it // STAGES) & 1
    for tile in range(pid, num_tiles, nprog):
        nm, nn = _tile_offsets(tile + nprog, num_m, num_n, BLOCK_M, BLOCK_N, GROUP_M)
        has_next = tile + nprog < num_tiles
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.int32, layout=mma)
        for i in range(steps):
            g = it + i
            stage = g % STAGES
            mbarrier.wait(bars.index(stage), (g // STAGES) & 1)
            acc = warpgroup_mma(a_ring.index(stage), b_ring.index(stage).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=[acc])
            gl.thread_barrier()     # every warpgroup's wgmma of the step before is done: its stage may be refilled
            nxt = i + STAGES - 1
            if nxt < steps:
                _i8_issue(a_desc, b_desc, a_ring, b_ring, bars, (g + STAGES - 1) % STAGES, off_m, off_n,
                          nxt * BLOCK_K, True)
            else:       # the next tile's first steps, loading while this tile ends and stores its output
                _i8_issue(a_desc, b_desc, a_ring, b_ring, bars, (g + STAGES - 1) % STAGES, nm, nn,
                          (nxt - steps) * BLOCK_K, has_next & (nxt - steps < steps))
        acc = warpgroup_mma_wait(0, deps=[acc])
        it += steps

        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        if HAS_SCALES:
            out = acc.to(gl.float32)
            if SA_PER_ROW:
                out = out * gl.load(sa_ptr + rows, mask=rows < M, other=0.0)[:, None]
            else:
                out = out * gl.load(sa_ptr)
            if SB_PER_COL:
                out = out * gl.load(sb_ptr + cols, mask=cols < N, other=0.0)[None, :]
            else:
                out = out * gl.load(sb_ptr)
            out = out * scale_c
            if HAS_BIAS:
                out = out + gl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(gl.float32)[None, :]
            out = gl.convert_layout(out.to(c_ptr.dtype.element_ty), ol)
            rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ol))
            cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ol))
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            gl.store(c_ptr + rows.to(gl.int64)[:, None] * stride_cm + cols[None, :], out, mask=mask)
        else:       # exact int32: straight from the accumulator's layout (no room for its shared-memory copy)
            mask = (rows < M)[:, None] & (cols < N)[None, :]
            gl.store(c_ptr + rows.to(gl.int64)[:, None] * stride_cm + cols[None, :], acc, mask=mask)
        off_m = nm
        off_n = nn
    for p in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(p))

"""Weight-only tensor-core GEMM in the Triton language, computed as out.T = W @ x.T ("swap AB"): the
dequantized weight tile is the MMA's A operand (BLOCK_N rows), x.T the B operand, so a small M (>= 1, padded to
BLOCK_M >= 16) wastes no weight bandwidth. SPLIT_K > 1 splits K over program columns (small grids: few weight
row-blocks and a long K); the last program of a tile adds the partials in a fixed order (_common._splitk_fixup).
Also the CPU twin of the Gluon kernels (tc.py, wg.py) under the interpreter. Launcher: ops/weight_only/launch.py
(path "mm"). Dequantization: dequant.py.
"""
import triton
import triton.language as tl

from .._common import INTERPRET, _cast, _grouped_pid, _k_slice, _pdl_wait, _splitk_fixup
from .dequant import CHUNK, HALF, _scales, _tile


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
                  GROUP_N: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr = False):
    """out.T = W @ x.T with the weight tile as the MMA's A operand in registers (the weight rows fill the MMA's
    M side, so a small M wastes no weight bandwidth). SPLIT_K > 1: program column pid_k covers K_STEP-aligned
    slice pid_k of K; the tile's last program adds the slices' partials in order (_splitk_fixup). PDL: x is read
    and out written only after the wait for the kernel before (_pdl_wait)."""
    _pdl_wait(PDL)
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


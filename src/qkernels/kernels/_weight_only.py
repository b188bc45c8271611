"""Private Triton kernels for weight-only quantized linears (W4A16 / W8A16).
Launchers: ops/weight_only.py. Layout: packed_weight.py. Reference: reference.weight_only_linear.

All three kernels share `_dequant_tile`, which turns a [BLOCK_N, BLOCK_K] tile of packed codes into
fp32 weights (u - z) * s. The tile is handled as [BLOCK_N, NGT, GT] with GT = min(BLOCK_K, G), so
each scale and zero broadcasts over a register axis and no per-element gathers are needed.
Codes become floats without an int->float conversion (a quarter-rate instruction): OR-ing u into
the mantissa of 2**23 gives the float 2**23 + u exactly, and subtracting 2**23 leaves u. Then
w = u * s + (-z * s) is one FMA per element.

  _wo_gemv_kernel:    one x row per program column, fp32 FMA reduction (decode, M = 1).
  _wo_mm_kernel:      tensor cores, computed as out.T = W @ x.T ("swap AB"): the dequantized
                      weight tile is the MMA's A operand (BLOCK_N >= 16 rows), x.T the B operand,
                      so a small M (>= 1, padded to BLOCK_M >= 16) wastes no weight bandwidth.
  _wo_dequant_kernel: writes the dequantized weight, for a cuBLAS GEMM at large M.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _cast


@triton.jit
def _dequant_tile(w_ptr, s_ptr, z_ptr, offs_n, k0, K, stride_wn, stride_sn,
                  BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, EVEN_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_N, BLOCK_K] weights of rows offs_n (in range), columns k0 .. k0 + BLOCK_K.
    GROUP: group length, 0 for one group per row. Columns >= K come out as 0 when not EVEN_K."""
    GT: tl.constexpr = BLOCK_K if (GROUP == 0 or BLOCK_K <= GROUP) else GROUP
    NGT: tl.constexpr = BLOCK_K // GT
    PER_BYTE: tl.constexpr = 8 // BITS
    GTB: tl.constexpr = GT // PER_BYTE
    j = tl.arange(0, NGT)
    i = tl.arange(0, GTB)
    kb = k0 // PER_BYTE + j[None, :, None] * GTB + i[None, None, :]                 # byte column
    ptrs = w_ptr + offs_n[:, None, None].to(tl.int64) * stride_wn + kb
    if EVEN_K:
        b = tl.load(ptrs)
    else:
        b = tl.load(ptrs, mask=kb * PER_BYTE < K, other=0)
    b = b.to(tl.int32)
    if BITS == 4:
        u = tl.join(b & 15, b >> 4)                     # [BN, NGT, GTB, 2]: even k low nibble
        u = tl.reshape(u, (BLOCK_N, NGT, GT))
    else:
        u = b
    uf = (u | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0   # exact: 2**23 + u - 2**23
    if GROUP == 0:
        g = j * 0
    else:
        g = (k0 + j * GT) // GROUP
    s_off = offs_n[:, None].to(tl.int64) * stride_sn + g[None, :]
    if EVEN_K:
        s = tl.load(s_ptr + s_off).to(tl.float32)
    else:
        gmask = (k0 + j * GT < K)[None, :]
        s = tl.load(s_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
    if HAS_ZERO:
        if EVEN_K:
            z = tl.load(z_ptr + s_off).to(tl.float32)
        else:
            z = tl.load(z_ptr + s_off, mask=gmask, other=0.0).to(tl.float32)
    else:
        z = tl.full(s.shape, 2 ** (BITS - 1), tl.float32)
    w = uf * s[:, :, None] + (-z * s)[:, :, None]
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _wo_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, M, N, K,
                    stride_xm, stride_xk, stride_wn, stride_sn, stride_om,
                    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
                    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = rows % N                                   # wrapped: loads need no row mask
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = _dequant_tile(w_ptr, s_ptr, z_ptr, offs_n, k0, K, stride_wn, stride_sn,
                          BITS, GROUP, HAS_ZERO, EVEN_K, BLOCK_N, BLOCK_K)
        xp = x_ptr + m * stride_xm + (k0 + offs_k) * stride_xk
        if EVEN_K:
            xv = tl.load(xp)
        else:
            xv = tl.load(xp, mask=k0 + offs_k < K, other=0.0)
        acc += w * xv.to(tl.float32)[None, :]
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + offs_n).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rows, _cast(out, out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _wo_mm_kernel(x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, M, N, K,
                  stride_xm, stride_xk, stride_wn, stride_sn, stride_om,
                  BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, HAS_BIAS: tl.constexpr,
                  EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_N: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    # grouped ordering: GROUP_N weight row-blocks share their x tiles in L2
    width = GROUP_N * num_pid_m
    group = pid // width
    first_n = group * GROUP_N
    size_n = tl.minimum(num_pid_n - first_n, GROUP_N)
    pid_n = first_n + (pid % width) % size_n
    pid_m = (pid % width) // size_n

    rows_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = rows_n % N
    offs_m = rows_m % M
    offs_k = tl.arange(0, BLOCK_K)
    xt_ptrs = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + offs_k[:, None] * stride_xk   # x.T tile
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = _dequant_tile(w_ptr, s_ptr, z_ptr, offs_n, k0, K, stride_wn, stride_sn,
                          BITS, GROUP, HAS_ZERO, EVEN_K, BLOCK_N, BLOCK_K)
        if EVEN_K:
            xt = tl.load(xt_ptrs)
        else:
            xt = tl.load(xt_ptrs, mask=(k0 + offs_k < K)[:, None], other=0.0)
        if INTERPRET:   # the interpreter's bf16 tl.dot is wrong: same operand values, multiplied in fp32
            acc = tl.dot(_cast(w, xt.dtype).to(tl.float32), xt.to(tl.float32), acc)
        else:
            acc = tl.dot(_cast(w, xt.dtype), xt, acc)
        xt_ptrs += BLOCK_K * stride_xk
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n).to(tl.float32)[:, None]
    o_ptrs = out_ptr + rows_m[None, :].to(tl.int64) * stride_om + rows_n[:, None]
    tl.store(o_ptrs, _cast(acc, out_ptr.dtype.element_ty), mask=(rows_n < N)[:, None] & (rows_m < M)[None, :])


@triton.jit
def _wo_dequant_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_on,
                       BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, EVEN_K: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    k0 = tl.program_id(1) * BLOCK_K
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w = _dequant_tile(w_ptr, s_ptr, z_ptr, rows % N, k0, K, stride_wn, stride_sn,
                      BITS, GROUP, HAS_ZERO, EVEN_K, BLOCK_N, BLOCK_K)
    cols = k0 + tl.arange(0, BLOCK_K)
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * stride_on + cols[None, :]
    tl.store(o_ptrs, _cast(w, out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (cols < K)[None, :])

"""Private Triton kernel for the 8-bit (and packed int4) GEMMs with a fused epilogue.
Launchers: ops/gemm.py. Reference: reference.scaled_mm.

C[M, N] = A[M, K] @ B[K, N] accumulated exactly in int32 (int8 / int4) or in fp32 (fp8), then,
with HAS_SCALES: out = acc * scale_a * scale_b * scale_c (+ bias), activation, cast to C's dtype.
INT4: A is [M, K/2] and B is [K/2, N] bytes, each holding two signed int4 values along K (even k in
the low nibble). The low nibbles of A pair with the low nibbles of B, the high with the high, so the
product is two int8 dots and needs no interleaving.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _cast, _fp8_bits_to_f32, _grouped_pid


@triton.jit
def _activation(x, ACT: tl.constexpr):
    if ACT == 1:      # relu
        x = tl.maximum(x, 0.0)
    elif ACT == 2:    # gelu, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        y = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        x = x * (1.0 - 1.0 / (tl.exp(2.0 * y) + 1.0))     # 0.5 (1 + tanh y) = 1 - 1 / (e^{2y} + 1)
    elif ACT == 3:    # silu
        x = x / (1.0 + tl.exp(-x))
    return x


@triton.jit
def _scaled_mm_kernel(
    a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, scale_c,
    M, N, K,                          # K: logical (unpacked) depth
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    HAS_SCALES: tl.constexpr, SA_PER_ROW: tl.constexpr, SB_PER_COL: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr, ACC_INT: tl.constexpr, INT4: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    # GROUP_M row-blocks share their B tiles in L2
    pid_m, pid_n = _grouped_pid(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M     # wrapped rows: loads need no M/N mask
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    if ACC_INT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    if INT4:
        KP: tl.constexpr = BLOCK_K // 2
        offs_k = tl.arange(0, KP)
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
        k_bytes = K // 2
        for k0 in range(0, k_bytes, KP):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_bytes - k0, other=0).to(tl.int32)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_bytes - k0, other=0).to(tl.int32)
            a_lo = ((a << 28) >> 28).to(tl.int8)
            a_hi = ((a << 24) >> 28).to(tl.int8)
            b_lo = ((b << 28) >> 28).to(tl.int8)
            b_hi = ((b << 24) >> 28).to(tl.int8)
            acc = tl.dot(a_lo, b_lo, acc, out_dtype=tl.int32)
            acc = tl.dot(a_hi, b_hi, acc, out_dtype=tl.int32)
            a_ptrs += KP * stride_ak
            b_ptrs += KP * stride_bk
    else:
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k0, other=0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k0, other=0)
            if ACC_INT:
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            elif INTERPRET:   # the interpreter's fp8 dot decodes NaN (0x7F) as a number: decode exactly
                acc = tl.dot(_fp8_bits_to_f32(a, 3, 7, True), _fp8_bits_to_f32(b, 3, 7, True), acc,
                             out_dtype=tl.float32)
            else:   # fp8 operands arrive as uint8 bits (a masked load cannot fill fp8 with 0)
                acc = tl.dot(a.to(tl.float8e4nv, bitcast=True), b.to(tl.float8e4nv, bitcast=True), acc,
                             out_dtype=tl.float32)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :].to(tl.int64) * stride_cn
    if HAS_SCALES:
        out = acc.to(tl.float32)
        if SA_PER_ROW:
            out = out * tl.load(sa_ptr + rows, mask=rows < M, other=0.0)[:, None]
        else:
            out = out * tl.load(sa_ptr)
        if SB_PER_COL:
            out = out * tl.load(sb_ptr + cols, mask=cols < N, other=0.0)[None, :]
        else:
            out = out * tl.load(sb_ptr)
        out = out * scale_c
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        out = _activation(out, ACT)
        tl.store(c_ptrs, _cast(out, c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptrs, acc, mask=mask)

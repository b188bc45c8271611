"""Private Triton kernel for the 8-bit (and packed int4) GEMMs with a fused epilogue.
Launchers: ops/gemm.py. Reference: reference.scaled_mm.

C[M, N] = A[M, K] @ B[K, N] accumulated exactly in int32 (int8 / int4) or in fp32 (fp8), then,
with HAS_SCALES: out = acc * scale_a * scale_b * scale_c (+ bias), activation, cast to C's dtype.
INT4: A is [M, K/2] and B is [K/2, N] bytes, each holding two signed int4 values along K (even k in
the low nibble). The low nibbles of A pair with the low nibbles of B, the high with the high, so the
product is two int8 dots and needs no interleaving.

_gemv8_kernel: the int8 / fp8 product at decode sizes (one A row per program column) without tensor cores, B
as the [K, N] view of a row-major [N, K] weight. int8: A's row and B's rows are read as 32-bit words of four
codes, and dp4a adds four signed byte products to an int32 lane per instruction: exact, a quarter of an
instruction per weight, so the kernel streams the weight at the memory's pace, with _scaled_mm_kernel's
epilogue (the same bits). The Triton interpreter has no inline PTX: there _dp4a unpacks the bytes (the same
integers). fp8: codes decoded to fp32 (exact products), fp32 sums in another order than the tensor cores'.
With QUANT_A it also quantizes a float A row itself (W8A8 with dynamic per-token activations in one launch).
"""
import triton
import triton.language as tl

from ._common import (INTERPRET, _cast, _finite_or_zero, _fp8_bits_to_f32, _grouped_pid, _k_slice, _pdl_wait,
                      _splitk_fixup)
from ._quant import _quantize_values, _scale_and_zero_point


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
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, ws_ptr, cnt_ptr,
    HAS_SCALES: tl.constexpr, SA_PER_ROW: tl.constexpr, SB_PER_COL: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr, ACC_INT: tl.constexpr, INT4: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr = 1, PDL: tl.constexpr = False,
):
    """C tile (pid_m, pid_n) of program_id(0). With SPLIT_K > 1, program_id(1) takes one BLOCK_K-aligned slice of
    K and the tile's last program adds the partials in slice order (_splitk_fixup into ws_ptr / cnt_ptr: int32
    partials stay exact, fp32 ones are added in the same order on every run), then runs the epilogue. A weight of
    few output tiles at small M (1024 rows at M = 16: 16 tiles of 64 rows) needs the split to put enough programs
    on the GPU to stream the weight at the memory's pace."""
    pid = tl.program_id(0)
    # GROUP_M row-blocks share their B tiles in L2
    pid_m, pid_n = _grouped_pid(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    k_lo, k_hi = _k_slice(K, tl.program_id(1), BLOCK_K, SPLIT_K)
    _pdl_wait(PDL)      # every load below may read what the kernel before wrote (A: an activation just quantized)

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
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (k_lo // 2 + offs_k[None, :]) * stride_ak
        b_ptrs = b_ptr + (k_lo // 2 + offs_k[:, None]) * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
        k_bytes = k_hi // 2
        for k0 in range(k_lo // 2, k_bytes, KP):
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
        a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (k_lo + offs_k[None, :]) * stride_ak
        b_ptrs = b_ptr + (k_lo + offs_k[:, None]) * stride_bk + offs_n[None, :].to(tl.int64) * stride_bn
        for k0 in range(k_lo, k_hi, BLOCK_K):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_hi - k0, other=0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_hi - k0, other=0)
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
    last = True
    if SPLIT_K > 1:
        acc, last = _splitk_fixup(acc, ws_ptr, cnt_ptr, pid, rows[:, None].to(tl.int64) * N + cols[None, :], mask,
                                  M * N, tl.program_id(1), SPLIT_K)
    if last:
        c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_cm + cols[None, :].to(tl.int64) * stride_cn
        _epilogue(acc, c_ptrs, mask, sa_ptr, sb_ptr, bias_ptr, scale_c, rows[:, None], cols[None, :], M, N,
                  HAS_SCALES, SA_PER_ROW, SB_PER_COL, HAS_BIAS, ACT)


@triton.jit
def _epilogue(acc, c_ptrs, mask, sa_ptr, sb_ptr, bias_ptr, scale_c, rows, cols, M, N, HAS_SCALES: tl.constexpr,
              SA_PER_ROW: tl.constexpr, SB_PER_COL: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """acc (int32 / fp32) -> C: with HAS_SCALES acc * scale_a * scale_b * scale_c (+ bias), activation, cast;
    else acc as is. rows / cols broadcast to acc's shape."""
    if HAS_SCALES:
        out = acc.to(tl.float32)
        if SA_PER_ROW:
            out = out * tl.load(sa_ptr + rows, mask=rows < M, other=0.0)
        else:
            out = out * tl.load(sa_ptr)
        _epilogue_after_a(out, c_ptrs, mask, sb_ptr, bias_ptr, scale_c, cols, N, SB_PER_COL, HAS_BIAS, ACT)
    else:
        tl.store(c_ptrs, acc, mask=mask)


@triton.jit
def _epilogue_after_a(out, c_ptrs, mask, sb_ptr, bias_ptr, scale_c, cols, N, SB_PER_COL: tl.constexpr,
                      HAS_BIAS: tl.constexpr, ACT: tl.constexpr):
    """The epilogue from `out` = acc * scale_a (fp32) on: * scale_b * scale_c (+ bias), activation, cast."""
    if SB_PER_COL:
        out = out * tl.load(sb_ptr + cols, mask=cols < N, other=0.0)
    else:
        out = out * tl.load(sb_ptr)
    out = out * scale_c
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    out = _activation(out, ACT)
    tl.store(c_ptrs, _cast(out, c_ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _dp4a(a, b, c):
    """c + the dot product of the four signed bytes of a and of b (int32 words), per element."""
    if INTERPRET:
        for sh in tl.static_range(0, 32, 8):
            c += ((a << (24 - sh)) >> 24) * ((b << (24 - sh)) >> 24)
    else:
        c = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.int32,
                                      is_pure=True, pack=1)
    return c


@triton.jit
def _gemv8_load(ptr, offs, k0, K, FP8: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The step at k0 of the rows at offs ([BLOCK_N, 1] for B, a scalar for A's row): int8 as 32-bit words of
    four codes (BLOCK_K / 4 per row; offs in words), fp8 as bytes (BLOCK_K per row; offs in bytes)."""
    if FP8:
        k = k0 + tl.arange(0, BLOCK_K)
        lim = K
    else:
        k = k0 // 4 + tl.arange(0, BLOCK_K // 4)
        lim = K // 4
        ptr = ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    if EVEN_K:
        v = tl.load(ptr + offs + k)
    else:
        v = tl.load(ptr + offs + k, mask=k < lim, other=0)
    return v


@triton.jit
def _halves(t):
    """A [R, C] tile's even and odd columns (a register renaming where a thread holds them together)."""
    return tl.split(tl.reshape(t, (t.shape[0], t.shape[1] // 2, 2)))


@triton.jit
def _gemv8_acc(w, x, acc, FP8: tl.constexpr):
    """acc + the step's products: int8, dp4a per word (exact int32); fp8, decoded to fp32 (exact products) and
    added four k at a time into a [BLOCK_N, BLOCK_K / 4] accumulator (fp32 FMAs: the same instructions as one
    accumulator per k, a quarter of the registers)."""
    if FP8:
        if INTERPRET:
            wf = _fp8_bits_to_f32(w, 3, 7, True)
            xf = _fp8_bits_to_f32(x, 3, 7, True)
        else:
            wf = w.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            xf = x.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        w0, w1 = _halves(wf)
        x0, x1 = _halves(tl.broadcast_to(xf[None, :], wf.shape))     # in the weight tile's layout: no exchange
        w00, w02 = _halves(w0)
        w01, w03 = _halves(w1)
        x00, x02 = _halves(x0)
        x01, x03 = _halves(x1)
        acc = acc + w00 * x00 + w01 * x01 + w02 * x02 + w03 * x03
    else:
        acc = _dp4a(w, tl.broadcast_to(x[None, :], w.shape), acc)
    return acc


@triton.jit
def _row_absmax(x_ptr, K, XBLOCK: tl.constexpr):
    """max |x[k]| over the finite values of a float row x[0:K], in fp32 (the dynamic per-token quantization's
    statistic: exact, so any order gives the quantize kernel's value), XBLOCK elements per round of loads."""
    amax = tl.zeros((), tl.float32)
    for k0 in range(0, K, XBLOCK):
        k = k0 + tl.arange(0, XBLOCK)
        v = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(_finite_or_zero(v)), axis=0))
    return amax


@triton.jit
def _pack_bytes4(q, R: tl.constexpr):
    """int32 codes [R, 4] -> [R] int32 words, code j in byte j (little-endian: what a word load of the codes gives)."""
    a, b = tl.split(tl.reshape(q, (R, 2, 2)))      # a: j = 0, 2; b: j = 1, 3
    q0, q2 = tl.split(a)
    q1, q3 = tl.split(b)
    return (q0 & 0xFF) | ((q1 & 0xFF) << 8) | ((q2 & 0xFF) << 16) | (q3 << 24)


@triton.jit
def _gemv8_quant_x(x_ptr, k0, K, inv, QMIN: tl.constexpr, QMAX: tl.constexpr, FP8: tl.constexpr,
                   FP_MAX: tl.constexpr, FP8_EMULATE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """A float row's step at k0 quantized with 1 / scale `inv` (the quantize kernel's arithmetic, so its codes):
    in _gemv8_load's layout (int8: [BLOCK_K / 4] words of four codes; fp8: [BLOCK_K] e4m3 bit patterns)."""
    if FP8:
        k = k0 + tl.arange(0, BLOCK_K)
    else:
        k = k0 + tl.arange(0, BLOCK_K // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
    if EVEN_K:
        v = tl.load(x_ptr + k)
    else:
        v = tl.load(x_ptr + k, mask=k < K, other=0.0)
    q = _quantize_values(v.to(tl.float32), inv, 0.0, QMIN, QMAX, FP8, FP_MAX, 3, 7, FP8_EMULATE)
    if not FP8:
        q = _pack_bytes4(q, BLOCK_K // 4)
    return q


@triton.jit
def _gemv8_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, bias_ptr, scale_c, ws_ptr, cnt_ptr, M, N, K,
                  stride_am, stride_bn, stride_cm,
                  HAS_SCALES: tl.constexpr, SA_PER_ROW: tl.constexpr, SB_PER_COL: tl.constexpr,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, FP8: tl.constexpr, EVEN_K: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PDL: tl.constexpr = False,
                  QUANT_A: tl.constexpr = False, QMIN: tl.constexpr = 0, QMAX: tl.constexpr = 0,
                  QSYM: tl.constexpr = 1.0, FP_MAX: tl.constexpr = 0.0, FP8_EMULATE: tl.constexpr = False,
                  XBLOCK: tl.constexpr = 0):
    """C[m, n] for BLOCK_N columns n and row m = program_id(1); K split SPLIT_K ways over program_id(2) (the tile's
    last program adds the partials in slice order: int32 partials stay exact). int8: strides in bytes and K
    multiples of 4 (the launcher checks). The first step's B is loaded before _pdl_wait (weights).

    QUANT_A (W8A8 at decode sizes, one launch): A is the float activation (fp16 / bf16, stride in elements), quantized
    per row inside the kernel: every program takes its row's absmax over all of K (XBLOCK at a time, up to 64
    elements per thread: one round of loads for most rows; the row is a few KB, from cache for most programs), the
    quantize kernel's scale from it, and quantizes its steps of the row as it goes; scale_a is that scale (sa_ptr is
    unread). The same codes and scale as quantize(x, fmt, "row"), so int8 gives the bits of quantize + GEMM."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = rows % N                                                    # wrapped: loads need no row mask
    unit = 1 if FP8 else 4
    rows_b = offs_n.to(tl.int64) * (stride_bn // unit)
    k_lo, k_hi = _k_slice(K, tl.program_id(2), BLOCK_K, SPLIT_K)
    w = _gemv8_load(b_ptr, rows_b[:, None], k_lo, K, FP8, EVEN_K, BLOCK_K)
    _pdl_wait(PDL)
    if QUANT_A:
        x_row = a_ptr + m * stride_am
        amax = _row_absmax(x_row, K, XBLOCK)
        scale_a = _scale_and_zero_point(amax, amax, amax, QSYM, QMIN, QMAX, True)[0]
        inv = tl.math.div_rn(1.0, scale_a)
        x = _gemv8_quant_x(x_row, k_lo, K, inv, QMIN, QMAX, FP8, FP_MAX, FP8_EMULATE, EVEN_K, BLOCK_K)
    else:
        x_row = m * (stride_am // unit)
        x = _gemv8_load(a_ptr, x_row, k_lo, K, FP8, EVEN_K, BLOCK_K)
    if FP8:
        acc = _gemv8_acc(w, x, tl.zeros((BLOCK_N, BLOCK_K // 4), tl.float32), FP8)
    else:
        acc = _gemv8_acc(w, x, tl.zeros((BLOCK_N, BLOCK_K // 4), tl.int32), FP8)
    for k0 in range(k_lo + BLOCK_K, k_hi, BLOCK_K):
        w = _gemv8_load(b_ptr, rows_b[:, None], k0, K, FP8, EVEN_K, BLOCK_K)
        if QUANT_A:
            x = _gemv8_quant_x(x_row, k0, K, inv, QMIN, QMAX, FP8, FP_MAX, FP8_EMULATE, EVEN_K, BLOCK_K)
        else:
            x = _gemv8_load(a_ptr, x_row, k0, K, FP8, EVEN_K, BLOCK_K)
        acc = _gemv8_acc(w, x, acc, FP8)
    tot = tl.sum(acc, axis=1)
    o_mask = rows < N
    last = True
    if SPLIT_K > 1:
        tot, last = _splitk_fixup(tot, ws_ptr, cnt_ptr, m * tl.num_programs(0) + pid_n, m * N + rows, o_mask, M * N,
                                  tl.program_id(2), SPLIT_K)
    if last:
        if QUANT_A:
            _epilogue_after_a(tot.to(tl.float32) * scale_a, c_ptr + m * stride_cm + rows, o_mask, sb_ptr, bias_ptr,
                              scale_c, rows, N, SB_PER_COL, HAS_BIAS, ACT)
        else:
            _epilogue(tot, c_ptr + m * stride_cm + rows, o_mask, sa_ptr, sb_ptr, bias_ptr, scale_c, m, rows, M, N,
                      HAS_SCALES, SA_PER_ROW, SB_PER_COL, HAS_BIAS, ACT)

"""Private Triton kernels for the fused LLM blocks: RMSNorm / LayerNorm (optional residual add and
per-row output quantization), SiLU-and-mul (optional quantization) and softmax. Launchers:
ops/fused.py. Numerics: qkernels.reference (rms_norm, layer_norm, silu_and_mul, softmax).

Every kernel views its input as rows [M, N] with a unit column stride. Arithmetic is fp32; the norms'
row sums are accumulated in fp64 (see _rstd). The float output is rounded once to the output dtype; the fused quantization quantizes that
rounded value with the exact arithmetic of kernels/_quant.py, so `op(..., quantize=f)` equals
`quantize(op(...), f, "row")` bit for bit.

Two code paths per kernel, picked by the constexpr ONE_BLOCK: a row that fits in one block
(N <= BLOCK_N) is loaded once and kept in registers; longer rows are walked in BLOCK_N chunks, one
row per program, reading the row again for each pass (statistics, then output) from L2.
"""
import triton
import triton.language as tl

from ._common import _cast, _finite_or_zero, _pdl_wait, _silu_mul_narrow
from ._quant import _quantize_values, _scale_and_zero_point


@triton.jit
def _rstd(sum_sq, N, eps):
    """sum_sq: fp64 row sums of squares (products of fp32 values are exact in fp64, so the sum does
    not depend on the reduction order at fp32 precision: the plain and the quantizing kernel, whose
    layouts and reduction trees differ, get the same fp32 statistics)."""
    ms = (sum_sq / N).to(tl.float32)
    return tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))


@triton.jit
def _mean(row_sum, N):
    return (row_sum / N).to(tl.float32)


@triton.jit
def _load_h(x_ptr, r_ptr, offs_x, offs_r, mask, HAS_RES: tl.constexpr):
    """x (+ residual, rounded to x's dtype like an eager `x + residual`) as fp32."""
    h = tl.load(x_ptr + offs_x, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + offs_r, mask=mask, other=0.0).to(tl.float32)
        h = _cast(h + r, x_ptr.dtype.element_ty).to(tl.float32)
    return h


@triton.jit
def _load_affine(w_ptr, b_ptr, cols, cmask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """The norm's weight and bias at cols, fp32 (zeros where absent)."""
    w = tl.zeros(cols.shape, tl.float32)
    b = tl.zeros(cols.shape, tl.float32)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    return w, b


@triton.jit
def _affine(y, w, b, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        y = y * w[None, :]
    if HAS_B:
        y = y + b[None, :]
    return y


@triton.jit
def _row_scale(amax, QSYM: tl.constexpr):
    scale, zp = _scale_and_zero_point(amax, amax, amax, QSYM, 0, 0, True)
    return scale


@triton.jit
def _store_out(y_ptr, offs, mask, yr, inv, QUANT: tl.constexpr, QMAX: tl.constexpr, IS_FP8: tl.constexpr,
               FP8_EMULATE: tl.constexpr):
    """Store the rounded output yr (fp32 values), or its codes with per-row 1/scale `inv`."""
    if QUANT:
        q = _quantize_values(yr, inv[:, None], tl.zeros_like(inv)[:, None], -QMAX - 1, QMAX, IS_FP8, QMAX * 1.0,
                             3, 7, FP8_EMULATE)
        tl.store(y_ptr + offs, q.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(y_ptr + offs, yr.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_rows(y_ptr, s_ptr, rows, rmask, offs, mask, yd, QUANT: tl.constexpr, QMAX: tl.constexpr,
                IS_FP8: tl.constexpr, FP8_EMULATE: tl.constexpr, BLOCK_M: tl.constexpr):
    """Store whole rows yd (already in the output dtype) as they are, or (QUANT) as codes with their
    per-row scales."""
    yr = yd.to(tl.float32)
    inv = tl.zeros([BLOCK_M], tl.float32)
    if QUANT:
        scale = _row_scale(tl.max(tl.abs(_finite_or_zero(yr)), axis=1), QMAX)
        tl.store(s_ptr + rows, scale, mask=rmask)
        inv = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), scale)
    _store_out(y_ptr, offs, mask, yr, inv, QUANT, QMAX, IS_FP8, FP8_EMULATE)


@triton.jit
def _norm_chunk(x_ptr, r_ptr, w_ptr, b_ptr, row_x, row_r, rmask, start, N, mean, rstd, BLOCK_N: tl.constexpr,
                HAS_RES: tl.constexpr, RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                DT: tl.constexpr):
    """Columns [start, start + BLOCK_N) of the normalized rows, rounded to DT, as fp32 values; with the
    column indices and the element mask (the multi-pass kernel recomputes them in each later pass)."""
    cols = start + tl.arange(0, BLOCK_N)
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    h = _load_h(x_ptr, r_ptr, row_x + cols[None, :], row_r + cols[None, :], mask, HAS_RES)
    if not RMS:
        h = h - mean[:, None]
    w, b = _load_affine(w_ptr, b_ptr, cols, cmask, HAS_W, HAS_B)
    yr = _cast(_affine(h * rstd[:, None], w, b, HAS_W, HAS_B), DT).to(tl.float32)
    return yr, cols, mask


@triton.jit
def _norm_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, rout_ptr, s_ptr,
    M, N, eps,
    stride_xm, stride_rm, stride_ym, stride_om,
    RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_FP8: tl.constexpr, FP8_EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """RMSNorm (RMS) or LayerNorm of h = x (+ residual) per row; writes y (or its codes and per-row
    scales) and, with HAS_RES, the updated residual h. One block: the weight and bias are fetched before the
    programmatic-dependent-launch wait (no kernel writes them), so a decode step's norm waits only on its rows."""
    if ONE_BLOCK:
        w, b = _load_affine(w_ptr, b_ptr, tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_N) < N, HAS_W, HAS_B)
    _pdl_wait(PDL)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    row_x = rows[:, None] * stride_xm
    row_r = rows[:, None] * stride_rm
    row_y = rows[:, None] * stride_ym
    row_o = rows[:, None] * stride_om
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        cmask = cols < N
        mask = rmask[:, None] & cmask[None, :]
        h = _load_h(x_ptr, r_ptr, row_x + cols[None, :], row_r + cols[None, :], mask, HAS_RES)
        if HAS_RES:
            tl.store(rout_ptr + row_o + cols[None, :], h.to(DT), mask=mask)
        if RMS:
            h64 = h.to(tl.float64)
            y = h * _rstd(tl.sum(h64 * h64, axis=1), N, eps)[:, None]
        else:
            mean = _mean(tl.sum(h.to(tl.float64), axis=1), N)
            d = tl.where(mask, h - mean[:, None], 0.0)
            d64 = d.to(tl.float64)
            y = d * _rstd(tl.sum(d64 * d64, axis=1), N, eps)[:, None]
        yd = _cast(_affine(y, w, b, HAS_W, HAS_B), DT)
        _store_rows(y_ptr, s_ptr, rows, rmask, row_y + cols[None, :], mask, yd, QUANT, QMAX, IS_FP8, FP8_EMULATE,
                    BLOCK_M)
    else:
        # pass 1: statistics (and the residual output)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float64)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            h = _load_h(x_ptr, r_ptr, row_x + cols[None, :], row_r + cols[None, :], mask, HAS_RES)
            if HAS_RES:
                tl.store(rout_ptr + row_o + cols[None, :], h.to(DT), mask=mask)
            h64 = h.to(tl.float64)
            if RMS:
                acc += h64 * h64
            else:
                acc += h64
        mean = tl.zeros([BLOCK_M], tl.float32)
        if RMS:
            rstd = _rstd(tl.sum(acc, axis=1), N, eps)
        else:
            mean = _mean(tl.sum(acc, axis=1), N)
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float64)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                mask = rmask[:, None] & (cols < N)[None, :]
                h = _load_h(x_ptr, r_ptr, row_x + cols[None, :], row_r + cols[None, :], mask, HAS_RES)
                d = tl.where(mask, h - mean[:, None], 0.0).to(tl.float64)
                acc += d * d
            rstd = _rstd(tl.sum(acc, axis=1), N, eps)
        # pass 2 (quantized output): the row's absmax of the rounded output
        inv = tl.zeros([BLOCK_M], tl.float32)
        if QUANT:
            amax = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                yr, cols, mask = _norm_chunk(x_ptr, r_ptr, w_ptr, b_ptr, row_x, row_r, rmask, start, N, mean, rstd,
                                             BLOCK_N, HAS_RES, RMS, HAS_W, HAS_B, DT)
                amax = tl.maximum(amax, tl.where(mask, tl.abs(_finite_or_zero(yr)), 0.0))
            scale = _row_scale(tl.max(amax, axis=1), QMAX)
            tl.store(s_ptr + rows, scale, mask=rmask)
            inv = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), scale)
        # last pass: the output
        for start in range(0, N, BLOCK_N):
            yr, cols, mask = _norm_chunk(x_ptr, r_ptr, w_ptr, b_ptr, row_x, row_r, rmask, start, N, mean, rstd,
                                         BLOCK_N, HAS_RES, RMS, HAS_W, HAS_B, DT)
            _store_out(y_ptr, row_y + cols[None, :], mask, yr, inv, QUANT, QMAX, IS_FP8, FP8_EMULATE)


@triton.jit
def _silu_mul(g, u, DT: tl.constexpr):
    """silu(g) * u in fp32, rounded to DT, returned as fp32 values."""
    return _silu_mul_narrow(g, u, DT).to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, y_ptr, s_ptr, M, I, stride_xm, stride_ym,
    QUANT: tl.constexpr, QMAX: tl.constexpr, IS_FP8: tl.constexpr, FP8_EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """y[m, j] = silu(x[m, j]) * x[m, I + j]. Without QUANT the grid is 2-D (row blocks x column
    blocks); with QUANT a program owns whole rows (one block, or a two-pass loop)."""
    _pdl_wait(PDL)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    row_x = rows[:, None] * stride_xm
    row_y = rows[:, None] * stride_ym
    if ONE_BLOCK:
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < I)[None, :]
        g = tl.load(x_ptr + row_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row_x + I + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        _store_rows(y_ptr, s_ptr, rows, rmask, row_y + cols[None, :], mask, _silu_mul_narrow(g, u, DT), QUANT, QMAX,
                    IS_FP8, FP8_EMULATE, BLOCK_M)
    else:
        amax = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for start in range(0, I, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < I)[None, :]
            g = tl.load(x_ptr + row_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + row_x + I + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.where(mask, tl.abs(_finite_or_zero(_silu_mul(g, u, DT))), 0.0))
        scale = _row_scale(tl.max(amax, axis=1), QMAX)
        tl.store(s_ptr + rows, scale, mask=rmask)
        inv = tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), scale)
        for start in range(0, I, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < I)[None, :]
            g = tl.load(x_ptr + row_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            u = tl.load(x_ptr + row_x + I + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            _store_out(y_ptr, row_y + cols[None, :], mask, _silu_mul(g, u, DT), inv, QUANT, QMAX, IS_FP8,
                       FP8_EMULATE)


@triton.jit
def _softmax_logits(x_ptr, offs, rows, cols, mask, scale, L_Q, OFFSET, CAUSAL: tl.constexpr):
    """x * scale in fp32; padding and (CAUSAL) columns past the row's diagonal read as -inf."""
    s = tl.load(x_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32) * scale
    if CAUSAL:
        i = (rows % L_Q)[:, None]
        s = tl.where(cols[None, :] <= i + OFFSET, s, float("-inf"))
    return tl.where(mask, s, float("-inf"))


@triton.jit
def _softmax_inv(m, denom, has_nan, BLOCK_M: tl.constexpr):
    """1 / denominator per row: 0 for rows with no finite logit, NaN for rows holding a NaN."""
    inv = tl.where(m == float("-inf"), 0.0, tl.math.div_rn(tl.full([BLOCK_M], 1.0, tl.float32), denom))
    return tl.where(has_nan, float("nan"), inv)


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr, M, N, scale, L_Q, OFFSET, stride_xm, stride_ym,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr,
):
    """softmax(x * scale) per row in fp32. CAUSAL: row m is query i = m % L_Q and sees columns
    j <= i + OFFSET (OFFSET = N - L_Q, the key/query length difference). A row with no finite logit
    (all -inf or all masked) gives zeros; a NaN or +inf logit gives NaN in its row (as torch)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    row_x = rows[:, None] * stride_xm
    row_y = rows[:, None] * stride_ym
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols < N)[None, :]
        s = _softmax_logits(x_ptr, row_x + cols[None, :], rows, cols, mask, scale, L_Q, OFFSET, CAUSAL)
        m = tl.max(s, axis=1)
        has_nan = tl.max((s != s).to(tl.int32), axis=1) > 0
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp(s - m_safe[:, None])
        denom = tl.sum(e, axis=1)
        inv = _softmax_inv(m, denom, has_nan, BLOCK_M)
        tl.store(y_ptr + row_y + cols[None, :], _cast(e * inv[:, None], y_ptr.dtype.element_ty), mask=mask)
    else:
        # online pass: per-lane running max and rescaled sum, merged at the end
        m_vec = tl.full([BLOCK_M, BLOCK_N], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        nan_vec = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            s = _softmax_logits(x_ptr, row_x + cols[None, :], rows, cols, mask, scale, L_Q, OFFSET, CAUSAL)
            nan_vec = nan_vec | (s != s).to(tl.int32)
            m_new = tl.maximum(m_vec, s)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_vec = s_vec * tl.exp(m_vec - m_ref) + tl.exp(s - m_ref)
            m_vec = m_new
        m = tl.max(m_vec, axis=1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.sum(s_vec * tl.exp(m_vec - m_safe[:, None]), axis=1)
        inv = _softmax_inv(m, denom, tl.max(nan_vec, axis=1) > 0, BLOCK_M)
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = rmask[:, None] & (cols < N)[None, :]
            s = _softmax_logits(x_ptr, row_x + cols[None, :], rows, cols, mask, scale, L_Q, OFFSET, CAUSAL)
            tl.store(y_ptr + row_y + cols[None, :], _cast(tl.exp(s - m_safe[:, None]) * inv[:, None],
                                                          y_ptr.dtype.element_ty), mask=mask)

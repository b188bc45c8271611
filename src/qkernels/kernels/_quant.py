"""Private Triton kernels for quantize / dequantize / int4 packing. Launchers: ops/quant.py.

Every kernel views its input as [M, K] (rows x last dim). Format behaviour is selected by
constexprs: QMIN/QMAX (integer clamp range), QSYM (symmetric divisor Q), IS_FP8 with FP_MAX,
FP8_MAN/FP8_BIAS and FP8_EMULATE, SYMMETRIC, STATIC (scales given) and PACK4 (int4 packed output).
Numerics are documented in qkernels/reference.py and match it bit for bit.
"""
import triton
import triton.language as tl

from ._common import (_cast, _f32_to_fp8_bits, _finite_or_zero, _fp8_bits_to_f32, _pack_nibbles, _pdl_wait, _rint,
                      _unpack_nibbles)


@triton.jit
def _scale_and_zero_point(amax, lo, hi, QSYM: tl.constexpr, QMIN: tl.constexpr, QMAX: tl.constexpr,
                          SYMMETRIC: tl.constexpr):
    if SYMMETRIC:
        scale = tl.maximum(tl.math.div_rn(amax, QSYM), 1.1754943508222875e-38)
        scale = tl.where(amax == 0.0, 1.0, scale)
        zp = tl.zeros_like(scale)
    else:
        rng = hi - lo
        scale = tl.maximum(tl.math.div_rn(rng, QMAX - QMIN + 0.0), 1.1754943508222875e-38)
        scale = tl.where(rng == 0.0, 1.0, scale)
        zp = tl.minimum(tl.maximum(QMIN - _rint(tl.math.div_rn(lo, scale)), QMIN + 0.0), QMAX + 0.0)
    return scale, zp


@triton.jit
def _quantize_values(x, inv, zp, QMIN: tl.constexpr, QMAX: tl.constexpr, IS_FP8: tl.constexpr,
                     FP_MAX: tl.constexpr, FP8_MAN: tl.constexpr, FP8_BIAS: tl.constexpr,
                     FP8_EMULATE: tl.constexpr):
    """fp32 x -> int32 codes (integer formats) or uint8 fp8 bits."""
    y = x * inv
    if IS_FP8:
        y = tl.minimum(tl.maximum(y, -FP_MAX), FP_MAX)
        y = tl.where(x != x, float("nan"), y)
        return _f32_to_fp8_bits(y, FP8_MAN, FP8_BIAS, FP8_EMULATE)
    else:
        # clamp before rounding (same result: bounds are integers), keeps _rint exact and FMA-free
        y = tl.minimum(tl.maximum(y, QMIN - zp), QMAX - zp)
        y = _rint(y)
        y = tl.where(x != x, 0.0, y)
        return (y + zp).to(tl.int32)


@triton.jit
def _row_stats(x, SYMMETRIC: tl.constexpr):
    """Per-row (axis 1) absmax, or min/max clipped at 0, of finite values."""
    xf = _finite_or_zero(x)
    if SYMMETRIC:
        amax = tl.max(tl.abs(xf), axis=1)
        return amax, amax, amax
    else:
        lo = tl.minimum(tl.min(xf, axis=1), 0.0)
        hi = tl.maximum(tl.max(xf, axis=1), 0.0)
        return lo, lo, hi


@triton.jit
def _store_codes(q, q_row, start, seg_mask, SEG, PACK4: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_S: tl.constexpr):
    """Store codes for columns [start, start + BLOCK_S) of BLOCK_R segments (row pointers q_row)."""
    if PACK4:
        HALF: tl.constexpr = BLOCK_S // 2
        cols_half = start // 2 + tl.arange(0, HALF)
        pmask = seg_mask[:, None] & (cols_half < SEG // 2)[None, :]
        tl.store(q_row[:, None] + cols_half[None, :], _pack_nibbles(q, BLOCK_R, BLOCK_S), mask=pmask)
    else:
        cols = start + tl.arange(0, BLOCK_S)
        mask = seg_mask[:, None] & (cols < SEG)[None, :]
        tl.store(q_row[:, None] + cols[None, :], q.to(q_row.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_segments_kernel(
    x_ptr, q_ptr, scale_ptr, zp_ptr,
    num_segs, SEG, G,                   # segments, segment length, segments per row
    stride_xm, stride_xk, stride_qm,
    QMIN: tl.constexpr, QMAX: tl.constexpr, QSYM: tl.constexpr, IS_FP8: tl.constexpr,
    FP_MAX: tl.constexpr, FP8_MAN: tl.constexpr, FP8_BIAS: tl.constexpr, FP8_EMULATE: tl.constexpr,
    SYMMETRIC: tl.constexpr, STATIC: tl.constexpr, PACK4: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, ONE_CHUNK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Row-wise and group-wise quantization. Segment s = m * G + g covers x[m, g*SEG:(g+1)*SEG].
    With ONE_CHUNK (a segment fits one block) dynamic scales take a single pass over the data;
    longer segments are read twice (statistics, then codes)."""
    _pdl_wait(PDL)
    pid = tl.program_id(0)
    segs = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    seg_mask = segs < num_segs
    m = (segs // G).to(tl.int64)
    g = (segs % G).to(tl.int64)
    x_row = x_ptr + m * stride_xm + g * SEG * stride_xk          # [BLOCK_R] pointers
    if PACK4:
        q_row = q_ptr + m * stride_qm + g * (SEG // 2)
    else:
        q_row = q_ptr + m * stride_qm + g * SEG
    cols = tl.arange(0, BLOCK_S)

    if ONE_CHUNK:
        mask = seg_mask[:, None] & (cols < SEG)[None, :]
        x = tl.load(x_row[:, None] + cols[None, :].to(tl.int64) * stride_xk, mask=mask, other=0.0)
        x = x.to(tl.float32)
        if STATIC:
            scale = tl.load(scale_ptr + segs, mask=seg_mask, other=1.0)
            if SYMMETRIC:
                zp = tl.zeros_like(scale)
            else:
                zp = tl.load(zp_ptr + segs, mask=seg_mask, other=0).to(tl.float32)
        else:
            a, lo, hi = _row_stats(x, SYMMETRIC)
            scale, zp = _scale_and_zero_point(a, lo, hi, QSYM, QMIN, QMAX, SYMMETRIC)
            tl.store(scale_ptr + segs, scale, mask=seg_mask)
            if not SYMMETRIC:
                tl.store(zp_ptr + segs, zp.to(tl.int32), mask=seg_mask)
        inv = tl.math.div_rn(tl.full([BLOCK_R], 1.0, tl.float32), scale)
        q = _quantize_values(x, inv[:, None], zp[:, None], QMIN, QMAX, IS_FP8, FP_MAX, FP8_MAN, FP8_BIAS,
                             FP8_EMULATE)
        _store_codes(q, q_row, 0, seg_mask, SEG, PACK4, BLOCK_R, BLOCK_S)
    else:
        if STATIC:
            scale = tl.load(scale_ptr + segs, mask=seg_mask, other=1.0)
            if SYMMETRIC:
                zp = tl.zeros_like(scale)
            else:
                zp = tl.load(zp_ptr + segs, mask=seg_mask, other=0).to(tl.float32)
        else:
            a_acc = tl.zeros([BLOCK_R], dtype=tl.float32)
            lo_acc = tl.zeros([BLOCK_R], dtype=tl.float32)
            hi_acc = tl.zeros([BLOCK_R], dtype=tl.float32)
            for start in range(0, SEG, BLOCK_S):
                mask = seg_mask[:, None] & ((start + cols) < SEG)[None, :]
                x = tl.load(x_row[:, None] + (start + cols)[None, :].to(tl.int64) * stride_xk, mask=mask,
                            other=0.0).to(tl.float32)
                a, lo, hi = _row_stats(x, SYMMETRIC)
                a_acc = tl.maximum(a_acc, a)
                lo_acc = tl.minimum(lo_acc, lo)
                hi_acc = tl.maximum(hi_acc, hi)
            scale, zp = _scale_and_zero_point(a_acc, lo_acc, hi_acc, QSYM, QMIN, QMAX, SYMMETRIC)
            tl.store(scale_ptr + segs, scale, mask=seg_mask)
            if not SYMMETRIC:
                tl.store(zp_ptr + segs, zp.to(tl.int32), mask=seg_mask)
        inv = tl.math.div_rn(tl.full([BLOCK_R], 1.0, tl.float32), scale)
        for start in range(0, SEG, BLOCK_S):
            mask = seg_mask[:, None] & ((start + cols) < SEG)[None, :]
            x = tl.load(x_row[:, None] + (start + cols)[None, :].to(tl.int64) * stride_xk, mask=mask,
                        other=0.0).to(tl.float32)
            q = _quantize_values(x, inv[:, None], zp[:, None], QMIN, QMAX, IS_FP8, FP_MAX, FP8_MAN,
                                 FP8_BIAS, FP8_EMULATE)
            _store_codes(q, q_row, start, seg_mask, SEG, PACK4, BLOCK_R, BLOCK_S)


@triton.jit
def _stats_partials_kernel(x_ptr, partial_ptr, N, CHUNK, num_partials, SYMMETRIC: tl.constexpr,
                           BLOCK: tl.constexpr):
    """Per-program absmax (symmetric) or min/max (asymmetric) of finite values over a chunk of a
    contiguous tensor: pass 1 of dynamic per-tensor quantization."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * CHUNK
    offs = tl.arange(0, BLOCK)
    a_acc = tl.zeros([BLOCK], dtype=tl.float32)
    lo_acc = tl.zeros([BLOCK], dtype=tl.float32)
    hi_acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, CHUNK, BLOCK):
        idx = base + start + offs
        x = tl.load(x_ptr + idx, mask=(idx < N) & (start + offs < CHUNK), other=0.0).to(tl.float32)
        xf = _finite_or_zero(x)
        if SYMMETRIC:
            a_acc = tl.maximum(a_acc, tl.abs(xf))
        else:
            lo_acc = tl.minimum(lo_acc, xf)
            hi_acc = tl.maximum(hi_acc, xf)
    if SYMMETRIC:
        tl.store(partial_ptr + pid, tl.max(a_acc, axis=0))
    else:
        tl.store(partial_ptr + pid, tl.min(lo_acc, axis=0))
        tl.store(partial_ptr + num_partials + pid, tl.max(hi_acc, axis=0))


@triton.jit
def _quantize_flat_kernel(
    x_ptr, q_ptr, scale_ptr, zp_ptr, partial_ptr, N, num_partials,
    QMIN: tl.constexpr, QMAX: tl.constexpr, QSYM: tl.constexpr, IS_FP8: tl.constexpr,
    FP_MAX: tl.constexpr, FP8_MAN: tl.constexpr, FP8_BIAS: tl.constexpr, FP8_EMULATE: tl.constexpr,
    SYMMETRIC: tl.constexpr, STATIC: tl.constexpr, PACK4: tl.constexpr,
    BLOCK: tl.constexpr, P_BLOCK: tl.constexpr,
):
    """Per-tensor quantization of a contiguous tensor. Dynamic: reduces pass 1's partials (a few
    hundred floats, L2-resident) in every program; program 0 writes the scale."""
    pid = tl.program_id(0)
    if STATIC:
        scale = tl.load(scale_ptr)
        if SYMMETRIC:
            zp = 0.0
        else:
            zp = tl.load(zp_ptr).to(tl.float32)
    else:
        p = tl.arange(0, P_BLOCK)
        pm = p < num_partials
        if SYMMETRIC:
            amax = tl.max(tl.load(partial_ptr + p, mask=pm, other=0.0), axis=0)
            scale, zp = _scale_and_zero_point(amax, amax, amax, QSYM, QMIN, QMAX, SYMMETRIC)
        else:
            lo = tl.min(tl.load(partial_ptr + p, mask=pm, other=0.0), axis=0)
            hi = tl.max(tl.load(partial_ptr + num_partials + p, mask=pm, other=0.0), axis=0)
            scale, zp = _scale_and_zero_point(lo, lo, hi, QSYM, QMIN, QMAX, SYMMETRIC)
        if pid == 0:
            tl.store(scale_ptr, scale)
            if not SYMMETRIC:
                tl.store(zp_ptr, zp.to(tl.int32))
    inv = tl.math.div_rn(1.0, scale)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    q = _quantize_values(x, inv, zp, QMIN, QMAX, IS_FP8, FP_MAX, FP8_MAN, FP8_BIAS, FP8_EMULATE)
    if PACK4:
        packed = tl.reshape(_pack_nibbles(tl.reshape(q, (1, BLOCK)), 1, BLOCK), (BLOCK // 2,))
        offs_half = pid.to(tl.int64) * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
        tl.store(q_ptr + offs_half, packed, mask=offs_half < N // 2)
    else:
        tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _quantize_columns_kernel(
    x_ptr, q_ptr, scale_ptr, zp_ptr, M, K,
    stride_xm, stride_xk, stride_qm,
    QMIN: tl.constexpr, QMAX: tl.constexpr, QSYM: tl.constexpr, IS_FP8: tl.constexpr,
    FP_MAX: tl.constexpr, FP8_MAN: tl.constexpr, FP8_BIAS: tl.constexpr, FP8_EMULATE: tl.constexpr,
    SYMMETRIC: tl.constexpr, STATIC: tl.constexpr, PACK4: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Column-wise quantization: a program owns BLOCK_K columns; dynamic scales read them twice."""
    pid = tl.program_id(0)
    cols = pid * BLOCK_K + tl.arange(0, BLOCK_K)
    cmask = cols < K
    rows0 = tl.arange(0, BLOCK_M)
    if STATIC:
        scale = tl.load(scale_ptr + cols, mask=cmask, other=1.0)
        if SYMMETRIC:
            zp = tl.zeros_like(scale)
        else:
            zp = tl.load(zp_ptr + cols, mask=cmask, other=0).to(tl.float32)
    else:
        a_acc = tl.zeros([BLOCK_K], dtype=tl.float32)
        lo_acc = tl.zeros([BLOCK_K], dtype=tl.float32)
        hi_acc = tl.zeros([BLOCK_K], dtype=tl.float32)
        for m0 in range(0, M, BLOCK_M):
            rows = (m0 + rows0).to(tl.int64)
            mask = (rows < M)[:, None] & cmask[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :].to(tl.int64) * stride_xk,
                        mask=mask, other=0.0).to(tl.float32)
            xf = _finite_or_zero(x)
            if SYMMETRIC:
                a_acc = tl.maximum(a_acc, tl.max(tl.abs(xf), axis=0))
            else:
                lo_acc = tl.minimum(lo_acc, tl.min(xf, axis=0))
                hi_acc = tl.maximum(hi_acc, tl.max(xf, axis=0))
        if SYMMETRIC:
            scale, zp = _scale_and_zero_point(a_acc, a_acc, a_acc, QSYM, QMIN, QMAX, SYMMETRIC)
        else:
            scale, zp = _scale_and_zero_point(lo_acc, lo_acc, hi_acc, QSYM, QMIN, QMAX, SYMMETRIC)
        tl.store(scale_ptr + cols, scale, mask=cmask)
        if not SYMMETRIC:
            tl.store(zp_ptr + cols, zp.to(tl.int32), mask=cmask)
    inv = tl.math.div_rn(tl.full([BLOCK_K], 1.0, tl.float32), scale)
    HALF: tl.constexpr = BLOCK_K // 2
    cols_half = pid * HALF + tl.arange(0, HALF)
    for m0 in range(0, M, BLOCK_M):
        rows = (m0 + rows0).to(tl.int64)
        mask = (rows < M)[:, None] & cmask[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :].to(tl.int64) * stride_xk,
                    mask=mask, other=0.0).to(tl.float32)
        q = _quantize_values(x, inv[None, :], zp[None, :], QMIN, QMAX, IS_FP8, FP_MAX, FP8_MAN, FP8_BIAS,
                             FP8_EMULATE)
        if PACK4:
            packed = _pack_nibbles(q, BLOCK_M, BLOCK_K)
            pmask = (rows < M)[:, None] & (cols_half < K // 2)[None, :]
            tl.store(q_ptr + rows[:, None] * stride_qm + cols_half[None, :], packed, mask=pmask)
        else:
            tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequantize_kernel(
    q_ptr, scale_ptr, zp_ptr, out_ptr, M, K, GROUP, G, stride_qm, stride_om,
    GRAN: tl.constexpr,            # 0 tensor, 1 row, 2 column, 3 group
    HAS_ZP: tl.constexpr, IS_INT4: tl.constexpr, IS_FP8: tl.constexpr,
    FP8_MAN: tl.constexpr, FP8_BIAS: tl.constexpr, FP8_EMULATE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    if IS_INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        ph = pid_k * HALF + tl.arange(0, HALF)
        p = tl.load(q_ptr + rows[:, None] * stride_qm + ph[None, :],
                    mask=(rows < M)[:, None] & (ph < K // 2)[None, :], other=0)
        v = _unpack_nibbles(p, not HAS_ZP, BLOCK_M, BLOCK_K).to(tl.float32)
    elif IS_FP8:
        b = tl.load(q_ptr + rows[:, None] * stride_qm + cols[None, :], mask=mask, other=0)
        v = _fp8_bits_to_f32(b, FP8_MAN, FP8_BIAS, FP8_EMULATE)
    else:
        v = tl.load(q_ptr + rows[:, None] * stride_qm + cols[None, :], mask=mask, other=0).to(tl.float32)
    if GRAN == 0:
        sidx = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int64)
    elif GRAN == 1:
        sidx = rows[:, None] + tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int64)
    elif GRAN == 2:
        sidx = cols[None, :].to(tl.int64) + tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.int64)
    else:
        sidx = rows[:, None] * G + (cols // GROUP)[None, :]
    s = tl.load(scale_ptr + sidx, mask=mask, other=1.0)
    if HAS_ZP:
        v = v - tl.load(zp_ptr + sidx, mask=mask, other=0).to(tl.float32)
    out = v * s
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], _cast(out, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _pack_int4_kernel(q_ptr, out_ptr, N_OUT, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)     # output bytes
    src = tl.reshape(tl.join(2 * offs, 2 * offs + 1), (2 * BLOCK,))
    smask = tl.reshape(tl.join(offs < N_OUT, offs < N_OUT), (2 * BLOCK,))
    q = tl.load(q_ptr + src, mask=smask, other=0).to(tl.int32)
    packed = tl.reshape(_pack_nibbles(tl.reshape(q, (1, 2 * BLOCK)), 1, 2 * BLOCK), (BLOCK,))
    tl.store(out_ptr + offs, packed, mask=offs < N_OUT)


@triton.jit
def _unpack_int4_kernel(p_ptr, out_ptr, N_IN, SIGNED: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    p = tl.load(p_ptr + offs, mask=offs < N_IN, other=0)
    v = tl.reshape(_unpack_nibbles(tl.reshape(p, (1, BLOCK)), SIGNED, 1, 2 * BLOCK), (2 * BLOCK,))
    dst = tl.reshape(tl.join(2 * offs, 2 * offs + 1), (2 * BLOCK,))
    dmask = tl.reshape(tl.join(offs < N_IN, offs < N_IN), (2 * BLOCK,))
    tl.store(out_ptr + dst, v.to(out_ptr.dtype.element_ty), mask=dmask)

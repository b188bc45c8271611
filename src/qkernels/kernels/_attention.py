"""Private Triton kernels of the decoder runtime: rotary embedding + KV-cache write, decode attention.

Launchers and numerics: ops/attention.py; pure-torch twins: reference.qkv_rope_cache / decode_attention.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _cast, _pdl_enter


@triton.jit
def _head_rms(x1, x2, w_ptr, offs, live, eps, HALF: tl.constexpr):
    """Per-head RMSNorm of the two halves of one head vector (Qwen3's q_norm / k_norm), fp32."""
    r = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
    w1 = tl.load(w_ptr + offs, mask=live, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + offs, mask=live, other=0.0).to(tl.float32)
    return x1 * r * w1, x2 * r * w2


@triton.jit
def _qkv_rope_cache_kernel(
    qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    T, stride_qkv_row, stride_cos, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, eps,
    N_HEADS: tl.constexpr, N_KV: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per (token, head of q | k | v). q heads: rotate, write q_out [rows, H, D]; k heads:
    rotate, write k_cache[b, kv_head, pos]; v heads: copy into v_cache[b, kv_head, pos]."""
    _pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)          # token index b * T + t
    head = tl.program_id(1)
    b = row // T
    pos = tl.load(pos_ptr + row).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    live = offs < HALF
    D: tl.constexpr = 2 * HALF
    src = qkv_ptr + row * stride_qkv_row + head * D
    x1 = tl.load(src + offs, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=live, other=0.0).to(tl.float32)
    if head >= N_HEADS + N_KV:                   # v: no rotation
        dst = v_cache_ptr + b * stride_vb + (head - N_HEADS - N_KV) * stride_vh + pos * stride_vs
        tl.store(dst + offs, _cast(x1, v_cache_ptr.dtype.element_ty), mask=live)
        tl.store(dst + HALF + offs, _cast(x2, v_cache_ptr.dtype.element_ty), mask=live)
    else:
        is_q = head < N_HEADS
        if is_q:
            if Q_NORM:
                x1, x2 = _head_rms(x1, x2, qn_ptr, offs, live, eps, HALF)
        else:
            if K_NORM:
                x1, x2 = _head_rms(x1, x2, kn_ptr, offs, live, eps, HALF)
        c = tl.load(cos_ptr + pos * stride_cos + offs, mask=live, other=0.0)
        s = tl.load(sin_ptr + pos * stride_cos + offs, mask=live, other=0.0)
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        if is_q:
            dst = q_out_ptr + (row * N_HEADS + head) * D
            tl.store(dst + offs, _cast(o1, q_out_ptr.dtype.element_ty), mask=live)
            tl.store(dst + HALF + offs, _cast(o2, q_out_ptr.dtype.element_ty), mask=live)
        else:
            dst = k_cache_ptr + b * stride_kb + (head - N_HEADS) * stride_kh + pos * stride_ks
            tl.store(dst + offs, _cast(o1, k_cache_ptr.dtype.element_ty), mask=live)
            tl.store(dst + HALF + offs, _cast(o2, k_cache_ptr.dtype.element_ty), mask=live)


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, o_part_ptr, lse_ptr, out_ptr, cnt_ptr,
    stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, chunk, n_splits, scale,
    N_KV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Flash-decoding in one launch. Program (b * N_KV + kv_head, split) takes the GROUP query heads that
    share kv_head (GQA: each key / value tile is read once for all of them) over keys
    [split * chunk, min((split + 1) * chunk, length)). With one split it writes their output; otherwise their
    softmax-normalized partial output o_part [B, H, n_splits, D] and log-sum-exp lse [B, H, n_splits] (-inf for
    an empty range), and the last of the kv head's n_splits programs to finish (cnt_ptr: a counter per
    b * N_KV + kv_head, zero between launches) combines them: out = sum_i w_i o_part_i with
    w_i = 2^(lse_i - max) / sum_j 2^(lse_j - max), then resets the counter."""
    _pdl_enter(PDL)
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b = bh // N_KV
    kvh = bh % N_KV
    length = tl.load(len_ptr + b)
    start = split * chunk
    stop = tl.minimum(start + chunk, length)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_live = g < GROUP
    d_live = d < D
    tl.static_assert(BLOCK_G >= 16 and BLOCK_S >= 16 and BLOCK_D >= 16)     # tl.dot's minimum tile
    heads = kvh * GROUP + g                                           # [BLOCK_G] query heads
    q = tl.load(q_ptr + (b * N_KV * GROUP + heads)[:, None] * D + d[None, :],
                mask=g_live[:, None] & d_live[None, :], other=0.0)
    if INTERPRET:
        q = q.to(tl.float32)
    qk_scale = scale * 1.4426950408889634                             # softmax in the log2 domain
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    for s0 in range(start, stop, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_live = s < stop
        kv_mask = s_live[:, None] & d_live[None, :]
        k = tl.load(k_base + s[:, None].to(tl.int64) * stride_ks + d[None, :], mask=kv_mask, other=0.0)
        if INTERPRET:       # the interpreter's dot mis-handles bf16: fp32 there (same products, exact)
            k = k.to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale                    # [BLOCK_G, BLOCK_S] fp32
        scores = tl.where(s_live[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + s[:, None].to(tl.int64) * stride_vs + d[None, :], mask=kv_mask, other=0.0)
        if INTERPRET:
            pv = tl.dot(_cast(p, v.dtype).to(tl.float32), v.to(tl.float32))
        else:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m = m_new
    empty = l == 0.0
    out = acc / tl.where(empty, 1.0, l)[:, None]
    lse = tl.where(empty, float("-inf"), m + tl.log2(tl.where(empty, 1.0, l)))
    gd_live = g_live[:, None] & d_live[None, :]
    o_rows = b * N_KV * GROUP + heads                                 # [BLOCK_G] rows of out
    if BLOCK_SPLITS == 1:
        tl.store(out_ptr + o_rows[:, None] * D + d[None, :], _cast(out, out_ptr.dtype.element_ty), mask=gd_live)
    else:
        row = o_rows * n_splits + split                               # [BLOCK_G] rows of o_part / lse
        tl.store(o_part_ptr + row[:, None] * D + d[None, :], out, mask=gd_live)
        tl.store(lse_ptr + row, lse, mask=g_live)
        tl.debug_barrier()      # every partial of this program is stored before the counter says so
        done = tl.atomic_add(cnt_ptr + bh, 1, sem="acq_rel", scope="gpu")
        if done == n_splits - 1:
            _combine(o_part_ptr, lse_ptr, out_ptr, o_rows, g_live, d, d_live, n_splits, D, BLOCK_SPLITS)
            tl.atomic_xchg(cnt_ptr + bh, 0, sem="relaxed", scope="gpu")


@triton.jit
def _combine(o_part_ptr, lse_ptr, out_ptr, o_rows, g_live, d, d_live, n_splits, D: tl.constexpr,
             BLOCK_SPLITS: tl.constexpr):
    """out[row] = sum_i w_i o_part[row, i] with w_i = 2^(lse_i - max) / sum_j 2^(lse_j - max), for the rows
    o_rows [BLOCK_G] (reads bypass L1: other programs wrote them)."""
    i = tl.arange(0, BLOCK_SPLITS)
    gi_live = g_live[:, None] & (i < n_splits)[None, :]
    lse = tl.load(lse_ptr + o_rows[:, None] * n_splits + i[None, :], mask=gi_live, other=float("-inf"),
                  cache_modifier=".cg")
    mx = tl.max(lse, axis=1)
    mx = tl.where(mx == float("-inf"), 0.0, mx)                       # no key at all: zeros, not NaN
    w = tl.exp2(lse - mx[:, None])
    w = w / tl.maximum(tl.sum(w, axis=1), 1e-30)[:, None]
    o = tl.load(o_part_ptr + ((o_rows[:, None] * n_splits + i[None, :]) * D)[:, :, None] + d[None, None, :],
                mask=gi_live[:, :, None] & d_live[None, None, :], other=0.0, cache_modifier=".cg")
    o = tl.sum(o * w[:, :, None], axis=1)
    tl.store(out_ptr + o_rows[:, None] * D + d[None, :], _cast(o, out_ptr.dtype.element_ty),
             mask=g_live[:, None] & d_live[None, :])

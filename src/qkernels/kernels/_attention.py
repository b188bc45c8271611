"""Private Triton kernels of the decoder runtime: rotary embedding + KV-cache write, decode attention.

Launchers and numerics: ops/attention.py; pure-torch twins: reference.qkv_rope_cache / decode_attention.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _cast, _pdl_wait


@triton.jit
def _head_rms(x1, x2, w_ptr, offs, live, eps, HALF: tl.constexpr):
    """Per-head RMSNorm of the two halves [BLOCK_T, BLOCK_H] of one head vector per token (Qwen3's q_norm /
    k_norm), fp32."""
    r = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    w1 = tl.load(w_ptr + offs, mask=live, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + offs, mask=live, other=0.0).to(tl.float32)
    return x1 * r[:, None] * w1[None, :], x2 * r[:, None] * w2[None, :]


@triton.jit
def _qkv_rope_cache_kernel(
    qkv_ptr, pos_ptr, rpos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    R, T, stride_qkv_row, stride_cos, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, eps,
    N_HEADS: tl.constexpr, N_KV: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
    Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per (BLOCK_T tokens, head of q | k | v) of the R = B * T tokens. q heads: rotate, write q_out
    [R, H, D]; k heads: rotate, write k_cache[b, kv_head, pos]; v heads: copy into v_cache[b, kv_head, pos].
    The rotation of a token is the rotary tables' row rpos (its position, or any row: multimodal positions).
    The positions and the rotary tables are read before the programmatic-dependent-launch wait (the step's inputs
    and constants: no kernel of this library writes them), qkv after it."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)     # token indices b * T + t
    head = tl.program_id(1)
    r_live = rows < R
    b = rows // T
    pos = tl.load(pos_ptr + rows, mask=r_live, other=0).to(tl.int64)
    rpos = tl.load(rpos_ptr + rows, mask=r_live, other=0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    live = offs < HALF
    m2 = r_live[:, None] & live[None, :]
    D: tl.constexpr = 2 * HALF
    cs = rpos[:, None] * stride_cos + offs[None, :]
    turn = m2 & (head < N_HEADS + N_KV)                                # q and k heads rotate
    c = tl.load(cos_ptr + cs, mask=turn, other=0.0)
    s = tl.load(sin_ptr + cs, mask=turn, other=0.0)
    _pdl_wait(PDL)
    src = qkv_ptr + rows[:, None] * stride_qkv_row + head * D + offs[None, :]
    x1 = tl.load(src, mask=m2, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=m2, other=0.0).to(tl.float32)
    if head >= N_HEADS + N_KV:                   # v: no rotation
        dst = v_cache_ptr + (b * stride_vb + (head - N_HEADS - N_KV) * stride_vh + pos * stride_vs)[:, None] \
            + offs[None, :]
        tl.store(dst, _cast(x1, v_cache_ptr.dtype.element_ty), mask=m2)
        tl.store(dst + HALF, _cast(x2, v_cache_ptr.dtype.element_ty), mask=m2)
    else:
        is_q = head < N_HEADS
        if is_q:
            if Q_NORM:
                x1, x2 = _head_rms(x1, x2, qn_ptr, offs, live, eps, HALF)
        else:
            if K_NORM:
                x1, x2 = _head_rms(x1, x2, kn_ptr, offs, live, eps, HALF)
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        if is_q:
            dst = q_out_ptr + (rows * N_HEADS + head)[:, None] * D + offs[None, :]
            tl.store(dst, _cast(o1, q_out_ptr.dtype.element_ty), mask=m2)
            tl.store(dst + HALF, _cast(o2, q_out_ptr.dtype.element_ty), mask=m2)
        else:
            dst = k_cache_ptr + (b * stride_kb + (head - N_HEADS) * stride_kh + pos * stride_ks)[:, None] \
                + offs[None, :]
            tl.store(dst, _cast(o1, k_cache_ptr.dtype.element_ty), mask=m2)
            tl.store(dst + HALF, _cast(o2, k_cache_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _attend(q, k, v, s_live, m, l, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """One key tile of the online softmax: (m, l, acc) updated with keys k and values v [BLOCK_S, BLOCK_D] (rows
    not s_live masked out) for the query heads q [BLOCK_G, BLOCK_D]."""
    if INTERPRET:       # the interpreter's dot mis-handles bf16: fp32 there (same products, exact)
        k = k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale    # [BLOCK_G, BLOCK_S] fp32
    scores = tl.where(s_live[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if INTERPRET:
        pv = tl.dot(_cast(p, v.dtype).to(tl.float32), v.to(tl.float32))
    else:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc * alpha[:, None] + pv


@triton.jit
def _chunk(length, n_splits, BLOCK_S: tl.constexpr):
    """Keys per split for a sequence of `length` keys over n_splits splits: whole BLOCK_S tiles, at least one."""
    return tl.maximum(tl.cdiv(tl.cdiv(length, n_splits), BLOCK_S), 1) * BLOCK_S


@triton.jit
def _decode_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, o_part_ptr, lse_ptr,
    stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs, n_splits, scale,
    N_KV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr, DOT_PRECISION: tl.constexpr, PREFETCH: tl.constexpr = False,
    PDL: tl.constexpr = False, DIRECT: tl.constexpr = False,
):
    """Flash-decoding, first pass. Program (b * N_KV + kv_head, split) takes the GROUP query heads that
    share kv_head (GQA: each key / value tile is read once for all of them) over keys
    [split * chunk, min((split + 1) * chunk, length)), and writes their softmax-normalized partial output
    o_part [B, H, n_splits, D] and log-sum-exp lse [B, H, n_splits]. The grid follows the cache's size (one captured
    step serves every length), the work the sequence's length: chunk (_chunk) spreads its keys over the splits in
    whole key tiles, and a split past them returns at once, writing nothing (the combine reads only the used ones).
    lengths are read before the programmatic-dependent-launch wait (the step's inputs: no kernel of this library
    writes them); q, the keys and the values after it. PREFETCH (the decode step's promise that the kernel just
    before wrote no cache row but each sequence's newest, lengths[b] - 1): the first key / value tile's other rows
    are read before the wait too, the newest after it. DIRECT (one split: n_splits == 1): o_part_ptr is the output
    [B, H, D] in q's dtype, written as the combine would write it (one split's combine is that cast), lse_ptr
    unused; the next kernel starts as the programs exit (_pdl_wait not EARLY: the grid then has several waves)."""
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b = bh // N_KV
    kvh = bh % N_KV
    length = tl.load(len_ptr + b)
    chunk = _chunk(length, n_splits, BLOCK_S)
    start = split * chunk
    if start < length:                       # else no key here: return, writing nothing
        stop = tl.minimum(start + chunk, length)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        g_live = g < GROUP
        d_live = d < D
        tl.static_assert(BLOCK_G >= 16 and BLOCK_S >= 16 and BLOCK_D >= 16)     # tl.dot's minimum tile
        k_base = k_ptr + b * stride_kb + kvh * stride_kh
        v_base = v_ptr + b * stride_vb + kvh * stride_vh
        s = start + tl.arange(0, BLOCK_S)                                 # the first key tile
        s_live = s < stop
        k_at = k_base + s[:, None].to(tl.int64) * stride_ks + d[None, :]
        v_at = v_base + s[:, None].to(tl.int64) * stride_vs + d[None, :]
        if PREFETCH:
            settled = (s_live & (s < length - 1))[:, None] & d_live[None, :]
            k = tl.load(k_at, mask=settled, other=0.0)
            v = tl.load(v_at, mask=settled, other=0.0)
        _pdl_wait(PDL, not DIRECT)      # DIRECT: a grid of several waves (large batch), no early start for the next
        heads = kvh * GROUP + g                                           # [BLOCK_G] query heads
        q = tl.load(q_ptr + (b * N_KV * GROUP + heads)[:, None] * D + d[None, :],
                    mask=g_live[:, None] & d_live[None, :], other=0.0)
        if INTERPRET:
            q = q.to(tl.float32)
        qk_scale = scale * 1.4426950408889634                             # softmax in the log2 domain
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        first = start
        if PREFETCH:
            # the newest row, lengths[b] - 1, where it falls in this tile
            newest = s_live & (s == length - 1)
            in_tile = d_live & (length - 1 >= start) & (length - 1 < stop) & (length - 1 < start + BLOCK_S)
            k_row = tl.load(k_base + (length - 1).to(tl.int64) * stride_ks + d, mask=in_tile, other=0.0)
            v_row = tl.load(v_base + (length - 1).to(tl.int64) * stride_vs + d, mask=in_tile, other=0.0)
            k = tl.where(newest[:, None], k_row[None, :], k)
            v = tl.where(newest[:, None], v_row[None, :], v)
            m, l, acc = _attend(q, k, v, s_live, m, l, acc, qk_scale, DOT_PRECISION)
            first = start + BLOCK_S
        for s0 in range(first, stop, BLOCK_S):
            # names of their own: the first tile's s / k / v are not loop-carried (nor their types: s0 follows
            # stop's)
            t = s0 + tl.arange(0, BLOCK_S)
            t_live = t < stop
            kv_mask = t_live[:, None] & d_live[None, :]
            kt = tl.load(k_base + t[:, None].to(tl.int64) * stride_ks + d[None, :], mask=kv_mask, other=0.0)
            vt = tl.load(v_base + t[:, None].to(tl.int64) * stride_vs + d[None, :], mask=kv_mask, other=0.0)
            m, l, acc = _attend(q, kt, vt, t_live, m, l, acc, qk_scale, DOT_PRECISION)
        out = acc / l[:, None]                  # l > 0: the split holds a key (padded heads score 0 on it)
        lse = m + tl.log2(l)
        row = (b * N_KV * GROUP + heads) * n_splits + split               # [BLOCK_G] rows of o_part / lse
        if DIRECT:
            tl.store(o_part_ptr + row[:, None] * D + d[None, :], _cast(out, o_part_ptr.dtype.element_ty),
                     mask=g_live[:, None] & d_live[None, :])
        else:
            tl.store(o_part_ptr + row[:, None] * D + d[None, :], out, mask=g_live[:, None] & d_live[None, :])
            tl.store(lse_ptr + row, lse, mask=g_live)


@triton.jit
def _decode_attention_combine_kernel(
    o_part_ptr, lse_ptr, len_ptr, out_ptr, n_splits, n_heads,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Second pass: out[b, h] = sum_i 2^lse_i o_part[b, h, i] / sum_i 2^lse_i over the splits that hold keys (the
    first cdiv(length, chunk), as the first pass chose them), BLOCK_SPLITS at a time with a running maximum. A
    sequence with no key gets zeros."""
    bh = tl.program_id(0).to(tl.int64)
    length = tl.load(len_ptr + bh // n_heads)
    used = tl.cdiv(length, _chunk(length, n_splits, BLOCK_S))
    i = tl.arange(0, BLOCK_SPLITS)
    d = tl.arange(0, BLOCK_D)
    d_live = d < D
    _pdl_wait(PDL)
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for i0 in range(0, used, BLOCK_SPLITS):
        rows = bh * n_splits + i0 + i
        live = i0 + i < used
        lse = tl.load(lse_ptr + rows, mask=live, other=float("-inf"))
        o = tl.load(o_part_ptr + rows[:, None] * D + d[None, :], mask=live[:, None] & d_live[None, :], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, axis=0))          # finite: every used split holds a key
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        l = l * alpha + tl.sum(w, axis=0)
        acc = acc * alpha + tl.sum(o * w[:, None], axis=0)
        m = m_new
    o = acc / tl.where(l == 0.0, 1.0, l)
    tl.store(out_ptr + bh * D + d, _cast(o, out_ptr.dtype.element_ty), mask=d_live)

"""Decoder-attention launchers: rotary embedding + KV-cache write, and decode attention over the cache.

- `qkv_rope_cache`: after the merged q|k|v GEMM, one kernel splits the heads, applies Qwen3's optional
  per-head q / k RMSNorm and the rotary embedding at each token's position, writes k and v into the
  static caches in place and returns q.
- `decode_attention`: one query token per sequence against the first lengths[b] cache entries
  (flash-decoding: the sequence is split into chunks processed in parallel, then combined by their
  log-sum-exp; GQA query heads that share a KV head read each key / value tile once). The grid is sized by
  the cache, the work by the lengths: a short context in a large cache reads and combines only its own keys.

Prefill attention stays PyTorch's scaled_dot_product_attention. Kernels: kernels/_attention.py; numerics:
reference.qkv_rope_cache / reference.decode_attention (fp32 arithmetic, one rounding of each output).
"""
from __future__ import annotations

import functools
import math

import torch

from .. import configs
from .. import reference as ref
from .._runtime import (alloc, call_op, cdiv, check_kernel_device, check_same_device, check_tensor, device_name,
                        gpu_slug, is_interpreter, launch, next_pow2, num_sms, pdl_options, register_twin, scoped_value)

CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROPE_TOKENS = 16        # qkv_rope_cache: the most tokens one program takes


@functools.cache
def _ka():
    from ..kernels import _attention
    return _attention


# ---------------------------------------------------------------------------------------------
# qkv_rope_cache


def _qkv_rope_cache_impl(qkv: torch.Tensor, positions: torch.Tensor, rope_positions: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_norm: torch.Tensor | None,
                         k_norm: torch.Tensor | None, n_heads: int, n_kv_heads: int, eps: float) -> torch.Tensor:
    B, T, _ = qkv.shape
    D = k_cache.shape[-1]
    q_out = alloc((B, T, n_heads, D), qkv.dtype, qkv.device)
    if B * T == 0:
        return q_out
    R = B * T
    qkv2 = qkv.reshape(R, -1)
    half = D // 2
    block_h = max(16, next_pow2(half))
    # tokens per program: one at decode sizes (most programs), up to ROPE_TOKENS when there are many tokens (a
    # program per token and head would be launch-bound at prefill sizes)
    block_t = max(1, min(ROPE_TOKENS, next_pow2(R) // 64))
    launch(_ka()._qkv_rope_cache_kernel, (cdiv(R, block_t), n_heads + 2 * n_kv_heads),
           qkv2, positions, rope_positions, cos, sin, q_norm if q_norm is not None else qkv2,
           k_norm if k_norm is not None else qkv2,
           q_out, k_cache, v_cache, R, T, qkv2.stride(0), cos.stride(0), *k_cache.stride()[:3],
           *v_cache.stride()[:3], float(eps), N_HEADS=n_heads, N_KV=n_kv_heads, HALF=half, BLOCK_H=block_h,
           BLOCK_T=block_t, Q_NORM=q_norm is not None, K_NORM=k_norm is not None,
           num_warps=min(4, max(1, block_t * block_h // 64)), **pdl_options(qkv.device))
    return q_out


_qkv_rope_cache_op = torch.library.custom_op("qkernels::qkv_rope_cache", mutates_args=("k_cache", "v_cache"))(
    _qkv_rope_cache_impl)


def _qkv_rope_cache_twin(qkv, positions, rope_positions, cos, sin, k_cache, v_cache, q_norm, k_norm, n_heads,
                         n_kv_heads, eps):
    return ref.qkv_rope_cache(qkv, positions, cos, sin, k_cache, v_cache, n_heads, n_kv_heads, q_norm, k_norm, eps,
                              rope_positions)


register_twin(_qkv_rope_cache_op, _qkv_rope_cache_twin)


@_qkv_rope_cache_op.register_fake
def _(qkv, positions, rope_positions, cos, sin, k_cache, v_cache, q_norm, k_norm, n_heads, n_kv_heads, eps):
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], n_heads, k_cache.shape[-1]))


def qkv_rope_cache(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int, n_kv_heads: int, *,
                   q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
                   eps: float = 1e-6, rope_positions: torch.Tensor | None = None) -> torch.Tensor:
    """qkv [B, T, (n_heads + 2 n_kv_heads) * D] (the merged projection's output, fp16 / bf16 / fp32);
    positions [B, T] int32 / int64 (each < the cache length S); cos / sin [>= S, D / 2] fp32
    (reference.rope_tables); k_cache / v_cache [B, n_kv_heads, S, D], written in place at the positions;
    q_norm / k_norm [D] optional per-head RMSNorm weights. Returns the rotated q [B, T, n_heads, D] in
    qkv's dtype. rope_positions [B, T] (default: positions): the row of cos / sin each token is rotated by, where
    it is not the cache position (multimodal rotary positions: the tables then hold any rows, e.g. one per
    token). Positions are not range-checked on the device (a host check would synchronize): the runtime
    refuses a prompt that does not fit its cache before it gets here."""
    check_tensor("qkv", qkv, dtypes=CACHE_DTYPES)
    check_kernel_device("qkv", qkv)
    if qkv.dim() != 3:
        raise ValueError(f"qkv must be [B, T, (H + 2 Hkv) * D], got shape {tuple(qkv.shape)}")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, dtypes=CACHE_DTYPES)
        if c.dim() != 4 or c.shape[0] != qkv.shape[0] or c.shape[1] != n_kv_heads or c.stride(-1) != 1:
            raise ValueError(f"{name} must be [B={qkv.shape[0]}, n_kv_heads={n_kv_heads}, S, D] with a unit "
                             f"last stride, got shape {tuple(c.shape)} strides {c.stride()}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    B, T, W = qkv.shape
    D = k_cache.shape[-1]
    if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads must be a positive multiple of n_kv_heads, got {n_heads} and {n_kv_heads}")
    if D % 2 or W != (n_heads + 2 * n_kv_heads) * D:
        raise ValueError(f"qkv's last dim must be (n_heads + 2 n_kv_heads) * head_dim = "
                         f"({n_heads} + 2 * {n_kv_heads}) * {D} with an even head_dim, got {W}")
    check_tensor("positions", positions, dtypes=(torch.int32, torch.int64))
    if tuple(positions.shape) != (B, T):
        raise ValueError(f"positions must have shape ({B}, {T}), got {tuple(positions.shape)}")
    if rope_positions is not None:
        check_tensor("rope_positions", rope_positions, dtypes=(torch.int32, torch.int64))
        if tuple(rope_positions.shape) != (B, T):
            raise ValueError(f"rope_positions must have shape ({B}, {T}), got {tuple(rope_positions.shape)}")
    rows = k_cache.shape[2] if rope_positions is None else 1      # the table rows the positions may index
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, dtypes=(torch.float32,))
        if t.dim() != 2 or t.shape[1] != D // 2 or t.shape[0] < rows or t.stride(-1) != 1:
            raise ValueError(f"{name} must be [>= {rows} positions, {D // 2}] fp32 with a unit last "
                             f"stride, got shape {tuple(t.shape)}")
    if sin.stride(0) != cos.stride(0):
        raise ValueError("cos and sin must have the same row stride")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None and (w.dim() != 1 or w.shape[0] != D):
            raise ValueError(f"{name} must be [{D}] (head_dim), got shape {tuple(w.shape)}")
    check_same_device("qkv", qkv, positions=positions, rope_positions=rope_positions, cos=cos, sin=sin,
                      k_cache=k_cache, v_cache=v_cache, q_norm=q_norm, k_norm=k_norm)
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    if qkv.stride(0) != T * qkv.stride(1):
        qkv = qkv.contiguous()
    positions = positions.contiguous()
    rope_positions = positions if rope_positions is None else rope_positions.contiguous()
    return call_op(_qkv_rope_cache_op, _qkv_rope_cache_impl, qkv, positions, rope_positions, cos, sin, k_cache,
                   v_cache, q_norm, k_norm, int(n_heads), int(n_kv_heads), float(eps))


# ---------------------------------------------------------------------------------------------
# decode attention


_FORCED_CONFIG: list = [None]    # set only inside use_config()
ATTENTION_KEYS = ("BLOCK_S", "num_warps", "num_stages", "WAVES", "PREFETCH")


def use_config(cfg: dict):
    """Within the block, decode attention runs with cfg (BLOCK_S, num_warps, num_stages, WAVES, PREFETCH: an entry of
    a config table's "decode_attention" kind) instead of the table's: what scripts/tune_attention.py times."""
    if not isinstance(cfg, dict) or set(cfg) != set(ATTENTION_KEYS) or not isinstance(cfg["PREFETCH"], bool) \
            or cfg["BLOCK_S"] < 16 or cfg["BLOCK_S"] & (cfg["BLOCK_S"] - 1) or cfg["num_warps"] not in (1, 2, 4, 8) \
            or min(cfg["num_stages"], cfg["WAVES"]) < 1:
        raise ValueError(f"cfg must be a decode-attention config {{{', '.join(ATTENTION_KEYS)}}} (BLOCK_S a power of "
                         f"two >= 16, num_warps 1, 2, 4 or 8, PREFETCH a bool, the others >= 1), got {cfg!r}")
    return scoped_value(_FORCED_CONFIG, cfg)


def _config(B: int, device: torch.device) -> dict:
    if _FORCED_CONFIG[0] is not None:
        return _FORCED_CONFIG[0]
    if is_interpreter():
        return configs.pick(configs.INTERPRETER_DECODE_ATTENTION, B)
    return _table_config(next_pow2(max(B, 1)), device)


@functools.cache
def _table_config(b_bucket: int, device: torch.device) -> dict:
    """The GPU's table entry for the batch bucket (the built-in default where its table has none), cached."""
    table = configs.load(gpu_slug(device_name(device))).get("decode_attention") or configs.DEFAULT_DECODE_ATTENTION
    return configs.pick(table, b_bucket)


def _splits(B: int, n_kv: int, S: int, block_s: int, waves: int, device: torch.device) -> int:
    """The grid's splits per sequence and KV head: about `waves` programs per SM over a full cache, at most one per
    key tile. Depends only on the cache's shape, so a captured decode step keeps one grid at every length; the
    kernels spread each sequence's keys over them (kernels._attention._chunk), so a short context in a large cache
    costs what it costs in a small one."""
    target = 2 if is_interpreter() else max(1, cdiv(waves * num_sms(device), B * n_kv))
    return max(1, min(target, cdiv(S, block_s)))


def _decode_attention_impl(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                           scale: float, prefetch: bool = False) -> torch.Tensor:
    B, H, D = q.shape
    n_kv, S = k_cache.shape[1], k_cache.shape[2]
    out = alloc((B, H, D), q.dtype, q.device)
    if B == 0:
        return out
    ka = _ka()
    block_s, warps, stages, waves, early = (_config(B, q.device)[k] for k in ATTENTION_KEYS)
    n_splits = _splits(B, n_kv, S, block_s, waves, q.device)
    direct = n_splits == 1      # (a large batch) the first pass writes out itself: no combine
    o_part = out if direct else alloc((B, H, n_splits, D), torch.float32, q.device)   # splits past the keys unwritten
    lse = out if direct else alloc((B, H, n_splits), torch.float32, q.device)
    group = H // n_kv
    block_d = max(16, next_pow2(D))
    launch(ka._decode_attention_split_kernel, (B * n_kv, n_splits), q, k_cache, v_cache, lengths, o_part, lse,
           *k_cache.stride()[:3], *v_cache.stride()[:3], n_splits, float(scale),
           N_KV=n_kv, GROUP=group, BLOCK_G=max(16, next_pow2(group)), D=D, BLOCK_D=block_d, BLOCK_S=block_s,
           PREFETCH=bool(prefetch and early), DIRECT=direct,
           DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
           **pdl_options(q.device))
    if direct:
        return out
    launch(ka._decode_attention_combine_kernel, (B * H,), o_part, lse, lengths, out, n_splits, H,
           D=D, BLOCK_D=block_d, BLOCK_S=block_s, BLOCK_SPLITS=min(16, max(2, next_pow2(n_splits))), num_warps=1,
           **pdl_options(q.device))
    return out


_decode_attention_op = torch.library.custom_op("qkernels::decode_attention", mutates_args=())(_decode_attention_impl)


register_twin(_decode_attention_op, lambda q, k_cache, v_cache, lengths, scale, prefetch=False:
              ref.decode_attention(q, k_cache, v_cache, lengths, scale))


@_decode_attention_op.register_fake
def _(q, k_cache, v_cache, lengths, scale, prefetch=False):
    return torch.empty_like(q)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     scale: float | None = None, *, prefetch: bool = False) -> torch.Tensor:
    """Attention of one query per sequence over its cache: q [B, H, D] (fp16 / bf16 / fp32), k_cache /
    v_cache [B, Hkv, S, D] of q's dtype (H a multiple of Hkv, unit last stride), lengths [B] int32 / int64
    with 1 <= lengths[b] <= S (keys at positions >= lengths[b] are ignored). scale defaults to D^-0.5.
    Returns [B, H, D] in q's dtype; softmax in fp32.
    prefetch=True promises that the kernel launched just before this one (on the stream) wrote no row of the caches
    but each sequence's newest, lengths[b] - 1 (as qkv_rope_cache does in a decode step): the other rows of the
    first key tile may then be read before waiting for that kernel (programmatic dependent launch, Hopper), where
    the GPU's config says so (PREFETCH: the tile then waits in registers, 158 instead of 87 per thread at 64 keys,
    4 warps). The result is the same either way."""
    check_tensor("q", q, dtypes=CACHE_DTYPES)
    check_kernel_device("q", q)
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, D], got shape {tuple(q.shape)}")
    B, H, D = q.shape
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, c, dtypes=(q.dtype,))
        if c.dim() != 4 or c.shape[0] != B or c.shape[3] != D or c.stride(-1) != 1 or H % c.shape[1]:
            raise ValueError(f"{name} must be [B={B}, Hkv, S, D={D}] with H={H} a multiple of Hkv and a unit last "
                             f"stride, got shape {tuple(c.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    check_tensor("lengths", lengths, dtypes=(torch.int32, torch.int64))
    if tuple(lengths.shape) != (B,):
        raise ValueError(f"lengths must have shape ({B},), got {tuple(lengths.shape)}")
    check_same_device("q", q, k_cache=k_cache, v_cache=v_cache, lengths=lengths)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    if not isinstance(prefetch, bool):
        raise ValueError(f"prefetch must be a bool, got {prefetch!r}")
    return call_op(_decode_attention_op, _decode_attention_impl, q.contiguous(), k_cache, v_cache,
                   lengths.contiguous(), float(scale), prefetch)

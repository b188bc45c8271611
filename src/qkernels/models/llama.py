"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2) on qkernels' kernels.

    h_0 = embed(ids)
    per block:  a = attn(norm_1(h)),  h = h + a,  m = mlp(norm_2(h)),  h = h + m
    logits = lm_head(norm(h))

The residual add is fused into the next norm (rms_norm(x, w, residual=r) returns the normalized sum and
the sum), so a block passes (x, residual) on. Projections are merged at load time (q|k|v as one linear,
gate|up as one); any linear may be an nn.Linear (fp16 / bf16 / fp32 through cuBLAS) or a QuantizedLinear;
the model code does not know which scheme it runs. With a w8a8 scheme the norms and SwiGLU write int8 /
fp8 codes and per-token scales straight into the next GEMM.

Attention: one kernel after the qkv GEMM applies the rotary embedding (and Qwen3's per-head q/k norm) and
writes k, v into the static cache; decode (one token per sequence) runs the flash-decoding kernel on the
cache in place; a prompt (prefill) runs PyTorch's scaled_dot_product_attention.

Tensor parallel (parallel.py): built with a Parallel, each rank holds its heads' and its intermediate slice's
rows / columns and a slice of the vocabulary; the attention and MLP outputs are each rank's partial sums, summed
over the ranks by the norm after them (reduce_norm: one all-reduce each, fused with the norm where it fits), the
logits gathered.

A prompt's forward into the cache (prefill: pos an int, logits_at given) is host-paced at short prompts: dozens of
launches per layer on the host for little GPU work each. On a GPU without gradients (one rank: tensor parallel stays
eager) its tokens are padded up to a multiple of PREFILL_GRAPH_ROUND so that nearby lengths share one CUDA graph
(models/graphs.py: captured at a padded length's second prompt, eager before it and inside graphs.eager(), the same
padded computation either way; the padding rows come after every real token, so causal attention keeps them out of
the real ones, and the cache rows they write lie past the prompt, where decode writes before it reads). The padded
GEMMs run at another M, so the logits match the unpadded forward's (the CPU's, a chunk too long to pad) to rounding,
not bit for bit.

Where kernels cannot run (a CPU without TRITON_INTERPRET=1) every op runs its reference twin.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import reference as ref
from .._runtime import runs_kernels
from ..nn.linear import QuantizedLinear
from .config import ModelArgs
from .generate import generate
from .graphs import ShapeGraphs, weights_key
from .vision import Prompt, prompt
from .parallel import Parallel


# ---------------------------------------------------------------------------------------------
# ops: the kernel where it runs, its reference twin elsewhere


def rms_norm(x, weight, eps, residual=None, quantize=None):
    """-> (y, h): y = the normalized h = x (+ residual), as a tensor or (codes, scales); h the new residual."""
    if runs_kernels(x):
        from ..ops.fused import rms_norm as kernel
        out = kernel(x, weight, eps, residual=residual, quantize=quantize)
        out = out if isinstance(out, tuple) else (out,)
    else:
        out = ref.rms_norm(x, weight, eps, residual, quantize)
    h = out[-1] if residual is not None else x
    y = out[:-1] if residual is not None else out
    return (y[0] if len(y) == 1 else y), h


def reduce_norm(x, weight, eps, residual, quantize, tp: Parallel | None):
    """rms_norm of x summed over the ranks of tp (x: this rank's partial; tp None: x itself): the all-reduce fused
    with the norm where Parallel.all_reduce_rms_norm takes the message, else all-reduce, then rms_norm."""
    if tp is not None:
        out = tp.all_reduce_rms_norm(x, residual, weight, eps, quantize)
        if out is not None:
            return (out[0] if len(out) == 2 else out[:-1]), out[-1]
        x = tp.all_reduce(x)
    return rms_norm(x, weight, eps, residual, quantize)


def silu_and_mul(gate_up, quantize=None):
    if runs_kernels(gate_up):
        from ..ops.fused import silu_and_mul as kernel
        return kernel(gate_up, quantize=quantize)
    out = ref.silu_and_mul(gate_up, quantize)
    return out[0] if len(out) == 1 else out


def project(linear: nn.Module, x, dtype: torch.dtype) -> torch.Tensor:
    """linear(x) where x is a tensor, or (codes, scales) for a w8a8 QuantizedLinear (output in dtype)."""
    if isinstance(x, tuple):
        return linear.forward_quantized(x[0], x[1], dtype)
    return linear(x)


def act_format(linear: nn.Module) -> str | None:
    """The activation format a linear takes straight from a fused norm / SwiGLU (w8a8 schemes), else None."""
    if isinstance(linear, QuantizedLinear) and not linear.scheme.weight_only:
        return linear.scheme.format
    return None


# ---------------------------------------------------------------------------------------------
# the model


class Step(NamedTuple):
    """What every layer needs to know about the tokens in flight.
    pos: None (no cache: positions 0..seq-1), an int (prefill chunk at positions pos..pos+seq-1 of every
    sequence) or a tensor [batch] (decode: seq == 1, sequence b at position pos[b]); lengths: pos + 1 for
    decode (computed once per step), else None; rope: the (cos, sin) tables; rope_pos: None (each token is rotated
    by the tables' row at its position) or [batch, seq] rows (a vision-language model's multimodal positions)."""
    batch: int
    seq: int
    pos: int | torch.Tensor | None
    lengths: torch.Tensor | None
    rope: tuple
    rope_pos: torch.Tensor | None = None


class KVCache(nn.Module):
    """Static key / value buffers [batch, n_kv_heads, max_seq_len, head_dim], written in place."""

    def __init__(self, batch: int, n_kv_heads: int, max_seq_len: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, tp: Parallel | None = None):
        super().__init__()
        q, kv = tp.heads(args.n_heads, args.n_kv_heads) if tp else (range(args.n_heads), range(args.n_kv_heads))
        self.n_heads, self.n_kv_heads, self.head_dim = len(q), len(kv), args.head_dim    # this rank's
        self.eps, self.tp = args.norm_eps, tp
        self.wqkv = nn.Linear(args.dim, (self.n_heads + 2 * self.n_kv_heads) * args.head_dim, bias=args.qkv_bias,
                              device="meta")
        self.wo = nn.Linear(self.n_heads * args.head_dim, args.dim, bias=args.o_bias, device="meta")
        self.q_norm = nn.Parameter(torch.empty(args.head_dim, device="meta")) if args.qk_norm else None
        self.k_norm = nn.Parameter(torch.empty(args.head_dim, device="meta")) if args.qk_norm else None
        self.cache: KVCache | None = None

    def forward(self, x, step: Step, dtype: torch.dtype) -> torch.Tensor:
        """x: the normed input (tensor [B*T, dim] or codes) -> the attention block's output [B*T, dim]."""
        B, T, pos = step.batch, step.seq, step.pos
        qkv = project(self.wqkv, x, dtype).view(B, T, -1)
        cos, sin = step.rope
        if self.cache is None or pos is None:
            kc = qkv.new_empty(B, self.n_kv_heads, T, self.head_dim)
            vc = torch.empty_like(kc)
            positions = torch.arange(T, device=qkv.device).expand(B, T)
            start = 0
        else:
            kc, vc = self.cache.k[:B], self.cache.v[:B]        # the cache may hold a larger batch
            if isinstance(pos, torch.Tensor):
                positions, start = pos.view(B, 1), None
            else:
                positions, start = torch.arange(pos, pos + T, device=qkv.device).expand(B, T), pos
        rope_op = _qkv_rope_cache if runs_kernels(qkv) else ref.qkv_rope_cache
        q = rope_op(qkv, positions, cos, sin, kc, vc, self.n_heads, self.n_kv_heads, q_norm=self.q_norm,
                    k_norm=self.k_norm, eps=self.eps, rope_positions=step.rope_pos)      # [B, T, H, D]
        if start is None:                                                   # decode
            att = _decode_attention if runs_kernels(q) else ref.decode_attention
            o = att(q.view(B, self.n_heads, self.head_dim), kc, vc, step.lengths, self.head_dim ** -0.5)
        else:                                                               # prompt: SDPA over the cache prefix
            k, v = kc[:, :, :start + T], vc[:, :, :start + T]
            qt = q.transpose(1, 2)
            if start == 0:
                o = F.scaled_dot_product_attention(qt, k, v, is_causal=True, enable_gqa=True)
            else:
                i = torch.arange(T, device=q.device)[:, None]
                mask = torch.arange(start + T, device=q.device)[None, :] <= i + start
                o = F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, enable_gqa=True)
            o = o.transpose(1, 2)
        return project(self.wo, o.reshape(B * T, -1), dtype)       # tensor parallel: this rank's partial sum


def _qkv_rope_cache(qkv, positions, cos, sin, kc, vc, n_heads, n_kv, q_norm=None, k_norm=None, eps=1e-6,
                    rope_positions=None):
    from ..ops.attention import qkv_rope_cache
    return qkv_rope_cache(qkv, positions, cos, sin, kc, vc, n_heads, n_kv, q_norm=q_norm, k_norm=k_norm, eps=eps,
                          rope_positions=rope_positions)


def _decode_attention(q, kc, vc, lengths, scale):
    from ..ops.attention import decode_attention
    # the kernel before (qkv_rope_cache) wrote each sequence's newest cache row only: the others load early
    return decode_attention(q, kc, vc, lengths, scale, prefetch=True)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, tp: Parallel | None = None):
        super().__init__()
        inter = args.intermediate_size // (tp.world if tp else 1)     # this rank's slice
        self.w_gate_up = nn.Linear(args.dim, 2 * inter, bias=False, device="meta")
        self.w_down = nn.Linear(inter, args.dim, bias=False, device="meta")
        self.tp = tp

    def forward(self, x, dtype: torch.dtype) -> torch.Tensor:
        gu = self.w_gate_up
        if isinstance(gu, QuantizedLinear) and gu.scheme.weight_only and act_format(self.w_down) is None:
            h = gu.forward_swiglu(x)          # SwiGLU in the GEMV's epilogue at decode sizes
        else:
            h = silu_and_mul(project(gu, x, dtype), quantize=act_format(self.w_down))
        return project(self.w_down, h, dtype)                       # tensor parallel: this rank's partial sum


class Block(nn.Module):
    def __init__(self, args: ModelArgs, tp: Parallel | None = None):
        super().__init__()
        self.attention = Attention(args, tp)
        self.feed_forward = FeedForward(args, tp)
        self.attention_norm = nn.Parameter(torch.empty(args.dim, device="meta"))
        self.ffn_norm = nn.Parameter(torch.empty(args.dim, device="meta"))
        self.eps = args.norm_eps
        self.tp = tp

    def forward(self, x, residual, step: Step):
        """x: the embeddings (residual None) or the block before's MLP output (tensor parallel: each rank's partial
        sum, summed by the norm here); returns this block's MLP output so, and the residual stream."""
        tp = self.tp if residual is not None else None
        y, h = reduce_norm(x, self.attention_norm, self.eps, residual, act_format(self.attention.wqkv), tp)
        a = self.attention(y, step, h.dtype)
        y, h = reduce_norm(a, self.ffn_norm, self.eps, h, act_format(self.feed_forward.w_gate_up), self.tp)
        return self.feed_forward(y, h.dtype), h


PREFILL_GRAPH_ROUND = 64       # a prefill graph's tokens per sequence: the prompt's, padded up to a multiple of this
PREFILL_GRAPH_TOKENS = 4096    # prefill graphs for chunks of at most this many padded tokens (all sequences)


class Transformer(nn.Module):
    """The decoder. Built empty (meta device) from ModelArgs (and a Parallel: this rank's share of a
    tensor-parallel model); qkernels.models.from_pretrained fills it."""

    def __init__(self, args: ModelArgs, tp: Parallel | None = None):
        super().__init__()
        self.args, self.tp = args, tp
        vocab = tp.vocab_part(args.vocab_size).size if tp else args.vocab_size     # this rank's rows
        self.tok_embeddings = nn.Embedding(vocab, args.dim, device="meta")
        self.layers = nn.ModuleList(Block(args, tp) for _ in range(args.n_layers))
        self.norm = nn.Parameter(torch.empty(args.dim, device="meta"))
        self.output = nn.Linear(args.dim, vocab, bias=False, device="meta")
        self.visual = None               # a vision-language model's vision encoder (models.vision), set by the loader
        self.rope_delta = None           # its sequences' rotary offsets after a prompt with images (setup_caches)
        self.max_batch = self.max_seq_len = 0
        # one graph per padded length up to PREFILL_GRAPH_TOKENS (prompts of varied lengths would otherwise keep
        # capturing and dropping graphs), their inputs in one shared buffer
        self.prefill_graphs = ShapeGraphs(max_graphs=PREFILL_GRAPH_TOKENS // PREFILL_GRAPH_ROUND)

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    def setup_caches(self, max_batch: int, max_seq_len: int, dtype: torch.dtype | None = None) -> None:
        """Allocate the KV caches once (reused while batch and length fit) and the rotary tables."""
        a = self.args
        if max_batch <= self.max_batch and max_seq_len <= self.max_seq_len:
            return
        max_batch, max_seq_len = max(max_batch, self.max_batch), max(max_seq_len, self.max_seq_len)
        dtype = dtype or self.dtype
        for layer in self.layers:
            layer.attention.cache = None                 # release the old caches before allocating new ones
        try:
            for layer in self.layers:
                att = layer.attention
                att.cache = KVCache(max_batch, att.n_kv_heads, max_seq_len, a.head_dim, dtype, self.device)
        except torch.OutOfMemoryError as e:
            for layer in self.layers:
                layer.attention.cache = None
            kv = self.layers[0].attention.n_kv_heads
            need = 2 * a.n_layers * max_batch * kv * max_seq_len * a.head_dim * dtype.itemsize
            raise torch.OutOfMemoryError(f"the KV cache for batch {max_batch} x {max_seq_len} tokens needs "
                                         f"{need / 2**30:.2f} GiB on {self.device}: {e}") from None
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.prefill_graphs.clear()                  # they write the old caches
        self._rope(max_seq_len)
        if self.visual is not None:          # each sequence's rotary offset after a prompt with images
            self.rope_delta = torch.zeros(max_batch, dtype=torch.long, device=self.device)

    def _rope(self, n: int) -> tuple:
        have = getattr(self, "_rope_tables", None)
        if have is None or have[0].shape[0] < n or have[0].device != self.device:
            inv = ref.rope_inv_freq(self.args.head_dim, self.args.rope_theta, self.args.rope_scaling)
            self._rope_tables = tuple(t.to(self.device) for t in ref.rope_tables(inv.to(self.device), n))
        return self._rope_tables

    def forward(self, input_ids: torch.Tensor, pos: int | torch.Tensor | None = None,
                logits_at: torch.Tensor | None = None, *, pixel_values: torch.Tensor | None = None,
                image_grid_thw: torch.Tensor | None = None, lengths=None) -> torch.Tensor:
        """input_ids [B, T] -> logits [B, T, vocab] (fp32 on a float32 model, else the model's dtype).
        pos: None = a plain forward over the whole sequence (no cache); an int = prefill chunk starting at
        that position of every sequence, written to the cache; a tensor [B] = one decode step (T == 1).
        logits_at: [B] indices into T: only those positions' logits ([B, vocab]).
        A vision-language model also takes images with the prompt (pos None or 0, the whole prompt in one chunk):
        pixel_values and image_grid_thw as its Hugging Face processor makes them, for the image tokens of input_ids
        in order; lengths: each prompt's tokens where the batch is right-padded (default T)."""
        B, T = input_ids.shape
        rope = self._rope(max(T if pos is None else self.max_seq_len, 1))
        rope_pos, mm = None, None
        if self.visual is not None and pixel_values is None and image_grid_thw is None \
                and not isinstance(pos, torch.Tensor):
            self._no_stray_image_tokens(input_ids)
        if pixel_values is not None or image_grid_thw is not None:
            mm = self._images(input_ids, pos, pixel_values, image_grid_thw, lengths)
            rope, rope_pos = mm.rope, mm.rope_pos
        elif self.rope_delta is not None and pos is not None:   # text after a prompt with images: rotary offsets
            if isinstance(pos, torch.Tensor):
                rope_pos = (pos + self.rope_delta[:B]).view(B, 1)
            elif pos == 0:
                self.rope_delta[:B] = 0
            else:
                rope_pos = torch.arange(pos, pos + T, device=self.device)[None] + self.rope_delta[:B, None]
        step = Step(B, T, pos, pos + 1 if isinstance(pos, torch.Tensor) else None, rope, rope_pos)
        x = mm.embeds if mm is not None else self.embed(input_ids).view(B * T, -1)
        if isinstance(pos, int) and logits_at is not None and self.tp is None:
            return self._prefill(x, step, mm, logits_at)
        return self._layers(x, step, mm.deep if mm else (), mm.where if mm else None, logits_at)

    def _layers(self, x, step: Step, deep, where, logits_at):
        """The blocks, the final norm and the logits, from the embeddings x [B * T, dim] (deep / where: a prompt's
        deepstack features and the flat indices of its image tokens)."""
        B, T = step.batch, step.seq
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, step)
            # deepstack: the early layers' image tokens get features (added to one rank's partial under TP)
            if i < len(deep) and (self.tp is None or self.tp.rank == 0):
                x = x.index_add(0, where, deep[i].to(x.dtype))
        y, _ = reduce_norm(x, self.norm, self.args.norm_eps, residual, None, self.tp)
        y = y.view(B, T, -1)
        if logits_at is not None:
            y = y[torch.arange(B, device=y.device), logits_at]
        logits = self.output(y)
        return self.tp.gather_vocab(logits, self.args.vocab_size) if self.tp else logits

    def _prefill(self, x, step: Step, mm: Prompt | None, logits_at):
        """A prompt chunk's forward (step.pos an int) as a CUDA graph where one can run (self.prefill_graphs):
        the chunk padded to Tp = a multiple of PREFILL_GRAPH_ROUND tokens per sequence, the padding after every
        real token (zero embeddings; a prompt with images: zero rotary rows, its image tokens' flat indices moved
        to the padded layout)."""
        B, T, pos = step.batch, step.seq, step.pos
        Tp = -(-T // PREFILL_GRAPH_ROUND) * PREFILL_GRAPH_ROUND
        deep, where = (mm.deep, mm.where) if mm is not None else ((), None)
        # padded wherever a graph could run, captured or not (graphs.eager(), before the capture, after a failed
        # one): a prompt gets the same logits whichever way its forward runs
        if (not self.prefill_graphs.could_run((x,)) or B * Tp > PREFILL_GRAPH_TOKENS
                or pos + Tp > self.max_seq_len):
            return self._layers(x, step, deep, where, logits_at)

        def padded(t):            # [B * T, ...] -> [B * Tp, ...], zero rows after each sequence's T
            t = t.view(B, T, *t.shape[1:])
            return torch.cat([t, t.new_zeros(B, Tp - T, *t.shape[2:])], 1).view(B * Tp, *t.shape[2:])
        inputs = [padded(x), logits_at]
        if mm is not None:        # per-token rotary rows; image tokens at b * T + t move to b * Tp + t
            inputs += [padded(step.rope[0]), padded(step.rope[1]), where // T * Tp + where % T, *deep]
        elif step.rope_pos is not None:        # text after a prompt with images: its rotary rows, continued
            inputs.append(step.rope_pos[:, :1] + torch.arange(Tp, device=x.device))

        def forward(xp, at, *rest):
            if mm is not None:
                cos, sin, wh, *dp = rest
                rope_pos = torch.arange(B * Tp, device=xp.device).view(B, Tp)
                s = Step(B, Tp, pos, None, (cos, sin), rope_pos)
                return self._layers(xp, s, dp, wh, at)
            return self._layers(xp, Step(B, Tp, pos, None, step.rope, rest[0] if rest else None), (), None, at)
        def key():                # built only where a graph can run (weights_key walks the model now and then)
            return "prefill", B, Tp, pos, mm is not None, step.rope_pos is not None, weights_key(self)
        return self.prefill_graphs(key, forward, *inputs)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings [..., dim] (tensor parallel: each rank's vocabulary slice, summed over the ranks)."""
        if self.tp is not None:
            return self.tp.embed(input_ids, self.tok_embeddings.weight, self.args.vocab_size)
        return self.tok_embeddings(input_ids)

    def _no_stray_image_tokens(self, input_ids: torch.Tensor) -> None:
        """A prompt (chunk) without images must hold no image placeholders: embedded as text they would have the
        model answer about an image it never saw. One host sync per prompt chunk, none per decode step."""
        tok = self.visual.args.image_token_id
        n = int((input_ids == tok).sum())
        if n:
            raise ValueError(f"input_ids hold {n} image placeholder token(s) (image_token_id {tok}) but no "
                             f"pixel_values / image_grid_thw were given: pass the images the prompt stands for")

    def _images(self, input_ids, pos, pixel_values, image_grid_thw, lengths) -> Prompt:
        if self.visual is None:
            raise ValueError("pixel_values / image_grid_thw given to a model without a vision encoder")
        if pixel_values is None or image_grid_thw is None:
            raise ValueError("images need both pixel_values and image_grid_thw")
        if isinstance(pos, torch.Tensor) or pos not in (None, 0):
            raise ValueError(f"images go with the whole prompt, in one forward at pos None or 0, got pos={pos!r}")
        mm = prompt(self, input_ids, pixel_values, image_grid_thw, lengths)
        if pos == 0 and self.rope_delta is not None:
            self.rope_delta[:input_ids.shape[0]] = mm.delta
        return mm

    def generate(self, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, stop=None, **kwargs):
        """The input ids followed by the new ids (greedy at temperature 0); see models.generate.generate."""
        return generate(self, input_ids, max_new_tokens, temperature, top_k, top_p, stop, **kwargs)

"""Generation: prefill in chunks (the model's own CUDA graphs of a prompt where it has them), then one token per
step with the decode step replayed as a CUDA graph;
sampling on the GPU (greedy, temperature, top-k, top-p), stop tokens, a batch of prompts of any lengths.

Prompts of different lengths are right-padded: sequence b's cache holds its prompt at positions
0..len_b - 1 and its new tokens after it; decode attention reads exactly len_b + t keys, so the padding
never enters any result.

The model is the decoder (models.llama.Transformer) or one with its interface (`args`, `setup_caches`, a forward taking
ids, positions and `logits_at`); this module imports no decoder, so the decoder's `generate` method can import it.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from .graphs import eager

PREFILL_CHUNK = 2048
CACHE_ROUND = 256


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64), on logits' device, without a host synchronization.
    temperature 0: argmax. Otherwise softmax(logits / temperature) restricted to the top_k tokens and to the
    smallest set whose probability reaches top_p, sampled by the exponential race (argmax of p / E, E ~ Exp(1))."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs > top_p          # tokens after the set already reached top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    e = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / e).argmax(dim=-1)


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    decode_tokens: int = 0      # produced by decode steps (all but each sequence's first)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    capture_s: float = 0.0
    peak_memory_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens of the decode steps over their wall time."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


class DecodeGraph:
    """One decode step (tokens [B, 1], positions [B] -> logits [B, V]) captured once as a CUDA graph and
    replayed; static input / output buffers. Eager where CUDA graphs do not exist (CPU)."""

    def __init__(self, model: torch.nn.Module, batch: int, use_graph: bool):
        self.model = model
        dev = model.device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)
        self.graph = None
        self.capture_s = 0.0
        if use_graph and dev.type == "cuda":
            t0 = time.perf_counter()
            # warm-up steps write k / v: aim them at the cache's last slot, which a sequence only reads after
            # its own step there has rewritten it
            self.pos.fill_(model.max_seq_len - 1)
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(s), torch.inference_mode():
                for _ in range(2):                      # compile / first-call work outside the capture
                    model(self.tokens, self.pos)
            torch.cuda.current_stream(dev).wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.inference_mode():
                self.logits = model(self.tokens, self.pos)[:, -1]
            torch.cuda.synchronize(dev)
            self.capture_s = time.perf_counter() - t0

    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            with torch.inference_mode():
                return self.model(tokens.view(-1, 1), pos)[:, -1]
        self.tokens.copy_(tokens.view(-1, 1))
        self.pos.copy_(pos)
        self.graph.replay()
        return self.logits


def _as_batch(input_ids) -> tuple[list[list[int]], bool]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"input_ids must be an integer tensor [batch, T] (or [T]), got "
                             f"{input_ids.dtype} {tuple(input_ids.shape)}")
        return input_ids.tolist(), True
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(t, int) for t in input_ids):
        return [list(input_ids)], False
    if isinstance(input_ids, (list, tuple)) and input_ids and all(isinstance(s, (list, tuple)) for s in input_ids):
        return [list(s) for s in input_ids], False
    raise ValueError("input_ids must be a tensor [batch, T], a list of token ids or a list of such lists")


@torch.inference_mode()
def generate(model: torch.nn.Module, input_ids, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, stop=None, *, seed: int | None = None, use_graph: bool = True,
             on_tokens=None, stats: Stats | None = None, pixel_values: torch.Tensor | None = None,
             image_grid_thw: torch.Tensor | None = None):
    """The prompt ids followed by up to max_new_tokens new ids per sequence (greedy at temperature 0).
    input_ids: a tensor [B, T] (returned as a tensor [B, T + n], sequences that stopped early padded
    with their stop token) or lists of ids of any lengths (returned as lists). stop: token ids that end
    a sequence (included in its output). on_tokens(list of B new ids or None per sequence) is called
    after every step (streaming). stats (a Stats) receives TTFT, decode time and peak memory. A tensor-parallel
    model: every rank calls generate with the same arguments and gets the same ids (rank 0's seed).
    pixel_values / image_grid_thw: the images of a vision-language model's prompts, as its processor makes them
    (images in prompt order, each prompt's image tokens standing for them); such prompts prefill in one chunk."""
    prompts, as_tensor = _as_batch(input_ids)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    vocab = model.args.vocab_size
    if any(not 0 <= t < vocab for p in prompts for t in p):
        raise ValueError(f"token ids must be in [0, {vocab}) (the model's vocab_size)")
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"need temperature >= 0, top_k >= 1, 0 < top_p <= 1; got {temperature}, {top_k}, {top_p}")
    stop_ids = set([stop] if isinstance(stop, int) else (stop or ()))
    B = len(prompts)
    lens = [len(p) for p in prompts]
    need = max(lens) + max_new_tokens
    limit = model.args.max_position_embeddings
    if need > limit:
        raise ValueError(f"prompt ({max(lens)} tokens) + max_new_tokens ({max_new_tokens}) = {need} exceeds the "
                         f"model's context of {limit} positions")
    model.setup_caches(B, min(limit, -(-need // CACHE_ROUND) * CACHE_ROUND))
    dev = model.device
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens = sum(lens)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        torch.cuda.synchronize(dev)
    if model.tp is not None and temperature > 0:     # tensor parallel: every rank draws the same tokens
        seed = model.tp.broadcast_seed(seed)
    gen = None
    if seed is not None:
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
    t0 = time.perf_counter()

    # prefill, chunk by chunk; the logits of each sequence's last prompt token are kept
    T = max(lens)
    ids = torch.tensor([p + [0] * (T - len(p)) for p in prompts], dtype=torch.long, device=dev)
    last = torch.tensor(lens, device=dev) - 1
    logits = None
    images = {} if pixel_values is None and image_grid_thw is None else \
        dict(pixel_values=pixel_values, image_grid_thw=image_grid_thw, lengths=lens)
    size = T if images else PREFILL_CHUNK          # the images' prompts in one chunk: their tokens attend together
    for s in range(0, T, size):
        chunk = ids[:, s:s + size]
        at = (last - s).clamp(0, chunk.shape[1] - 1)
        with contextlib.nullcontext() if use_graph else eager():     # use_graph=False: the prompt eager too
            lc = model(chunk, s, logits_at=at, **images).float()
        mine = ((last >= s) & (last < s + chunk.shape[1]))[:, None]
        logits = lc if logits is None else torch.where(mine, lc, logits)
    out = [list(p) for p in prompts]
    done = [False] * B
    pos = last + 1
    tok = sample(logits, temperature, top_k, top_p, gen)
    step = None
    for n in range(max_new_tokens):
        new = tok.tolist()
        if model.tp is not None:      # a rank that failed ends the decode here, named, instead of hanging it
            model.tp.raise_if_failed()
        if n == 0:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            stats.ttft_s = time.perf_counter() - t0
            t_dec = time.perf_counter()
        shown = []
        for b in range(B):
            if done[b]:
                shown.append(None)
                continue
            out[b].append(new[b])
            shown.append(new[b])
            done[b] = new[b] in stop_ids
        stats.new_tokens += sum(t is not None for t in shown)
        if n > 0:
            stats.decode_tokens += sum(t is not None for t in shown)
        if on_tokens is not None:
            on_tokens(shown)
        if all(done) or n == max_new_tokens - 1:
            break
        if step is None:
            step = DecodeGraph(model, B, use_graph)
            stats.capture_s = step.capture_s
            t_dec += step.capture_s
        logits = step(tok, pos)
        pos = pos + 1
        tok = sample(logits, temperature, top_k, top_p, gen)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if max_new_tokens:
        stats.decode_s = time.perf_counter() - t_dec      # capture time excluded (t_dec moved past it)
    if dev.type == "cuda":
        stats.peak_memory_bytes = torch.cuda.max_memory_allocated(dev)
    if not as_tensor:
        return out if len(out) > 1 or isinstance(input_ids[0], (list, tuple)) else out[0]
    width = max(len(o) for o in out)
    return torch.tensor([o + [o[-1]] * (width - len(o)) for o in out], dtype=input_ids.dtype, device=input_ids.device)

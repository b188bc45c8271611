"""`qkernels bench runtime --tp N` (launched by `torchrun --nproc-per-node N -m qkernels.cli ...`): the decoder
runtime split over N GPUs (models.parallel) against the same model on one GPU, in the same run.

Models: random weights with the real configs' shapes (Llama-3-8B; Llama-3-70B, 80 layers), generated on each
rank for its own shard only (RandomWeights), so a 70B model needs no checkpoint and no full copy anywhere.

Method:
- decode, batch 1 and 16 (BATCHES): a 128-token prompt per sequence prefilled into the static cache, then one
  decode step for the batch captured as a CUDA graph (models.generate.DecodeGraph; with TP the all-reduces are
  captured in it) and replayed: 10 warm-up replays, then 100 back to back between CUDA events, every rank in
  lockstep (a barrier before). Time per step = the span / 100, on rank 0. TP=1 runs on rank 0 alone (the other
  ranks wait), where the weights fit one GPU.
- prefill: TTFT of one 2048-token prompt (PREFILL; the forward into the cache, logits of the last position), CUDA
  events, median of 5 after one warm-up, every rank in lockstep; on the runtime's all-reduce path only (the
  one-shot kernel up to its cap, models.parallel.one_shot_bytes(): 16 MB by default, 2048 tokens of Llama-3-8B;
  the row's "oneshot_bytes"; larger messages NCCL).
- share of the weight-bandwidth floor: bytes one rank's step reads (its weights but the embedding table, its
  KV cache up to the context) / the step time, over the device-to-device copy bandwidth of one GPU measured
  in the same run.
- TP=N runs three times on the same model: with the runtime's all-reduce (ops/collective.py's one-shot kernel at
  decode sizes, where the GPUs reach each other's memory, fused with the RMSNorm after it; "one-shot": its flag
  protocol, "one-shot LL": its LL protocol, the runtime's own first) and with NCCL's for every all-reduce, each
  followed by the norm ("allreduce" in a row).
- profile: one stretch of 20 replays on every rank (torch.profiler on rank 0), GPU time per kernel name per
  step, for every row (the file's "profiles"; a prefill row's over 20 prefills, per prefill); the all-reduce time
  is what the all-reduce kernels (NCCL's or the one-shot ones, the fused all-reduce + norm with its norm) add to the
  step's end (bench.runtime.critical_us; it includes a rank's wait for the others).
On a machine without a GPU a tiny model runs through the Triton interpreter over gloo, to show the path works.
"""
from __future__ import annotations

import gc
import json
import statistics
import time
import zlib

import torch

from ..models.loading import Source
from ..models.parallel import Part
from .harness import Row, copy_bandwidth_gbps, method_text, on_gpu, results_dir, results_doc, write_json

SCHEMES = ("fp16", "w4a16")
CTX, WARMUP, STEPS = 128, 10, 100
BATCHES, PREFILL = (1, 16), 2048   # decode batches; the prefill row's prompt (on the CPU: (1, 2), 16)
PROFILE_TOP = 16                   # kernels kept per profile (by GPU time)


def configs(tiny: bool) -> dict:
    import transformers
    from .model import model_configs
    cfgs = model_configs(tiny)
    if tiny:
        return cfgs
    return {"llama3-8b": cfgs["llama3-8b"], "llama3-70b": transformers.LlamaConfig(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)}


class RandomWeights(Source):
    """Random weights (normal, std 0.02; norms 1) of a Llama-family config, made on `device` for the Part asked
    for only. The same name gives the same values in every process (seeded by the name)."""

    def __init__(self, config, device):
        self.config = config.to_dict()
        c = self.config
        self.device = device
        hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        d, i = c["hidden_size"], c["intermediate_size"]
        q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
        self._shapes = {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q), "gate_proj": (i, d),
                        "up_proj": (i, d), "down_proj": (d, i), "embed_tokens": (c["vocab_size"], d),
                        "lm_head": (c["vocab_size"], d), "q_norm": (hd,), "k_norm": (hd,)}

    def has(self, name: str) -> bool:
        return not name.endswith(".bias")

    def tensor(self, name: str, part: Part | None = None) -> torch.Tensor:
        key = name.split(".")[-2]
        shape = self._shapes.get(key, (self.config["hidden_size"],))
        if part is not None:
            shape = (part.size, shape[1]) if part.dim == 0 else (shape[0], part.size)
        g = torch.Generator(device=self.device).manual_seed(zlib.crc32(name.encode()))
        if len(shape) == 1:                # norms
            return torch.ones(shape, dtype=torch.float16, device=self.device)
        return torch.randn(shape, generator=g, dtype=torch.float16, device=self.device).mul_(0.02)

    def linear(self, name: str, bias: bool, dtype: torch.dtype, part: Part | None = None):
        w = self.tensor(name + ".weight", part).to(dtype)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        lin.weight = torch.nn.Parameter(w, requires_grad=False)
        return lin


def _weight_bytes(cfg, scheme: str) -> float:
    """About how many bytes the weights take on one GPU (for the fits-or-not test of TP=1)."""
    c = cfg.to_dict()
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    d, i, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    layer = d * (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd + d * c["num_attention_heads"] * hd \
        + 3 * d * i
    per = 2.0 if scheme == "fp16" else 0.55
    return n * layer * per + 2 * c["vocab_size"] * d * 2


def _prefill_ms(model, gpu: bool, lockstep, T: int) -> tuple[float, object]:
    """(median ms, a callable running it once) of one T-token prompt's forward into the cache (logits of its last
    position); every rank of the model's group runs it in lockstep."""
    dev = model.device
    model.setup_caches(1, T + 64)
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, model.args.vocab_size, (1, T), generator=g).to(dev)
    at = torch.full((1,), T - 1, device=dev)

    @torch.inference_mode()
    def prefill():
        model(ids, 0, logits_at=at)
    times = []
    for i in range(6 if gpu else 2):
        lockstep()
        t0 = time.perf_counter()
        if gpu:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        prefill()
        if gpu:
            b.record()
            b.synchronize()
        if i:                                   # the first: warm-up
            times.append(a.elapsed_time(b) if gpu else (time.perf_counter() - t0) * 1e3)
    return statistics.median(times), prefill


def _decode_ms(model, gpu: bool, lockstep, batch: int = 1) -> tuple[float, object]:
    """ms per decode step of the captured graph for `batch` sequences; every rank of the model's group runs it in
    lockstep."""
    from ..models.generate import DecodeGraph
    dev = model.device
    model.setup_caches(batch, CTX + 64)
    g = torch.Generator(device="cpu").manual_seed(0)          # the same prompt on every rank
    ids = torch.randint(0, model.args.vocab_size, (batch, CTX), generator=g).to(dev)
    with torch.inference_mode():
        model(ids, 0, logits_at=torch.full((batch,), CTX - 1, device=dev))
    step = DecodeGraph(model, batch, use_graph=gpu)
    tok = torch.zeros(batch, dtype=torch.long, device=dev)
    pos = torch.full((batch,), CTX, device=dev)
    steps = STEPS if gpu else 2
    for _ in range(WARMUP if gpu else 1):
        step(tok, pos)
    if gpu:
        torch.cuda.synchronize(dev)
    lockstep()
    if gpu:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(steps):
            step(tok, pos)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / steps, (step, tok, pos)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(tok, pos)
    return (time.perf_counter() - t0) * 1e3 / steps, (step, tok, pos)


def _norm_peers_both(tp, dev) -> dict:
    """{False: the flag protocol's buffers of the fused all-reduce + norm, True: the LL protocol's}: the runtime's
    own and a set of the other made here (a collective: every rank calls it), sharing its status word."""
    from ..models.parallel import NORM_CAPACITY_BYTES
    from ..ops.collective import PeerBuffers
    own = tp.norm_peers
    other = PeerBuffers.create(tp.group, dev, NORM_CAPACITY_BYTES * (1 if own.ll else 4), ll=not own.ll)
    other.status = tp.peers.status
    return {own.ll: own, other.ll: other}


def _profile(fn, rank: int) -> tuple[float, list[dict]]:
    """(GPU time per call of the all-reduce kernels (NCCL's, the one-shot one), GPU time per kernel name per call)
    over 20 calls of `fn` (a decode step's replay, a prefill), profiled on rank 0; every other rank of the group
    calls it in lockstep."""
    from .runtime import profile_step
    if rank != 0:
        for _ in range(23):                      # profile_step's 3 warm-up calls, then its 20
            fn()
        torch.cuda.synchronize()
        return float("nan"), []
    from .report import allreduce_us
    kernels = profile_step(fn, top=10 ** 6)
    return allreduce_us(kernels), kernels[:PROFILE_TOP]


def run(root, models=None, schemes=SCHEMES, layers: int | None = None, tp: int = 2) -> list[Row]:
    import torch.distributed as dist

    from ..models import from_pretrained
    from .runtime import merge_by_model, step_bytes
    if not dist.is_initialized() or dist.get_world_size() != tp:
        raise RuntimeError(f"bench --tp {tp} runs in {tp} processes: launch it with "
                           f"torchrun --nproc-per-node {tp} -m qkernels.cli bench runtime --tp {tp}")
    rank, gpu = dist.get_rank(), on_gpu()
    dev = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    single, _ = dist.new_subgroups(1)
    cfgs = configs(tiny=not gpu)
    if models:
        cfgs = {k: v for k, v in cfgs.items() if k in models}
    bw = copy_bandwidth_gbps(dev) if gpu else float("nan")
    mem = torch.cuda.get_device_properties(dev).total_memory if gpu else float("inf")
    rows: list[Row] = []
    profiles: dict[str, list[dict]] = {}
    earlier = results_dir(root) / "tp.json"
    prev = earlier.read_text() if models and rank == 0 and earlier.exists() else None
    for mname, cfg in cfgs.items():
        if layers:
            cfg.num_hidden_layers = layers
        for scheme in schemes:
            sizes = {"model": mname, "layers": cfg.num_hidden_layers, "scheme": scheme, "ctx": CTX}
            q = None if scheme == "fp16" else scheme
            t1, ttft1 = {}, None
            for world, group in ((1, single), (tp, None)):
                if world == 1 and _weight_bytes(cfg, scheme) > 0.8 * mem:
                    if rank == 0:
                        print(f"{mname} {scheme} tp=1: does not fit one GPU ({_weight_bytes(cfg, scheme) / 2**30:.0f} "
                              f"GiB of weights)", flush=True)
                    continue
                dist.barrier()
                if world == 1 and rank != 0:
                    continue
                t0 = time.perf_counter()
                kw = {"group_size": 32} if q == "w4a16" and not gpu else {}     # the tiny model's head slices
                m = from_pretrained(RandomWeights(cfg, dev), q, device=dev, dtype=torch.float16, tp_group=group, **kw)
                build_s = time.perf_counter() - t0
                # TP > 1: the runtime's all-reduce (the one-shot kernel where the GPUs map each other's memory),
                # then torch.distributed's for all of them on the same model
                lib = dist.get_backend()                  # torch.distributed's all-reduce: NCCL (gloo on CPUs)
                peers = (m.tp.peers, m.tp.norm_peers) if world > 1 else None
                # the decode step's fused all-reduces under each protocol (the runtime's own first:
                # QKERNELS_TP_ALLREDUCE picks it): its buffers and, made here, those of the other
                norms = _norm_peers_both(m.tp, dev) if world > 1 and m.tp.peers is not None else {}
                one_shot = ["one-shot LL", "one-shot"] if norms and m.tp.norm_peers.ll else ["one-shot", "one-shot LL"]
                paths = [""] if world == 1 else [lib] if not norms else one_shot + [lib]
                lockstep = dist.barrier if world > 1 else (lambda: None)
                for path in paths:
                    if world > 1:
                        m.tp.peers, m.tp.norm_peers = ((peers[0], norms[path == "one-shot LL"])
                                                       if path.startswith("one-shot") else (None, None))
                    for b in BATCHES if gpu else (1, 2):
                        ms, run_ = _decode_ms(m, gpu, lockstep, b)
                        step, tok, pos = run_
                        ar, kernels = _profile(lambda: step(tok, pos), rank) if gpu else (float("nan"), [])
                        label = f"{mname} {scheme} tp={world} b={b}" + (f", {path} all-reduce" if path else "")
                        if kernels:
                            profiles[label] = kernels
                        nbytes = step_bytes(m, b, CTX)
                        share = nbytes / (ms * 1e-3) / (bw * 1e9) if gpu else float("nan")
                        if world == 1:
                            t1[b] = ms
                        x = t1[b] / ms if b in t1 and world > 1 else None
                        extra = {"tokens_per_s": b * 1e3 / ms, "step_bytes_per_rank": nbytes, "bw_share": share,
                                 "allreduce": path or None, "allreduce_us": ar if world > 1 else float("nan"),
                                 "capture_s": run_[0].capture_s, "build_s": build_s, "speedup_vs_tp1": x}
                        rows.append(Row("decode", "qkernels runtime", ms * 1e3, "graph" if gpu else "eager",
                                        dict(sizes, tp=world, batch=b), extra))
                        if rank == 0:
                            print(f"{label}: {ms * 1e3:.0f} us/step, {b * 1e3 / ms:.1f} tok/s, {100 * share:.0f}% of "
                                  f"one GPU's floor, all-reduce {ar:.0f} us/step"
                                  + (f", {x:.2f}x tp=1" if x else ""), flush=True)
                        del run_
                    if path == paths[0]:           # prefill: the runtime's path (messages past the cap: NCCL)
                        T = PREFILL if gpu else 16
                        ms, prefill = _prefill_ms(m, gpu, lockstep, T)
                        ar, kernels = _profile(prefill, rank) if gpu else (float("nan"), [])
                        if kernels:
                            profiles[f"{mname} {scheme} tp={world} prefill {T}"] = kernels
                        ttft1 = ms if world == 1 else ttft1
                        x = ms / ttft1 if ttft1 and world > 1 else None
                        rows.append(Row("prefill", "qkernels runtime", ms * 1e3, "eager",
                                        dict(sizes, tp=world, batch=1, prompt=T),
                                        {"ttft_ms": ms, "allreduce": path or None, "ttft_vs_tp1": x,
                                         "allreduce_us": ar if world > 1 else float("nan"),
                                         "oneshot_bytes": peers[0].capacity_bytes if peers and peers[0] else None}))
                        del prefill
                        if rank == 0:
                            print(f"{mname} {scheme} tp={world}: TTFT {T} tokens {ms:.1f} ms"
                                  + (f", {x:.2f}x tp=1" if x else ""), flush=True)
                del m
                gc.collect()
                if gpu:
                    torch.cuda.empty_cache()
            dist.barrier()
    if rank != 0:
        return rows
    meta = {"copy_bw_gbps": bw, "tp": tp, "profiles": profiles,
            "method": method_text(__doc__, gpu, "tiny model over gloo")}
    doc = results_doc(rows, meta)
    if models and prev is not None:      # the named models' rows and profiles replace theirs; the others kept
        doc = merge_by_model(json.loads(prev), doc, list(cfgs))
    path = write_json("tp", doc, root)
    print(f"wrote {path}")
    return rows

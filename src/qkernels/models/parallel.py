"""Tensor parallelism over torch.distributed: the decoder's layers split over the ranks of a process group
(NCCL on GPUs, gloo on CPUs), with one all-reduce per attention block and one per MLP block. Each block hands its
partial output to the RMSNorm after it, which sums it over the ranks first: on GPUs mapped to each other, in one
kernel with the norm where the message fits (Parallel.all_reduce_rms_norm: decode), else all-reduce then norm.

    q|k|v, gate|up    column-parallel: a rank holds the output rows of its query heads (and of the KV heads
                      they read) and its slice of the intermediate size, computed from the full input
    o, down           row-parallel: a rank holds the input columns matching those rows; the partial
                      outputs are summed by one all-reduce (a bias is added by rank 0 only)
    embedding, head   vocab-parallel: a rank holds a slice of the vocabulary; the lookups are summed by one
                      all-reduce and the logits gathered, so every rank returns all of them

With fewer KV heads than ranks, each rank keeps the one KV head its query heads share (replicated). The
norms, the residual stream and the sampling are replicated: every rank computes the same tokens.

Weights are cut while they load (loading.py): a Part names the rows or columns of a [out, in] weight a
rank keeps. Float weights and GPTQ / AWQ layers are read shard-only from safetensors (the slices of the stored
tensors that hold the part: nn.checkpoints); layers already in memory, and act-order columns, are cut on their
codes (shard_linear). Cuts fall on group boundaries, so a shard holds exactly the codes and scales TP=1 holds.
An act-order (GPTQ desc_act) down projection is split by its own group order (mlp_parts with `order`): a rank
holds whole groups of it and the gate / up rows of the same intermediate channels.
A row-parallel layer quantized while loading gets per-channel scales over its own slice of K.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.linear import QuantizedLinear
from ..ops.collective import PeerBuffers, one_shot_all_reduce, one_shot_all_reduce_rms_norm
from ..schemes import PER_CHANNEL

# the buffers of the all-reduce fused with the next RMSNorm: a decode step's rows up to batch 64 at hidden size 8192
# in fp16 (Llama-3-70B), one program per row (256 at most); 4x that under LL (a word per element)
NORM_CAPACITY_BYTES = 1 << 20
# the largest all-reduce of the one-shot kernel by default: on two H200s it measured faster than NCCL's at every size
# from 8 KB to 16 MB (scripts/bench_allreduce.py; benchmarks/results/h200/allreduce.json), and Llama-3-8B's TP=2
# TTFT of 2048 tokens (16 MB messages) went from 58.6 ms through NCCL to 29.2 ms through it (TP=1: 50.8)
ONE_SHOT_BYTES = 16 << 20
PROBE_S = 5.0        # after a failed collective: how long the ranks still alive wait for one another to check in


def one_shot_bytes() -> int:
    """The largest all-reduce the one-shot kernel takes (larger ones go to NCCL): QKERNELS_TP_ONESHOT_BYTES, else
    ONE_SHOT_BYTES (16 MB: a prefill of 2048 tokens at hidden size 4096 in fp16). Its buffers hold
    2 x ranks x that many bytes on every GPU."""
    v = os.environ.get("QKERNELS_TP_ONESHOT_BYTES")
    if v is None:
        return ONE_SHOT_BYTES
    n = int(v) if v.strip().isdigit() else -1
    if n < 4096 or n % 16:
        raise ValueError(f"QKERNELS_TP_ONESHOT_BYTES: expected a byte count of at least 4096 and a multiple of 16, "
                         f"got {v!r}")
    return n

def allreduce_choice() -> str:
    """QKERNELS_TP_ALLREDUCE: "" (unset: the one-shot kernels where the GPUs map each other's memory, flag protocol),
    "nccl" (NCCL for every all-reduce) or "ll" (the decode step's all-reduces fused with the norm under the LL
    protocol)."""
    v = os.environ.get("QKERNELS_TP_ALLREDUCE", "")
    if v not in ("", "nccl", "ll"):
        raise ValueError(f"QKERNELS_TP_ALLREDUCE: expected 'nccl', 'll' or unset, got {v!r}")
    return v


if torch.distributed.is_available():
    # torch.distributed.nn's functions take group=group.WORLD as a default, read when that module is imported
    # (loading a model imports it). Imported after init_process_group, they would keep the default group alive
    # past destroy_process_group: its gloo worker threads then outlive the interpreter and abort the process at
    # exit. Imported here, before a script that imports qkernels.models initializes its group, they hold None.
    import torch.distributed.nn  # noqa: F401


@dataclass(frozen=True)
class Part:
    """The slice of a weight [out, in] one rank keeps: rows (dim 0, column-parallel) or columns (dim 1,
    row-parallel) in the index ranges `spans` (concatenated), and whether it keeps the bias (a row-parallel
    bias is added once, by rank 0)."""
    dim: int
    spans: tuple[tuple[int, int], ...]
    keep_bias: bool = True

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.spans)

    def take(self, t):
        """The part of t (a tensor, or a safetensors slice: read shard-only) along dim."""
        pieces = [t[a:b] if self.dim == 0 else t[:, a:b] for a, b in self.spans]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)

    def bias(self, b: torch.Tensor | None) -> torch.Tensor | None:
        if b is None or not self.keep_bias:
            return None
        return self.take(b) if self.dim == 0 else b


class Parallel:
    """A process group the decoder is split over: its rank and size, the parts each layer keeps and the
    collectives of a forward."""

    def __init__(self, group=None):
        import torch.distributed as dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.peers = None               # ops.collective.PeerBuffers once connect() found the GPUs mapped to each other
        self.norm_peers = None          # and those of the all-reduce fused with the next RMSNorm (its own buffers)

    def connect(self, device: torch.device) -> None:
        """On GPUs that reach each other's memory (NVLink / PCIe peer access: every rank checks its peers), set up
        the one-shot all-reduce of decode-sized messages (ops/collective.py; up to one_shot_bytes()); larger ones,
        and GPUs without peer access, stay with torch.distributed's all_reduce (NCCL). QKERNELS_TP_ALLREDUCE=nccl
        keeps NCCL for all; =ll gives the all-reduces fused with the norm (the decode step's) the LL protocol
        (ops/collective.py: each element sent with its epoch, no flag or fence).
        A collective: every rank calls it (from_pretrained does, once the model is loaded)."""
        import torch.distributed as dist
        if device.type != "cuda" or dist.get_backend(self.group) != "nccl" or self.peers is not None:
            return
        capacity, choice = one_shot_bytes(), allreduce_choice()     # a bad setting raises here, before any collective
        indices = [None] * self.world
        dist.all_gather_object(indices, device.index if device.index is not None else torch.cuda.current_device(),
                               group=self.group)
        here = indices[self.rank]
        ok = choice != "nccl" and all(
            i == here or torch.cuda.can_device_access_peer(here, i) for i in indices)
        if not _all_ranks(ok, device, self.group):
            return
        peers, why = None, ""
        try:
            peers = (PeerBuffers.create(self.group, torch.device("cuda", here), capacity),
                     PeerBuffers.create(self.group, torch.device("cuda", here),
                                        NORM_CAPACITY_BYTES * (4 if choice == "ll" else 1), ll=choice == "ll"))
            peers[1].status = peers[0].status        # one status word: raise_if_failed reads it once
        except (RuntimeError, OSError) as e:         # no symmetric memory here: NCCL for every all-reduce
            why = f"{type(e).__name__}: {e}"
        if _all_ranks(peers is not None, device, self.group):
            self.peers, self.norm_peers = peers
        else:
            import warnings
            warnings.warn(f"tensor parallel: the one-shot all-reduce could not be set up on every rank"
                          f"{' (here: ' + why + ')' if why else ''}; every all-reduce goes through NCCL", stacklevel=2)

    def __repr__(self) -> str:
        return f"Parallel(rank={self.rank}, world={self.world})"

    # ---- which heads / rows a rank keeps --------------------------------------------------------
    def check(self, args, group_size: int | None = None, what: str = "") -> None:
        """Refuse a split the decoder cannot run, before anything loads. group_size: the quantization groups
        along K (None / PER_CHANNEL: no constraint), which a row-parallel shard must not cut."""
        w = self.world
        if args.n_heads % w:
            raise ValueError(f"tp={w}: num_attention_heads={args.n_heads} must be a multiple of the number of ranks")
        if args.n_kv_heads % w and w % args.n_kv_heads:
            raise ValueError(f"tp={w}: num_key_value_heads={args.n_kv_heads} must divide or be a multiple of the "
                             f"number of ranks")
        if args.intermediate_size % w:
            raise ValueError(f"tp={w}: intermediate_size={args.intermediate_size} must be a multiple of the number "
                             f"of ranks")
        if group_size not in (None, PER_CHANNEL):
            for name, k in (("intermediate_size", args.intermediate_size // w),
                            ("num_attention_heads * head_dim", args.n_heads // w * args.head_dim)):
                if k % group_size:
                    raise ValueError(f"tp={w}: a rank's slice of {name} ({k}) must be a multiple of "
                                     f"group_size={group_size}{what}: a row-parallel shard would cut a group")

    def heads(self, n_heads: int, n_kv: int) -> tuple[range, range]:
        """This rank's query heads and the KV heads they read."""
        hq = n_heads // self.world
        q = range(self.rank * hq, (self.rank + 1) * hq)
        if n_kv % self.world == 0:
            hk = n_kv // self.world
            return q, range(self.rank * hk, (self.rank + 1) * hk)
        kv = q.start // (n_heads // n_kv)       # fewer KV heads than ranks: the one this rank's queries share
        return q, range(kv, kv + 1)

    def qkv_parts(self, args) -> tuple[Part, Part, Part]:
        q, kv = self.heads(args.n_heads, args.n_kv_heads)
        d = args.head_dim
        kv_part = Part(0, ((kv.start * d, kv.stop * d),))
        return Part(0, ((q.start * d, q.stop * d),)), kv_part, kv_part

    def o_part(self, args) -> Part:
        q, _ = self.heads(args.n_heads, args.n_kv_heads)
        return Part(1, ((q.start * args.head_dim, q.stop * args.head_dim),), keep_bias=self.rank == 0)

    def _slice(self, n: int) -> tuple[int, int]:
        s = n // self.world
        return self.rank * s, (self.rank + 1) * s

    def mlp_parts(self, args, order: torch.Tensor | None = None) -> tuple[Part, Part]:
        """(gate or up rows, down columns): this rank's slice of the intermediate channels; with `order` (an
        act-order down projection's permutation: its channels sorted by group), the channels at the rank's
        slice of that order, so the rank holds whole groups of the down projection."""
        a, b = self._slice(args.intermediate_size)
        spans = ((a, b),) if order is None else _runs(torch.sort(order[a:b].cpu()).values)
        return Part(0, spans), Part(1, spans, keep_bias=self.rank == 0)

    def gate_up_part(self, args) -> Part:
        """The rows of an already merged gate|up weight."""
        a, b = self._slice(args.intermediate_size)
        i = args.intermediate_size
        return Part(0, ((a, b), (i + a, i + b)))

    def vocab_part(self, vocab: int) -> Part:
        """Rows [rank * n, (rank + 1) * n) of the vocabulary (n = ceil(vocab / world); the last one shorter)."""
        n = -(-vocab // self.world)
        return Part(0, ((min(vocab, self.rank * n), min(vocab, (self.rank + 1) * n)),))

    # ---- the collectives of a forward -----------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks (x itself, summed in place, or a new tensor: use the result)."""
        import torch.distributed as dist
        if self.peers is not None and self.peers.fits(x):
            return one_shot_all_reduce(x, self.peers)
        with self._collective("an all-reduce"):
            dist.all_reduce(x, group=self.group)
        return x

    def raise_if_failed(self) -> None:
        """Raise if an all-reduce of the one-shot kernels gave up waiting for a rank (PeerBuffers.check: their
        wait is bounded, so a failed rank ends the others' decode with an error naming it instead of a hang).
        Reads a status word from the GPU: generate calls it where it reads each step's tokens anyway."""
        if self.peers is not None:
            self.peers.check()

    @contextlib.contextmanager
    def _collective(self, what: str):
        """torch.distributed's collectives: a failure (a rank whose process ended: gloo sees its connection close)
        raises an error naming the ranks that no longer answer."""
        try:
            yield
        except RuntimeError as e:
            gone = self._unresponsive()
            who = ("a peer rank" if not gone else f"rank {gone[0]}" if len(gone) == 1 else f"ranks {gone}")
            raise RuntimeError(f"tensor parallel: {what} failed on rank {self.rank} of {self.world}: {who} stopped "
                               f"answering (its process or device has likely failed): {e}") from e

    def _unresponsive(self, wait_s: float = PROBE_S) -> list[int]:
        """After a failed collective: the ranks of the group that do not check in through the default group's
        store within wait_s (every surviving rank checks in), or [0] where the store itself is gone (its host is
        the default group's rank 0)."""
        import time

        import torch.distributed as dist
        try:
            store = dist.distributed_c10d._get_default_store()
            name = (self.group or dist.group.WORLD).group_name
            key = [f"qkernels/tp/{name}/alive/{dist.get_global_rank(self.group, r) if self.group else r}"
                   for r in range(self.world)]
            store.set(key[self.rank], "1")
            deadline = time.monotonic() + wait_s
            while True:
                gone = [r for r in range(self.world) if not store.check([key[r]])]
                if not gone or time.monotonic() > deadline:
                    return gone
                time.sleep(0.05)
        except (RuntimeError, ValueError, OSError):
            return [0]

    def all_reduce_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            quantize: str | None = None) -> tuple | None:
        """rms_norm(sum of x over the ranks, weight, eps, residual=residual, quantize=quantize) in one kernel
        (ops.collective.one_shot_all_reduce_rms_norm: the unfused sequence's bits) where the message fits its
        buffers; None elsewhere (the caller all-reduces, then normalizes)."""
        p = self.norm_peers
        if p is None or residual is None or not p.fits_rows(x):
            return None
        return one_shot_all_reduce_rms_norm(x, residual, weight, eps, p, quantize)

    def embed(self, ids: torch.Tensor, weight: torch.Tensor, vocab: int) -> torch.Tensor:
        """Vocab-parallel lookup: each rank its own rows, zeros elsewhere, summed (exactly: one rank adds
        a non-zero row)."""
        lo = self.vocab_part(vocab).spans[0][0]
        local = ids - lo
        inside = (local >= 0) & (local < weight.shape[0])
        x = F.embedding(local.clamp(0, max(weight.shape[0] - 1, 0)), weight)
        return self.all_reduce(torch.where(inside[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device)))

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """[..., this rank's vocab slice] -> [..., vocab], the same on every rank."""
        n = -(-vocab // self.world)
        lead = logits.shape[:-1]
        x = logits.reshape(-1, logits.shape[-1])
        if x.shape[1] < n:
            x = F.pad(x, (0, n - x.shape[1]))
        x = x.contiguous()
        out = x.new_empty(self.world * x.numel())
        with self._collective("the logits' all-gather"):
            _all_gather(out, x.view(-1), group=self.group)
        return out.view(self.world, -1, n).permute(1, 0, 2).reshape(*lead, self.world * n)[..., :vocab]

    def broadcast_seed(self, seed: int | None) -> int:
        """One seed for every rank (rank 0's, drawn there when None): sampling then draws the same tokens."""
        import torch.distributed as dist
        t = torch.tensor([seed if seed is not None else int(torch.randint(0, 2 ** 62, ()))], dtype=torch.int64)
        if dist.get_backend(self.group) == "nccl":
            t = t.cuda()
        with self._collective("the seed's broadcast"):
            dist.broadcast(t, dist.get_global_rank(self.group, 0) if self.group is not None else 0, group=self.group)
        return int(t.item())


def _all_ranks(ok: bool, device: torch.device, group) -> bool:
    """Whether ok holds on every rank of group (a collective: every rank decides alike)."""
    import torch.distributed as dist
    flag = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _runs(channels: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """Ascending channel ids -> the [start, stop) runs of consecutive ones."""
    c = channels.tolist()
    starts = [0] + [i for i in range(1, len(c)) if c[i] != c[i - 1] + 1]
    return tuple((c[s], c[e - 1] + 1) for s, e in zip(starts, starts[1:] + [len(c)]))


def _all_gather(out, x, group):
    import torch.distributed as dist
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, x, group=group)


def from_group(tp_group) -> Parallel | None:
    """The Parallel of tp_group (a ProcessGroup), of the default group when tp_group is None and
    torch.distributed is initialized with more than one rank; None (one device) otherwise."""
    import torch.distributed as dist
    if tp_group is None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return None
        return Parallel(None)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("tp_group was given but torch.distributed is not initialized")
    p = Parallel(tp_group)
    return p if p.world > 1 else None


# ---------------------------------------------------------------------------------------------
# cutting a loaded linear


def shard_linear(lin: nn.Module, part: Part, name: str = "linear") -> nn.Module:
    """The part of a float nn.Linear or a QuantizedLinear a rank keeps (a new module; lin is left as it was).
    Quantized codes are cut as stored: rows with their scales; columns on group boundaries, with their
    groups' scales (per-channel scales apply to every column). Act-order layers keep their permutation's
    columns: cut by input channel, a rank's channels must form whole groups."""
    if type(lin) is nn.Linear:
        w = part.take(lin.weight.detach()).contiguous()
        out = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        out.weight = nn.Parameter(w, requires_grad=False)
        b = part.bias(lin.bias.detach() if lin.bias is not None else None)
        if b is not None:
            out.bias = nn.Parameter(b.contiguous(), requires_grad=False)
        return out
    if not isinstance(lin, QuantizedLinear):
        raise TypeError(f"{name}: tensor parallelism splits nn.Linear and QuantizedLinear layers, got "
                        f"{type(lin).__name__}")
    bias = part.bias(lin.bias.detach() if lin.bias is not None else None)
    if not lin.scheme.weight_only:
        w = part.take(lin.weight).contiguous()
        s = part.take(lin.weight_scale[:, None])[:, 0].contiguous() if part.dim == 0 else lin.weight_scale
        out = QuantizedLinear(w.shape[1], w.shape[0], bias is not None, lin.scheme, "meta",
                              bias.dtype if bias is not None else torch.float16)
        out.weight, out.weight_scale = w, s.clone()
        if bias is not None:
            out.bias = bias.contiguous()
        return out
    from ..packed_weight import PackedWeight
    from ..reference import pack_weight_codes
    pw = lin.packed_weight()
    N, K = pw.shape
    if part.dim == 0:
        qweight, sz, perm, k = part.take(pw.qweight), part.take(pw.scale_zero), pw.perm, K
    else:
        order = pw.perm if pw.perm is not None else torch.arange(K, device=pw.device)
        keep = torch.zeros(K, dtype=torch.bool, device=pw.device)
        for a, b in part.spans:
            keep |= (order >= a) & (order < b)
        cols = keep.nonzero().squeeze(1)            # stored columns of this rank's input channels, in order
        k = cols.numel()
        if pw.group_size == PER_CHANNEL:
            sz = pw.scale_zero
        else:
            g = cols.view(-1, pw.group_size) if k % pw.group_size == 0 else None
            if g is None or not bool((g == g[:, :1] + torch.arange(pw.group_size, device=g.device)).all()) \
                    or not bool((g[:, 0] % pw.group_size == 0).all()):
                raise ValueError(f"{name}: its input channels {list(part.spans)} do not form whole groups of "
                                 f"{pw.group_size}" + (" in its act-order (desc_act) order: a row-parallel "
                                                       "split of this layer would cut groups; use tp=1 or a "
                                                       "checkpoint without act-order" if pw.perm is not None
                                                       else ""))
            sz = pw.scale_zero[:, g[:, 0] // pw.group_size]
        qweight = pack_weight_codes(pw.codes()[:, cols], pw.bits)
        perm = None
        if pw.perm is not None:
            local = order[cols] + _rank_offsets(order[cols], part)
            perm = None if torch.equal(local, torch.arange(k, device=local.device)) else local
    n = qweight.shape[0]
    packed = PackedWeight(qweight.contiguous(), sz.contiguous(), pw.bits, pw.group_size, (n, k), perm,
                          pw.symmetric, pw.int_zeros)
    return QuantizedLinear.from_packed(packed, bias.contiguous() if bias is not None else None, lin.scheme.fp8_act)


def _rank_offsets(channels: torch.Tensor, part: Part) -> torch.Tensor:
    """Per input channel of the part: its index in the part's concatenated spans minus the channel itself
    (channel + offset = the local index)."""
    off = torch.zeros_like(channels)
    base = 0
    for a, b in part.spans:
        inside = (channels >= a) & (channels < b)
        off = torch.where(inside, base - a, off)
        base += b - a
    return off

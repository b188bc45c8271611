"""Collectives between the GPUs of one host for the tensor-parallel runtime (models/parallel.py).

- `PeerBuffers.create(group, device)`: the memory one all-reduce needs on every rank of a process group: a data
  buffer and a flag pad in PyTorch's symmetric memory (each rank maps its peers'), and a per-program epoch
  counter of its own. A collective: every rank of the group calls it, at the same point.
- `one_shot_all_reduce(x, peers)`: the sum of x over the ranks, in one kernel (kernels/_allreduce.py: each rank
  pushes its x into every rank's buffer, signals, waits for the others, adds the slots in rank order). For the
  few-KB messages of decode, where NCCL's ring pays its latency per hop; larger ones stay with NCCL.

Numerics: reference.all_reduce_sum (fp32 sum in rank order, one rounding): the same bits on every rank.
"""
from __future__ import annotations

import functools

import torch

from .. import reference as ref
from .._runtime import alloc, cdiv, check_tensor, launch

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK = 2048                     # elements per program
CAPACITY_BYTES = 1 << 16         # the largest message (bytes) a PeerBuffers takes: decode, batch 8 of hidden size 4096


@functools.cache
def _k():
    from ..kernels import _allreduce
    return _allreduce


class PeerBuffers:
    """What one rank of a process group needs for one_shot_all_reduce on one device: its data buffer (uint8
    [2 * world * capacity_bytes]: [2, world, slot] elements of a message's dtype) and flag pad (int32 [world,
    max_programs]: flag [r, p] is the last epoch rank r signalled to program p), where every rank's copies of both
    lie in this GPU's address space (data_deltas: 16-byte units from this rank's data, flag_deltas: int32 elements
    from its flags; int64 [world]), and its own epochs (int32 [max_programs]). `create` makes them in symmetric
    memory."""

    def __init__(self, rank: int, world: int, data: torch.Tensor, flags: torch.Tensor, data_deltas: torch.Tensor,
                 flag_deltas: torch.Tensor, capacity_bytes: int, keep: tuple = ()):
        self.rank, self.world, self.capacity_bytes, self.device = rank, world, capacity_bytes, data.device
        self.data, self.flags, self.data_deltas, self.flag_deltas = data, flags, data_deltas, flag_deltas
        self.max_programs = flags.numel() // world
        self.epochs = torch.zeros(self.max_programs, dtype=torch.int32, device=data.device)
        self._views = {dt: data.view(dt) for dt in DTYPES}
        self._keep = keep               # the symmetric memory's handles: the peers map it

    @classmethod
    def create(cls, group, device: torch.device, capacity_bytes: int = CAPACITY_BYTES) -> "PeerBuffers":
        """Allocate and exchange the buffers over `group` (None: the default group); every rank calls it."""
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        name = (group or dist.group.WORLD).group_name
        max_programs = cdiv(capacity_bytes // 2, BLOCK)                  # the most programs (fp16 / bf16 messages)
        with torch.cuda.device(device):
            data = symm_mem.empty(2 * world * capacity_bytes, dtype=torch.uint8, device=device)
            flags = symm_mem.empty(world * max_programs, dtype=torch.int32, device=device)
            data.zero_()
            flags.zero_()
            handles = (symm_mem.rendezvous(data, name), symm_mem.rendezvous(flags, name))
            torch.cuda.synchronize(device)
        dist.barrier(group)                      # every rank's flags are zero before anyone signals
        return cls(rank, world, data, flags, deltas(data, handles[0].buffer_ptrs, rank, 16),
                   deltas(flags, handles[1].buffer_ptrs, rank, 4), capacity_bytes, handles)

    def fits(self, x: torch.Tensor) -> bool:
        return (x.device == self.device and x.dtype in DTYPES and x.numel() * x.element_size() <= self.capacity_bytes
                and cdiv(x.numel(), BLOCK) <= self.max_programs)


def deltas(t: torch.Tensor, bases: list[int], rank: int, unit: int) -> torch.Tensor:
    """int64 [len(bases)]: how far each rank's copy of t lies from this rank's, in units of `unit` bytes, given the
    addresses `bases` (as mapped here) of the blocks that hold the copies (t's offset in its block is the same on
    every rank)."""
    own = bases[rank]
    out = []
    for b in bases:
        if (b - own) % unit:
            raise ValueError(f"the ranks' copies must lie a multiple of {unit} bytes apart, got {b - own}")
        out.append((b - own) // unit)
    return torch.tensor(out, dtype=torch.int64, device=t.device)


def one_shot_all_reduce(x: torch.Tensor, peers: PeerBuffers) -> torch.Tensor:
    """The sum of x over the ranks of peers' group (every rank calls it with an x of the same shape and dtype, in
    the same order of calls), as a new tensor of x's shape and dtype. x must fit peers (PeerBuffers.fits)."""
    check_tensor("x", x, dtypes=DTYPES)
    if not peers.fits(x):
        raise ValueError(f"x ({x.numel()} x {x.element_size()} bytes on {x.device}) must be on {peers.device} and at "
                         f"most {peers.capacity_bytes} bytes: a larger message goes through torch.distributed")
    x = x.contiguous()
    out = alloc(x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    slot = peers.capacity_bytes // x.element_size()
    launch(_k()._one_shot_all_reduce_kernel, (cdiv(x.numel(), BLOCK),), x, out, peers._views[x.dtype], peers.flags,
           peers.data_deltas, peers.flag_deltas, peers.epochs, x.numel(), slot, RANK=peers.rank, WORLD=peers.world,
           MAX_PROGRAMS=peers.max_programs, BLOCK=BLOCK, num_warps=4)
    return out


def all_reduce_sum_twin(parts: list[torch.Tensor]) -> torch.Tensor:
    """What every rank's one_shot_all_reduce returns, given every rank's x in rank order."""
    return ref.all_reduce_sum(parts)

"""Collectives between the GPUs of one host for the tensor-parallel runtime (models/parallel.py).

- `PeerBuffers.create(group, device)`: the memory one all-reduce needs on every rank of a process group: a data
  buffer and a flag pad in PyTorch's symmetric memory (each rank maps its peers'), and a per-program epoch
  counter of its own. A collective: every rank of the group calls it, at the same point.
- `one_shot_all_reduce(x, peers)`: the sum of x over the ranks, in one kernel (kernels/_allreduce.py: each rank
  pushes its x into every rank's buffer, signals, waits for the others, adds the slots in rank order). For the
  few-KB messages of decode, where NCCL's ring pays its latency per hop; larger ones stay with NCCL.
- `PeerBuffers.create(..., ll=True)`: buffers of the LL protocol (kernels/_allreduce.py): each element travels with
  its epoch in one 64-bit word, so the kernels need no flag, no fence and no second trip, for 4x (fp16 / bf16) or 2x
  (fp32) the bytes: decode-sized messages. A PeerBuffers serves one protocol only (a word is read as data plus epoch:
  another protocol's bytes in it could pass for a word of this epoch).
- `one_shot_all_reduce_rms_norm(x, residual, weight, eps, peers, quantize)`: that all-reduce fused with the residual
  add and RMSNorm after it (one program per row; optionally the next GEMM's int8 / FP8 codes and scales): one launch
  and one pass instead of two kernels, with the unfused sequence's bits. Its PeerBuffers must be its own (a row
  program's slot region is not a flat program's, and each program's epochs and halves must be kept apart).

Numerics: reference.all_reduce_sum (fp32 sum in rank order, one rounding): the same bits on every rank;
reference.all_reduce_rms_norm for the fused op (its norm computes as ops.fused.rms_norm).
"""
from __future__ import annotations

import functools
import os

import torch

from .. import reference as ref
from .._runtime import alloc, cdiv, check_tensor, is_interpreter, launch, next_pow2, num_sms, pdl_options

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK = 2048                     # elements per program
CAPACITY_BYTES = 1 << 16         # the largest message (bytes) a PeerBuffers takes: decode, batch 8 of hidden size 4096
ROW_MAX = 16384                  # the fused all-reduce + norm: the widest row one program holds
# how long a rank waits in an all-reduce for a peer before it gives up and reports it (PeerBuffers.check)
TIMEOUT_S = float(os.environ.get("QKERNELS_TP_TIMEOUT_S", "60"))
INTERPRETER_POLLS_PER_S = 7000   # the interpreter has no timer: it counts polls of a peer's flag (about 0.14 ms each)


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
    memory. A peer that does not arrive within timeout_s (a failed process or GPU) is written to `status` (its rank +
    1) by the waiting kernel, which then ends instead of spinning forever; `check` raises on it. ll: the buffers of
    the LL protocol (the module's docstring): a slot holds capacity_bytes / 8 elements of any dtype, one per word."""

    def __init__(self, rank: int, world: int, data: torch.Tensor, flags: torch.Tensor, data_deltas: torch.Tensor,
                 flag_deltas: torch.Tensor, capacity_bytes: int, keep: tuple = (), timeout_s: float = TIMEOUT_S,
                 ll: bool = False):
        self.rank, self.world, self.capacity_bytes, self.device = rank, world, capacity_bytes, data.device
        self.ll = ll
        self.data, self.flags, self.data_deltas, self.flag_deltas = data, flags, data_deltas, flag_deltas
        self.max_programs = flags.numel() // world
        self.epochs = torch.zeros(self.max_programs, dtype=torch.int32, device=data.device)
        self.status = torch.zeros(1, dtype=torch.int32, device=data.device)
        self.timeout_s = timeout_s
        self._views = {dt: data.view(dt) for dt in DTYPES + (torch.int64,)}
        self._keep = keep               # the symmetric memory's handles: the peers map it

    @classmethod
    def create(cls, group, device: torch.device, capacity_bytes: int = CAPACITY_BYTES,
               ll: bool = False) -> "PeerBuffers":
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
                   deltas(flags, handles[1].buffer_ptrs, rank, 4), capacity_bytes, handles, ll=ll)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, seconds: float) -> None:
        """Setting the wait also works out the kernels' arguments for it, once (wait_args: every call passes them)."""
        self._timeout_s = seconds
        timer = not is_interpreter()
        self._wait = {"wait": max(1, int(seconds * (1e9 if timer else INTERPRETER_POLLS_PER_S))), "TIMER": timer}

    def wait_args(self) -> dict:
        """The kernels' bound on a wait: nanoseconds of the GPU's timer, or the interpreter's polls."""
        return self._wait

    def check(self) -> None:
        """Raise if a call through these buffers gave up waiting for a peer (reads the status word: a host
        synchronization; call it where the host synchronizes anyway). Once set, the status stays: the group is
        broken."""
        bad = int(self.status.item())
        if bad:
            raise RuntimeError(f"tensor parallel: rank {bad - 1} of {self.world} did not reach an all-reduce within "
                               f"{self.timeout_s:g} s (rank {self.rank} waited for it): its process or GPU has "
                               f"likely failed; the results since are not used (QKERNELS_TP_TIMEOUT_S sets the wait)")

    def slot(self, dtype: torch.dtype) -> int:
        """Elements of `dtype` one rank's slot holds (a message's most): one per 8-byte word under LL."""
        return self.capacity_bytes // (8 if self.ll else dtype.itemsize)

    def view(self, dtype: torch.dtype) -> torch.Tensor:
        """The data buffer as the kernels address it for messages of `dtype`: int64 words under LL."""
        return self._views[torch.int64 if self.ll else dtype]

    def fits(self, x: torch.Tensor) -> bool:
        """Whether one_shot_all_reduce takes x with these buffers."""
        return (x.device == self.device and x.dtype in DTYPES and x.numel() <= self.slot(x.dtype)
                and cdiv(x.numel(), BLOCK) <= self.max_programs)

    def fits_rows(self, x: torch.Tensor) -> bool:
        """Whether one_shot_all_reduce_rms_norm takes x [..., N] with these buffers: a program per row."""
        n = x.shape[-1] if x.dim() else 0
        return (x.device == self.device and x.dtype in DTYPES and n <= ROW_MAX and x.dim() >= 1
                and x.numel() // max(n, 1) <= self.max_programs and x.numel() <= self.slot(x.dtype))


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
                         f"most {peers.slot(x.dtype)} elements ({peers.capacity_bytes} bytes"
                         f"{' of 8-byte words' if peers.ll else ''}): a larger message goes through torch.distributed")
    x = x.contiguous()
    out = alloc(x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return out
    w = peers.wait_args()
    grid = cdiv(x.numel(), BLOCK)
    launch(_k()._one_shot_all_reduce_kernel, (grid,), x, out, peers.view(x.dtype), peers.flags,
           peers.data_deltas, peers.flag_deltas, peers.epochs, peers.status, x.numel(), peers.slot(x.dtype), w["wait"],
           RANK=peers.rank, WORLD=peers.world, MAX_PROGRAMS=peers.max_programs, BLOCK=BLOCK, TIMER=w["TIMER"],
           LL=peers.ll, num_warps=4, **_pdl_one_wave(grid, x.device))
    return out


def _pdl_one_wave(programs: int, device: torch.device) -> dict:
    """pdl_options for an all-reduce of one wave (decode-sized: the next kernel fetches its weights during the
    exchange); a prefill-sized one (16 MB: thousands of programs) runs without, as it was measured against NCCL."""
    return pdl_options(device) if device.type == "cuda" and programs <= num_sms(device) else {}


def all_reduce_sum_twin(parts: list[torch.Tensor]) -> torch.Tensor:
    """What every rank's one_shot_all_reduce returns, given every rank's x in rank order."""
    return ref.all_reduce_sum(parts)


def one_shot_all_reduce_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                                 peers: PeerBuffers, quantize: str | None = None):
    """rms_norm(one_shot_all_reduce(x, peers), weight, eps, residual=residual, quantize=quantize), bit for bit, in
    one kernel: x [..., N] this rank's partial (every rank calls it with the same shapes, in the same order of calls),
    residual like x, weight [N] or None. Returns like ops.fused.rms_norm with a residual: (y, h) or (codes, scales,
    h), h = the reduced sum + residual. The rows (at most peers.max_programs of at most ROW_MAX elements) must fit
    peers, which serve no other kind of all-reduce."""
    from .fused import _alloc_out, _check_eps, _check_quantize, _check_vector, _quant_meta, _NO_QUANT
    check_tensor("x", x, dtypes=DTYPES)
    check_tensor("residual", residual, dtypes=(x.dtype,))
    if residual.shape != x.shape or x.dim() < 1:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    N = x.shape[-1]
    _check_vector("weight", weight, N, x)
    eps, q = _check_eps(eps), _check_quantize(quantize)
    x2, r2 = x.reshape(-1, N).contiguous(), residual.reshape(-1, N).contiguous()
    M = x2.shape[0]
    if not peers.fits_rows(x):
        raise ValueError(f"x ({M} rows of {N}, {x2.numel() * x2.element_size()} bytes on {x.device}) must be on "
                         f"{peers.device}, at most {peers.max_programs} rows of at most {ROW_MAX} and "
                         f"{peers.slot(x.dtype)} elements: a larger message goes through torch.distributed")
    y, scale = _alloc_out(M, N, x.dtype, q, x.device)
    rout = alloc((M, N), x.dtype, x.device)
    if M and not N and q:
        scale.fill_(1.0)                 # as rms_norm: an empty row's scale
    if M and N:
        w = peers.wait_args()
        launch(_k()._all_reduce_rms_norm_kernel, (M,), x2, r2, weight.contiguous() if weight is not None else x2,
               y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y, rout, scale if q else x2,
               peers.view(x.dtype), peers.flags, peers.data_deltas, peers.flag_deltas, peers.epochs, peers.status,
               N, peers.slot(x.dtype), eps, w["wait"], RANK=peers.rank, WORLD=peers.world, LL=peers.ll,
               MAX_PROGRAMS=peers.max_programs, BLOCK_N=next_pow2(N), HAS_W=weight is not None, TIMER=w["TIMER"],
               num_warps=4 if N <= 4096 else 8, **(_quant_meta(q, x.device) if q else _NO_QUANT),
               **_pdl_one_wave(M, x.device))
    out = (y.reshape(x.shape),) if not q else (y.reshape(x.shape), scale.reshape(*x.shape[:-1], 1))
    return out + (rout.reshape(x.shape),)

"""Eager plans: the launches of an op's first eager call with a given input shape, recorded and replayed by the
calls after it, so that an eager call costs one Python layer, its allocations and its launches instead of
validation, dispatch, launch planning and a cache-key per kernel.

`planned(store, key, x, run, owned, guard)` runs `run()` (the op's full path on x) the first time, inside
`_runtime.recording()`. The recording is kept as an EagerPlan where it can be replayed: direct launches only,
every tensor argument x, a tensor the call made with `alloc` (made afresh on each replay, in the same order), a
tensor of `owned` (the layer's weights), or the stream's split-K scratch; the call's result one of the alloc'd
tensors. Anything else (a path that runs cuBLAS, which marks the recording with _runtime.not_replayable, builds TMA
descriptors from x, copies x) keeps the full path.
A replay happens only while what it was specialized on still holds (EagerPlan.__call__), else the full path runs.
"""
from __future__ import annotations

import math

import torch

from .._runtime import RETRY, alloc, current_device_index, poisoning, recording, replay, replay_state, scratch_now

_X, _WS, _CNT = object(), object(), object()      # argument slots filled per call; an int: the i-th alloc'd tensor
MAX_PLANS = 64      # per store: many distinct shapes (prefill lengths) start it over rather than grow it


class PlanStore(dict):
    """An owner's plans, key -> EagerPlan (or _Unplanned), kept in the owner's __dict__ (a layer, a PackedWeight, a
    weight tensor). Never copied: a deepcopy or pickle of the owner (copy.deepcopy(model), torch.save(model)) starts
    with no plans, as the plans hold compiled kernels and the owner's own tensors."""

    __slots__ = ()

    def __deepcopy__(self, memo):
        return PlanStore()

    def __reduce__(self):
        return PlanStore, ()


def plans_of(owner) -> PlanStore:
    """The plan store kept on `owner` (made on first use)."""
    store = owner.__dict__.get("_eager_plans")
    if store is None:
        store = owner.__dict__["_eager_plans"] = PlanStore()
    return store


class _Unplanned:
    """A call whose recording cannot be replayed (it keeps the full path while its guard holds)."""

    __slots__ = ("guard",)

    def __init__(self, guard):
        self.guard = guard

    def __bool__(self):
        return False


class EagerPlan:
    """One recorded eager call: its allocations (shape, dtype) and launches (record, argument template). A call
    returns None where the recording no longer holds: x not contiguous or not 16-byte aligned (the kernels were
    specialized on an aligned x), the direct launch, PDL or a simulated capability switched, another current
    device, the stream's split-K scratch not made yet or smaller."""

    __slots__ = ("allocs", "launches", "result", "out_shape", "state", "guard", "scratch", "temp_bytes", "offsets")

    @classmethod
    def build(cls, rec: list, x: torch.Tensor, out: torch.Tensor, owned: tuple, guard):
        """The plan of recording `rec` of a call on x that returned out, or None where it cannot be replayed."""
        allocs, launches = [], []
        made = {}                     # data_ptr -> index of the latest alloc'd tensor there (rec is in call order)
        ws, cnt = scratch_now(x.device)
        owned_ptrs = {t.data_ptr() for t in owned}
        scratch = [0, 0]
        for item in rec:
            if isinstance(item, torch.Tensor):
                made[item.data_ptr()] = len(allocs)
                allocs.append((tuple(item.shape), item.dtype))
                continue
            if not isinstance(item, tuple):       # a launch through Triton's own path, or RETRY
                return None
            template, slots = [], []
            for a in item[2]:
                if isinstance(a, torch.Tensor) and a.numel():
                    p = a.data_ptr()
                    slot = (made.get(p) if p in made else _X if p == x.data_ptr() and a.numel() == x.numel()
                            else _WS if ws is not None and p == ws.data_ptr()
                            else _CNT if cnt is not None and p == cnt.data_ptr() else None)
                    if slot is None:
                        if p not in owned_ptrs:
                            return None
                        template.append(a)
                        continue
                    if slot is _WS:
                        scratch[0] = ws.numel()
                    elif slot is _CNT:
                        scratch[1] = cnt.numel()
                    slots.append((len(template), slot))
                    template.append(None)
                elif isinstance(a, (torch.Tensor, int, float, bool)):    # numbers, empty placeholders
                    template.append(a)
                else:                 # a TMA descriptor (built per call from x)
                    return None
            # the recorded arguments are not kept: they hold the first call's x and output
            launches.append(((item[0], item[1], None, item[3], item[4]), template, tuple(slots)))
        if not launches or out.data_ptr() not in made or not out.is_contiguous() \
                or out.numel() != math.prod(allocs[made[out.data_ptr()]][0]):    # the result: a whole alloc'd tensor
            return None
        plan = cls()
        plan.allocs, plan.launches, plan.result = allocs, launches, made[out.data_ptr()]
        plan.out_shape, plan.state, plan.guard, plan.scratch = tuple(out.shape), replay_state(), guard, scratch
        # the temporaries (alloc'd tensors a launch reads or writes, other than the result) as 16-byte aligned
        # pieces of one byte buffer per call, passed to the launches as addresses; unused ones (empty
        # placeholders, kept in the template as they are) are not made at all
        used = sorted({a for _, _, sl in launches for _, a in sl if a.__class__ is int} - {plan.result})
        plan.offsets, plan.temp_bytes = {}, 0
        for i in used:
            shape, dtype = allocs[i]
            plan.offsets[i] = plan.temp_bytes
            plan.temp_bytes += -(-math.prod(shape) * dtype.itemsize // 16) * 16
        return plan

    def __call__(self, x: torch.Tensor):
        """The call's result (shaped as the recorded call's), or None where the recording does not hold."""
        if (x.data_ptr() & 15 or not x.is_contiguous() or replay_state() != self.state
                or current_device_index() != self.launches[0][0][4]):
            return None
        ws = cnt = None
        if self.scratch[0] or self.scratch[1]:
            ws, cnt = scratch_now(x.device)
            if (self.scratch[0] and (ws is None or ws.numel() < self.scratch[0])) or \
                    (self.scratch[1] and (cnt is None or cnt.numel() < self.scratch[1])):
                return None
        if poisoning():     # every tensor made as the full path makes it, poisoned
            made = [alloc(shape, dtype, x.device) for shape, dtype in self.allocs]
            made[self.result] = made[self.result].view(self.out_shape)
        else:               # the result made in its final shape (same elements): no view per call
            made = {self.result: alloc(self.out_shape, self.allocs[self.result][1], x.device)}
            if self.temp_bytes:
                base = alloc((self.temp_bytes,), torch.uint8, x.device)     # alive until the launches are queued
                at = base.data_ptr()
                for i, off in self.offsets.items():
                    made[i] = at + off
        for rec, template, slots in self.launches:
            args = template.copy()
            for i, a in slots:
                args[i] = made[a] if a.__class__ is int else x if a is _X else ws if a is _WS else cnt
            replay(rec, args)
        return made[self.result]


def planned(store: dict, key, x: torch.Tensor, run, owned: tuple, guard=None) -> torch.Tensor:
    """run() (an op's full path on x, returning one tensor), replayed from `store[key]` where an earlier call
    recorded it (EagerPlan). store: kept on the layer whose weights `owned` are; guard: a cheap value of what the
    call depends on besides x (forced paths / configs, the weight tensors' ids): a plan recorded under another
    guard, or under another process-wide launch state in which replays run too (runtime.replay_state: the PDL
    switch, a simulated capability), is dropped and the call recorded again."""
    if torch.compiler.is_compiling():
        return run()
    plan = store.get(key)
    if plan is not None and plan.guard != guard:      # recorded under another dispatch / weights: record again
        del store[key]
        plan = None
    if plan:
        out = plan(x)
        if out is not None:
            return out
        state = replay_state()
        if plan.state == state or not state[0]:     # this x (unaligned, strided), device or scratch, or no direct
            return run()                             # launch now: this call only
        del store[key]                   # PDL switched since the recording (say): record under the new state
        plan = None
    if plan is not None or not (x.is_cuda and x.is_contiguous() and not x.data_ptr() & 15 and x.numel()
                             and replay_state()[0]):
        return run()
    with recording() as rec:
        out = run()
    if any(item is RETRY for item in rec):      # one-off work (tuning) in this call: record the next one
        return out
    if len(store) >= MAX_PLANS:
        store.clear()
    store[key] = EagerPlan.build(rec, x, out, owned, guard) or _Unplanned(guard)
    return out

"""Eager plans (ops/_eager.py): an eager call replays the recorded launches of the first call like it, with the
bits of the full path, and falls back to the full path wherever the recording does not hold."""
import pytest
import torch

import qkernels as qk
from qkernels import _runtime
from qkernels.ops import _eager
from qkernels.ops import weight_only as WO

from ..conftest import DEVICE
from ..helpers import assert_bit_exact, graph_replay

gpu = pytest.mark.gpu


def test_recording_notes_allocations_and_nests():
    with _runtime.recording() as outer:
        a = _runtime.alloc((2, 3), torch.float16, DEVICE)
        with _runtime.recording() as inner:
            b = _runtime.alloc((4,), torch.int8, DEVICE)
        assert len(inner) == 1 and inner[0] is b
    assert len(outer) == 2 and outer[0] is a and outer[1] is b
    assert getattr(_runtime._THREAD, "recording", None) is None
    with _runtime.recording() as rec:       # autotuning marks its call: the next call like it is recorded
        _runtime.unreplayable()
    assert rec == [_runtime.RETRY]
    assert _eager.EagerPlan.build([a, _runtime.RETRY], a, a, (), None) is None


def test_unreplayable_recordings_make_no_plan():
    x = torch.randn(2, 8, device=DEVICE)
    out = _runtime.alloc((2, 4), torch.float32, DEVICE)
    assert _eager.EagerPlan.build([out, None], x, out, (), None) is None        # a launch through Triton's path
    with _runtime.recording() as rec:       # work besides our launches (cuBLAS into an alloc'd output)
        _runtime.not_replayable()
    assert rec == [None]
    assert _eager.EagerPlan.build([out], x, out, (), None) is None              # no launch at all
    store = {}
    y = _eager.planned(store, "k", x, lambda: x * 2, ())
    assert torch.equal(y, x * 2) and x.is_cuda == bool(store) and not any(store.values())


def test_a_plan_made_under_another_launch_state_is_recorded_again(monkeypatch):
    """A plan that no longer holds because a process-wide switch changed after its recording (PDL, a simulated
    capability) is dropped and the call recorded again under the new state, rather than the layer taking the full
    path from then on; with the direct launch off (the full path, as tests compare against) it is kept."""
    class Stale:
        guard, state = None, (True, True, None)

        def __call__(self, x):
            return None                       # its recording does not hold

    x = torch.randn(4, device=DEVICE)
    store = {"k": Stale()}
    for state in [(False, True, None), (True, True, None)]:    # direct launch off; the same state (this x only)
        monkeypatch.setattr(_eager, "replay_state", lambda state=state: state)
        assert torch.equal(_eager.planned(store, "k", x, lambda: x + 1, ()), x + 1)
        assert isinstance(store["k"], Stale)
    monkeypatch.setattr(_eager, "replay_state", lambda: (True, False, None))      # PDL switched
    assert torch.equal(_eager.planned(store, "k", x, lambda: x + 1, ()), x + 1)
    assert not isinstance(store.get("k"), Stale)     # dropped; on a GPU recorded again (no launch: no plan)
    assert x.is_cuda == ("k" in store)


def test_plan_keeps_no_call_tensors():
    """A plan keeps the weights it was given and numbers, never the recorded call's x, outputs or temporaries
    (an activation per plan would stay alive)."""
    x = torch.randn(2, 8, device=DEVICE)
    w = torch.randn(4, 8, device=DEVICE)
    tmp = _runtime.alloc((2, 8), torch.int8, DEVICE)
    out = _runtime.alloc((2, 4), torch.float32, DEVICE)
    launch = ("kernel", (1, 1, 1), (x, tmp, w, out, 7, torch.empty(0)), (None,), 0)
    plan = _eager.EagerPlan.build([tmp, out, launch], x, out, (w,), None)
    rec, template, slots = plan.launches[0]
    assert rec[2] is None and plan.allocs == [((2, 8), torch.int8), ((2, 4), torch.float32)] and plan.result == 1
    assert [i for i, _ in slots] == [0, 1, 3] and template[2] is w and template[4] == 7
    assert not any(t is x or t is tmp or t is out for t in template)
    # replays make the temporaries as 16-byte aligned pieces of one buffer, and the result on its own
    assert plan.offsets == {0: 0} and plan.temp_bytes == 16
    tmp2 = _runtime.alloc((3,), torch.float32, DEVICE)
    empty = _runtime.alloc((0,), torch.int32, DEVICE)       # a placeholder: not made again
    launch2 = ("kernel", (1, 1, 1), (x, tmp, empty, tmp2, out), (None,), 0)
    plan2 = _eager.EagerPlan.build([tmp, empty, tmp2, out, launch2], x, out, (), None)
    assert plan2.offsets == {0: 0, 2: 16} and plan2.temp_bytes == 32 and plan2.result == 3
    assert _eager.EagerPlan.build([tmp, out, launch], x, out, (), None) is None     # w unknown: no plan
    assert _eager.EagerPlan.build([tmp, out, launch], x, out[:, :2], (w,), None) is None   # part of a tensor

def _counting(monkeypatch):
    replays = []
    real = _eager.replay
    monkeypatch.setattr(_eager, "replay", lambda rec, args: (replays.append(1), real(rec, args)))
    return replays


def _full_path(fn, x):
    with _runtime.fast_launch(False):
        return fn(x)


@gpu
@pytest.mark.parametrize("bits,group_size,N,K,shape,swiglu", [
    (4, 128, 4096, 4096, (1, 4096), False),         # GEMV
    (4, 128, 1024, 4096, (1, 1, 4096), False),      # GEMV with split-K (its scratch), 3-D x
    (4, 128, 2048, 1024, (1, 1, 1024), True),       # merged gate / up, SwiGLU in the GEMV epilogue
    (8, -1, 512, 256, (16, 256), False),            # w8a16, a tensor-core path
    (4, 128, 256, 512, (4096, 512), False),         # large M
])
def test_weight_only_plans(monkeypatch, bits, group_size, N, K, shape, swiglu):
    """An eager call records its launch on the PackedWeight; later calls of that shape replay it (one Python
    layer) with the same bits as the full path, and fall back to the full path wherever the recording does not
    hold (unaligned or non-contiguous x, forced path, direct launch off), inside CUDA graphs too."""
    pw = qk.PackedWeight.from_float(torch.randn(N, K, device=DEVICE), bits, group_size)
    fn = (lambda x: WO.w4a16_linear(x, pw, swiglu=swiglu)) if bits == 4 else \
        (lambda x: WO.w8a16_linear(x, pw, swiglu=swiglu))
    replays = _counting(monkeypatch)

    def full_path(x):
        return _full_path(fn, x)

    fn(torch.randn(shape, device=DEVICE, dtype=torch.float16))      # records
    plans = pw.__dict__.get("_eager_plans", {})
    planned = any(plans.values())
    for _ in range(3):
        x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = fn(x)
        assert_bit_exact(got, full_path(x))
    assert len(replays) == (3 if planned else 0)
    # where plans apply, the GEMV shapes have one (the decode calls an eager model makes)
    assert planned or shape[0] * (shape[1] if len(shape) == 3 else 1) > 64
    base = torch.randn(shape[:-1] + (K + 8,), device=DEVICE, dtype=torch.float16)
    for x in (base[..., 4:K + 4], base[..., :K]):          # misaligned, then strided rows: the full path
        n = len(replays)
        assert_bit_exact(fn(x), full_path(x.contiguous()))
        assert len(replays) == n + (planned and x.is_contiguous() and not x.data_ptr() % 16)   # one row: as is
    if planned:       # PDL switched: recorded again under it, then replayed
        with _runtime.pdl(not _runtime.replay_state()[1]):
            x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
            n = len(replays)
            assert_bit_exact(fn(x), full_path(x))
            assert_bit_exact(fn(x), full_path(x))
            assert len(replays) == n + 1
    with WO.force_path("gemv-splitk"):                        # a forced path runs, not the recorded launch
        n = len(replays)
        x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
        assert_bit_exact(fn(x), full_path(x))
        assert len(replays) == n
    x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(graph_replay(lambda: fn(x)), full_path(x))


@gpu
@pytest.mark.parametrize("scheme", ["w8a8", "w8a8-fp8"])
@pytest.mark.parametrize("shape", [(1, 1, 512), (16, 512), (129, 512), (1024, 512)])
def test_w8a8_linear_plans(monkeypatch, scheme, shape):
    """QuantizedLinear w8a8 (the plans kept on its weight tensor, recorded from the second call on it): the row
    quantize and the GEMM replayed together (their codes and scales made afresh on each call), or the one-launch
    GEMV where the table takes it; a replaced weight is recorded again. Paths with work a replay would leave out
    (FP8 through cuBLAS, the int8 kernel's TMA descriptors; from M = 33 / 1024 on the H100) keep the full path: the
    same bits."""
    lin = torch.nn.Linear(512, 384, bias=False, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin, scheme)
    replays = _counting(monkeypatch)
    ql(torch.randn(shape, device=DEVICE, dtype=torch.float16))        # the first call on the weight: no recording
    assert not ql.weight.__dict__["_eager_plans"]
    ql(torch.randn(shape, device=DEVICE, dtype=torch.float16))        # records
    planned = any(ql.weight.__dict__["_eager_plans"].values())
    for _ in range(3):
        x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = ql(x)
        assert_bit_exact(got, _full_path(ql, x))
    # quantize + GEMV / GEMM, two launches per call, or one where the table runs the GEMV quantizing x itself; a plan
    # is kept for every Triton-language path
    from qkernels.ops import gemm as G
    M = shape[0] * (shape[1] if len(shape) == 3 else 1)
    cfg = G._gemm_config(G.W8A8_TABLES[ql.scheme.gemm_dtype], M, 384, 512, x.device)
    per_call = 1 if cfg is not None and cfg.get("path") == "gemv" else 2
    assert (planned or shape[0] > 16) and len(replays) == (3 * per_call if planned else 0)
    ql2 = qk.QuantizedLinear.from_linear(torch.nn.Linear(512, 384, bias=False, device=DEVICE, dtype=torch.float16),
                                         scheme)
    ql.weight, ql.weight_scale = ql2.weight, ql2.weight_scale       # new tensors: the old plan must not serve
    x = torch.randn(shape, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(ql(x), _full_path(ql2, x))
    assert_bit_exact(ql(x), _full_path(ql2, x))
    assert_bit_exact(graph_replay(lambda: ql(x)), _full_path(ql2, x))


@gpu
@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_functional_w8a8_plans(monkeypatch, dtype):
    """w8a8_linear replays too, the plans on the weight tensor: scales passed as a fresh view on every call (the same
    memory) keep the plan, new scales make a new one, and a fresh view of the weight on every call never records."""
    w = torch.randn(384, 512, device=DEVICE, dtype=torch.float16)
    wq = qk.quantize(w, "int8" if dtype == "int8" else "fp8_e4m3", "row")
    scale = wq.scale.reshape(-1).clone()
    replays = _counting(monkeypatch)

    def fn(x, s=None):
        return qk.w8a8_linear(x, wq.data, (scale if s is None else s).view(-1), dtype=dtype)
    for _ in range(2):                                            # the first call on the weight, then the recording
        fn(torch.randn(1, 512, device=DEVICE, dtype=torch.float16))
    plans = wq.data.__dict__["_eager_plans"]
    planned = any(plans.values())
    for _ in range(3):
        x = torch.randn(1, 512, device=DEVICE, dtype=torch.float16)
        with qk.poison_outputs():
            got = fn(x)
        assert_bit_exact(got, _full_path(fn, x))
    assert planned and len(replays) >= 3
    n = len(replays)
    scale2 = scale * 2                                            # other scales: recorded again, their bits
    x = torch.randn(1, 512, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(fn(x, scale2), _full_path(lambda x: fn(x, scale2), x))
    assert len(replays) == n
    assert_bit_exact(fn(x, scale2), _full_path(lambda x: fn(x, scale2), x))
    assert len(replays) > n
    n = len(replays)
    for _ in range(3):                                            # a fresh view of the weight per call
        x = torch.randn(1, 512, device=DEVICE, dtype=torch.float16)
        assert_bit_exact(qk.w8a8_linear(x, wq.data.view(384, 512), scale, dtype=dtype),
                         _full_path(fn, x))
    assert len(replays) == n


def test_plans_are_not_copied():
    """A deepcopy or pickle of a plan's owner (a layer, a weight tensor) starts with no plans: plans hold compiled
    kernels (not copyable) and the owner's own tensors."""
    import copy
    import pickle

    class Uncopyable:
        def __deepcopy__(self, memo):
            raise AssertionError("a plan was deep-copied")

        def __reduce__(self):
            raise AssertionError("a plan was pickled")
    ql = qk.QuantizedLinear(64, 32, False, "w8a8", DEVICE)
    for owner in (ql, ql.weight):
        _eager.plans_of(owner)["key"] = Uncopyable()
    ql2 = copy.deepcopy(ql)
    assert not _eager.plans_of(ql2) and not _eager.plans_of(ql2.weight) and _eager.plans_of(ql)
    ql3 = pickle.loads(pickle.dumps(ql))
    assert not _eager.plans_of(ql3) and not _eager.plans_of(ql3.weight)
    assert torch.equal(ql3.weight, ql.weight)

"""Ops called from several Python threads at once (on a GPU: on the default stream and on a stream per thread) give
the bits they give alone (every op of the reliability table, plus the decode-size linears and attention): the launch caches, plan caches and split-K counters are shared safely. Real sizes on a
GPU; small ones under the interpreter, which runs one launch at a time (_runtime.launch holds a lock: its grid
state is global), so there the test covers the Python-side caches."""
import contextlib
import threading

import pytest
import torch

import qkernels as qk
from qkernels.ops.attention import decode_attention

from ..conftest import DEVICE, ON_GPU
from .ops import OPS, as_tuple, available

THREADS = 8 if ON_GPU else 4      # the interpreter runs one launch at a time: 4 threads contend for its caches
K = 4096 if ON_GPU else 256      # hidden size
N = 4096 if ON_GPU else 128      # output features


def _calls():
    """(name, fn) pairs covering every kernel family at decode and prefill sizes, split-K paths included."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x1 = torch.randn(1, K, device=DEVICE, dtype=torch.float16, generator=g)
    x16 = torch.randn(16, K, device=DEVICE, dtype=torch.float16, generator=g)
    w = torch.randn(N, K, device=DEVICE, generator=g)
    pw4 = qk.PackedWeight.from_float(w, 4, 128)
    pw8 = qk.PackedWeight.from_float(w, 8, -1, symmetric=True)
    q8 = qk.quantize(w.half(), "int8", "row")
    a8 = torch.randint(-128, 128, (1, K), device=DEVICE, dtype=torch.int8, generator=g)
    gamma = torch.rand(K, device=DEVICE, dtype=torch.float16, generator=g)
    q = torch.randn(2, 32, 128, device=DEVICE, dtype=torch.float16, generator=g)
    kc = torch.randn(2, 8, 300, 128, device=DEVICE, dtype=torch.float16, generator=g)
    vc = torch.randn(2, 8, 300, 128, device=DEVICE, dtype=torch.float16, generator=g)
    lengths = torch.tensor([300, 77], device=DEVICE, dtype=torch.int32)
    gu = torch.randn(16, 2 * K, device=DEVICE, dtype=torch.float16, generator=g)
    return [
        ("w4a16 M=1", lambda: qk.w4a16_linear(x1, pw4)),
        ("w4a16 M=16", lambda: qk.w4a16_linear(x16, pw4)),
        ("w8a16 M=1", lambda: qk.w8a16_linear(x1, pw8)),
        ("w8a8 M=1", lambda: qk.w8a8_linear(x1, q8.data, q8.scale.reshape(-1))),
        ("w8a8 M=16", lambda: qk.w8a8_linear(x16, q8.data, q8.scale.reshape(-1))),
        ("int8 GEMV", lambda: qk.int8_matmul(a8, q8.data.t())),
        ("quantize", lambda: qk.quantize(x16, "int8", "row").data),
        ("rms_norm", lambda: qk.rms_norm(x16, gamma)),
        ("silu_and_mul", lambda: qk.silu_and_mul(gu)),
        ("decode_attention", lambda: decode_attention(q, kc, vc, lengths)),
    ] + [(spec.name, _table_call(spec)) for spec in OPS if available(spec)]


def _table_call(spec):
    """Every op of the reliability table (tests/reliability/ops.py) on one case of its own."""
    args = spec.make(257 if ON_GPU else 17, spec.ks[-1] if ON_GPU else spec.ks[0], spec.n)
    return lambda: as_tuple(spec.run(*args))


def _clone(out):
    return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


def _equal(a, b) -> bool:
    a, b = as_tuple(a), as_tuple(b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("streams", [False, pytest.param(True, marks=pytest.mark.gpu)],
                         ids=["default stream", "a stream per thread"])
def test_ops_from_threads_match_alone(streams):
    calls = _calls()
    want = {name: _clone(fn()) for name, fn in calls}
    if ON_GPU:
        torch.cuda.synchronize()
    errors: list = []
    start = threading.Barrier(THREADS)

    def worker(i):
        try:
            stream = torch.cuda.Stream() if streams else torch.cuda.current_stream() if ON_GPU else None
            start.wait()
            with torch.cuda.stream(stream) if ON_GPU else contextlib.nullcontext():
                for _ in range(3 if ON_GPU else 1):
                    for name, fn in calls[i % len(calls):] + calls[:i % len(calls)]:
                        got = fn()
                        if ON_GPU:
                            stream.synchronize()
                        if not _equal(got, want[name]):
                            errors.append(f"thread {i}: {name} differs from its single-thread result")
        except Exception as e:          # noqa: BLE001  (reported below, with the thread)
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]

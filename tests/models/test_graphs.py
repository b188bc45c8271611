"""models/graphs.py: ShapeGraphs captures a function per input signature seen twice and replays it; the replayed
results equal the eager ones bit for bit on fresh inputs, outputs are the caller's own, and where graphs cannot be
used (the CPU, gradients recorded, a capture that fails) the function runs eagerly."""
import warnings

import pytest
import torch

from qkernels.models.graphs import ShapeGraphs

from ..conftest import DEVICE, ON_GPU


def _fn(x, w):
    """torch ops and one of our kernels (the RMSNorm) on a GPU."""
    from qkernels.models.llama import rms_norm
    y, _ = rms_norm(x @ w, torch.ones(w.shape[1], device=x.device, dtype=x.dtype), 1e-6)
    return y, (x.float().sum(0) * 2).to(x.dtype)


def test_bad_settings_name_the_argument():
    with pytest.raises(ValueError, match="capture_after must be an int >= 1 .* got 0"):
        ShapeGraphs(capture_after=0)
    with pytest.raises(ValueError, match="max_graphs must be an int >= 1, got 0"):
        ShapeGraphs(max_graphs=0)
    with pytest.raises(ValueError, match="at least one input tensor"):
        ShapeGraphs()("k", lambda: torch.zeros(1))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
def test_graphs_in_and_out_of_inference_mode_are_apart():
    """A key met under torch.inference_mode and under torch.no_grad: a graph for each (a graph captured in inference
    mode holds inference tensors that a call outside it may not write), both right."""
    g = ShapeGraphs(capture_after=1)
    w = torch.randn(64, 128, device=DEVICE, dtype=torch.float16) / 8
    for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode, torch.no_grad):
        with mode():
            x = torch.randn(16, 64, device=DEVICE, dtype=torch.float16)
            assert torch.equal(g("f", _fn, x, w)[0], _fn(x, w)[0])
    assert len(g.graphs) == 2


def test_static_inputs_share_one_buffer_that_grows():
    """A graph's static inputs: copies of the inputs as views of one byte buffer, each at a 256-byte boundary, of
    any dtype; inputs too large for it get a larger buffer (doubled at least), the views taken before keep theirs."""
    g = ShapeGraphs()
    a, i, f = torch.randn(3, 5), torch.arange(7), torch.randn(2, 3).half()
    va, vi, vf = g.static_inputs((a, i, f))
    assert torch.equal(va, a) and torch.equal(vi, i) and torch.equal(vf, f)
    assert [v.dtype for v in (va, vi, vf)] == [a.dtype, i.dtype, f.dtype]
    base = g.arena.data_ptr()
    assert [v.data_ptr() - base for v in (va, vi, vf)] == [0, 256, 512] and g.arena.numel() == 768
    first = g.arena
    b = torch.randn(2, 5)
    (vb,) = g.static_inputs((b,))            # fits: the same buffer, from its start (over the first inputs' bytes)
    assert g.arena is first and vb.data_ptr() == base and torch.equal(va.reshape(-1)[:10], b.reshape(-1))
    big = torch.randn(1000)
    (vbig,) = g.static_inputs((big,))
    assert g.arena is not first and g.arena.numel() == 4096 and torch.equal(vbig, big)     # 4000 bytes, aligned
    assert torch.equal(vb, b) and torch.equal(vi, i)         # the views taken before still read their own buffer


@pytest.mark.skipif(ON_GPU, reason="the CPU's eager path")
def test_on_the_cpu_the_function_runs_as_it_is():
    g = ShapeGraphs(capture_after=1)
    for _ in range(3):
        x = torch.randn(8, 16)
        with torch.no_grad():
            got = g("k", lambda t: t * 3, x)
        torch.testing.assert_close(got, x * 3, rtol=0, atol=0)
    assert not g.graphs


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
@torch.inference_mode()
def test_replays_equal_eager_on_fresh_inputs():
    g = ShapeGraphs()
    w = torch.randn(64, 128, device=DEVICE, dtype=torch.float16) / 8
    for call in range(4):
        x = torch.randn(32, 64, device=DEVICE, dtype=torch.float16)
        got = g("f", _fn, x, w)
        want = _fn(x, w)
        assert len(g.graphs) == (call >= 1)               # captured at the key's second call
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        got[0].fill_(float("nan"))                        # the caller's own copy: the next replay does not see it
    again = g("f", _fn, x, w)
    assert torch.equal(again[0], want[0])


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
@torch.inference_mode()
def test_one_graph_per_shape_and_the_oldest_dropped():
    g = ShapeGraphs(capture_after=1, max_graphs=2)
    w = torch.randn(64, 128, device=DEVICE, dtype=torch.float16) / 8
    for rows in (8, 16, 8, 24):
        x = torch.randn(rows, 64, device=DEVICE, dtype=torch.float16)
        got = g("f", _fn, x, w)
        assert torch.equal(got[0], _fn(x, w)[0])
    assert [k[2][0][0][0] for k in g.graphs] == [8, 24]   # 16 was the least recently used


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
def test_eager_where_gradients_are_recorded():
    g = ShapeGraphs(capture_after=1)
    x = torch.randn(8, 16, device=DEVICE, requires_grad=True)
    y = g("k", lambda t: t * 3, x)
    y.sum().backward()
    assert not g.graphs and torch.equal(x.grad, torch.full_like(x, 3))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
@torch.inference_mode()
def test_a_capture_that_fails_warns_and_stays_eager():
    """A host read of a GPU value cannot be captured: the capture fails, a warning says so, the result is the
    eager one, and the instance stays eager."""
    g = ShapeGraphs(capture_after=1)
    x = torch.randn(8, device=DEVICE)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = g("k", lambda t: t * float(t.sum().item()), x)
    assert any("CUDA graph capture failed" in str(w.message) for w in seen)
    assert torch.equal(got, x * float(x.sum().item())) and not g.enabled and not g.graphs
    assert torch.equal(g("k", lambda t: t + 1, x), x + 1)
    # the failed capture left no trace on the process: random ops run, other instances still capture
    assert torch.randint(0, 10, (4,), device=DEVICE).shape == (4,)
    h = ShapeGraphs(capture_after=1)
    assert torch.equal(h("k", lambda t: t * 2, x), x * 2) and len(h.graphs) == 1


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs: GPU only")
@torch.inference_mode()
def test_captures_again_after_every_graph_was_dropped():
    """clear() (a model's caches set up anew) drops every graph and with them their memory pool: the next capture
    takes a new pool and replays the right result, as does one after the LRU dropped the oldest."""
    g = ShapeGraphs(capture_after=1, max_graphs=1)
    for round in range(3):
        x = torch.randn(64, device=DEVICE)
        assert torch.equal(g("k", lambda t: t * 3 + 1, x), x * 3 + 1) and len(g.graphs) == 1
        y = torch.randn(32, device=DEVICE)
        assert torch.equal(g("k", lambda t: t - 2, y), y - 2) and len(g.graphs) == 1   # the LRU dropped 64's
        g.clear()
        assert not g.graphs and g.enabled


def test_weights_key_follows_the_module_and_is_kept_while_nothing_changes():
    """weights_key: the same tuple while nothing was registered or moved; a new one after a submodule is replaced,
    a parameter or buffer is registered, or the module changes dtype."""
    from qkernels.models.graphs import weights_key
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    k = weights_key(m)
    assert weights_key(m) is k and len(k) == 4
    m[1] = torch.nn.Linear(8, 4)                       # re-quantized / replaced layer
    k2 = weights_key(m)
    assert k2 != k and k2[:2] == k[:2]
    m[1].register_buffer("extra", torch.zeros(3))
    k3 = weights_key(m)
    assert len(k3) == 5
    m.double()                                         # every tensor moved
    k4 = weights_key(m)
    assert k4 != k3 and len(k4) == 5 and weights_key(m) is k4


def test_weights_key_hooks_do_not_recompile_a_compiled_forward():
    """weights_key's global registration hooks, once installed, stay out of torch.compile's guards: a compiled
    forward that registers a buffer at every call (as a static cache does) compiles once, not at every call."""
    from qkernels.models.graphs import weights_key
    weights_key(torch.nn.Linear(2, 2))                       # installs the hooks
    holder = torch.nn.Module()

    @torch.compile(fullgraph=True, backend="eager")
    def step(x):
        holder.register_buffer("b", x + 1)
        return x * 2

    torch._dynamo.reset()
    for i in range(12):                                      # past dynamo's recompile limit (8)
        assert torch.equal(step(torch.full((3,), float(i))), torch.full((3,), 2.0 * i))

"""_runtime.launch: the direct-launch cache must hand back Triton's kernel only when every fact Triton
specializes on is unchanged. CPU tests drive it with a fake kernel (the interpreter never takes the fast
path); the gpu test checks the real thing against Triton's own launch."""
import subprocess
import sys
import types

import pytest
import torch

from qkernels import _runtime as R

from .conftest import DEVICE


class FakeCompiled:
    def __init__(self, tag):
        self.tag, self.calls = tag, []
        self.function, self.packed_metadata = f"fn{tag}", f"meta{tag}"

    def run(self, *args):
        self.calls.append(args)


class FakeKernel:
    """Stands in for a JITFunction: params, and kernel[grid](...) -> a compiled kernel (Triton's path)."""

    def __init__(self, names, constexprs):
        self.params = [types.SimpleNamespace(name=n, is_constexpr=n in constexprs) for n in names]
        self.slow_calls = []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.slow_calls.append((grid, args, kw))
            self.compiled = FakeCompiled(len(self.slow_calls))
            return self.compiled
        return run


class FakeLauncher:
    """Triton's CudaLauncher: a Python wrapper (allocates scratch memory the kernel needs) around the C `launch`."""

    def __init__(self, scratch):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.wrapped, self.direct = [], []
        self.launch = lambda *args: self.direct.append(args)

    def __call__(self, *args):
        self.wrapped.append(args)


@pytest.fixture
def fast(monkeypatch):
    knobs = types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)
    monkeypatch.setattr(R, "is_interpreter", lambda: False)
    monkeypatch.setattr(R, "_triton_runtime", lambda: (lambda: 0, lambda dev: 1234, knobs))
    monkeypatch.setattr(R, "_LAUNCHES", {})
    return knobs


def test_second_launch_goes_direct(fast):
    k = FakeKernel(["x", "n", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    R.launch(k, (3,), x, 40, B=16)
    assert len(k.slow_calls) == 1
    R.launch(k, (5, 2), x, 56, B=16)
    assert len(k.slow_calls) == 1
    # grid padded to 3-D, the current stream, no launch metadata / hooks, args then constexpr placeholders
    assert k.compiled.calls == [(5, 2, 1, 1234, "fn1", "meta1", None, None, None, x, 56, None)]


@pytest.mark.parametrize("scratch", [0, 256])
def test_direct_launch_calls_the_c_entry_point(fast, monkeypatch, scratch):
    """A kernel that needs no scratch memory is launched through the launcher's C entry point (its cooperative-grid
    and PDL flags, no scratch buffers); one that does, through the wrapper that allocates them."""
    launcher = FakeLauncher(scratch)
    monkeypatch.setattr(FakeCompiled, "run", launcher)
    k = FakeKernel(["x", "n", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    R.launch(k, (3,), x, 40, B=16)
    R.launch(k, (5, 2), x, 56, B=16)
    if scratch:
        assert launcher.wrapped == [(5, 2, 1, 1234, "fn1", "meta1", None, None, None, x, 56, None)] \
            and not launcher.direct
    else:
        assert launcher.direct == [(5, 2, 1, 1234, "fn1", False, True, None, None, "meta1", None, None, None, x, 56,
                                    None)] and not launcher.wrapped


@pytest.mark.parametrize("change", ["alignment", "dtype", "int_one", "int_div16", "int_i64", "constexpr", "float"])
def test_changed_specialization_takes_triton_path(fast, change):
    k = FakeKernel(["x", "n", "s", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    R.launch(k, (1,), x, 40, 0.5, B=16)
    args, kw = [x, 40, 0.5], dict(B=16)
    if change == "alignment":
        args[0] = x[1:]                  # 2-byte offset: no longer 16-byte aligned
    elif change == "dtype":
        args[0] = x.float()
    elif change == "int_one":
        args[1] = 1                      # Triton makes 1 a constant
    elif change == "int_div16":
        args[1] = 48                     # divisible by 16
    elif change == "int_i64":
        args[1] = 40 + (1 << 32)
    elif change == "constexpr":
        kw["B"] = 32
    elif change == "float":
        args[2] = 2                      # an int where a float was
    R.launch(k, (1,), *args, **kw)
    assert len(k.slow_calls) == 2


def test_same_facts_different_values_go_direct(fast):
    k = FakeKernel(["x", "n", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    R.launch(k, (1,), x, 40, B=16)
    R.launch(k, (1,), x[8:], 24, B=16)    # 16-byte aligned view, another non-multiple of 16
    assert len(k.slow_calls) == 1


def test_hooks_and_ineligible_kernels_take_triton_path(fast):
    from triton.knobs import HookChain
    k = FakeKernel(["x", "n", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    fast.launch_enter_hook, fast.launch_exit_hook = HookChain(), HookChain(reversed=True)   # Triton's defaults
    R.launch(k, (1,), x, 40, B=16)
    R.launch(k, (1,), x, 40, B=16)
    assert len(k.slow_calls) == 1        # empty hook chains: nobody is listening
    fast.launch_enter_hook.add(print)    # a profiler is listening: it must see every launch
    R.launch(k, (1,), x, 40, B=16)
    assert len(k.slow_calls) == 2
    fast.launch_enter_hook = print       # a plain function set as the hook
    R.launch(k, (1,), x, 40, B=16)
    assert len(k.slow_calls) == 3
    # a constexpr among the positional arguments: the direct launcher's layout would not match
    k2 = FakeKernel(["x", "B", "n"], {"B"})
    R.launch(k2, (1,), x, 16, 40)
    R.launch(k2, (1,), x, 16, 40)
    assert len(k2.slow_calls) == 2


def test_disabled_by_switch(fast):
    k = FakeKernel(["x", "B"], {"B"})
    x = torch.arange(64, dtype=torch.float16)
    with R.fast_launch(False):
        R.launch(k, (1,), x, B=16)
        R.launch(k, (1,), x, B=16)
    assert len(k.slow_calls) == 2 and not R._LAUNCHES
    assert R._FAST_LAUNCH[0]          # restored after the block


@pytest.mark.gpu
def test_second_launch_skips_triton_on_gpu(monkeypatch):
    """With Triton's default (empty) hook chains, a repeated call must not go through JITFunction.run."""
    import qkernels as qk
    from qkernels.kernels import _quant as KQ
    x = torch.randn(16, 4096, device=DEVICE, dtype=torch.float16)
    want = qk.quantize(x, "int8", "row")
    monkeypatch.setattr(KQ._quantize_segments_kernel, "run",
                        lambda *a, **k: pytest.fail("repeated launch went through Triton's launch path"))
    got = qk.quantize(x, "int8", "row")
    torch.cuda.synchronize()
    assert torch.equal(got.data, want.data) and torch.equal(got.scale, want.scale)


@pytest.mark.gpu
def test_direct_launch_matches_triton_on_gpu():
    """Same results through the cache as through Triton, across alignment and size changes (the quantize
    row kernel specializes on alignment and on the row stride)."""
    import qkernels as qk
    from qkernels import reference as ref
    assert DEVICE.type == "cuda"
    base = torch.randn(8 * 4096 + 64, device=DEVICE, dtype=torch.float16)
    for offset, k in [(0, 4096), (0, 4096), (1, 4096), (8, 4096), (0, 4000), (3, 4000), (0, 4096)]:
        x = base[offset:offset + 8 * k].view(8, k)
        qt = qk.quantize(x, "int8", "row")
        data, scale, _ = ref.quantize(x, "int8", "row")
        assert torch.equal(qt.data, data) and torch.equal(qt.scale, scale), (offset, k)
    assert any(v[0] is not None for v in R._LAUNCHES.values())


def test_pdl_options_gating():
    """Programmatic dependent launch only where it exists (NVIDIA sm_90+, compiled kernels), and off inside
    `pdl(False)`."""
    assert R.pdl_options(torch.device("cpu")) == {}
    with R.pdl(True):
        assert R.pdl_options(torch.device("cpu")) == {}
    if DEVICE.type == "cuda" and not R.is_interpreter():
        hopper = torch.cuda.get_device_capability(DEVICE) >= (9, 0) and torch.version.hip is None
        with R.pdl(True):
            assert R.pdl_options(DEVICE) == ({"PDL": True, "launch_pdl": True} if hopper else {})
        with R.pdl(False):
            assert R.pdl_options(DEVICE) == {}


@pytest.mark.gpu
def test_pdl_chain_same_bits():
    """PDL changes when programs start, not what they compute: a chain norm -> GEMV -> GEMV (split-K) -> norm,
    each kernel reading the one before's output while its own programs start early, gives the bits it gives with
    PDL off, eager and replayed in a CUDA graph."""
    import qkernels as qk
    from qkernels.ops import weight_only as WO

    from .helpers import assert_bit_exact, graph_replay
    torch.manual_seed(0)
    x = torch.randn(1, 4096, device=DEVICE, dtype=torch.float16)
    w1 = qk.PackedWeight.from_float(torch.randn(14336, 4096, device=DEVICE), 4, 128)
    w2 = qk.PackedWeight.from_float(torch.randn(4096, 14336, device=DEVICE), 4, 128)
    g = torch.rand(4096, device=DEVICE, dtype=torch.float16)

    def chain():
        h = qk.rms_norm(x, g)
        y = WO._weight_only(h, w1, None, 4, "w1")
        z = WO._weight_only(y, w2, None, 4, "w2")
        return qk.rms_norm(z, g)

    with R.pdl(False):
        want = chain()
    with R.pdl(True):
        assert_bit_exact(chain(), want, "eager")
        assert_bit_exact(graph_replay(chain), want, "graph")


def test_splitk_scratch_is_kept_per_stream_and_grows(monkeypatch):
    """Split-K calls reuse the stream's workspace and counters (nothing allocated per call); a larger request
    grows them (the old buffers are kept: captured graphs may point at them); above WORKSPACE_KEPT_MAX the
    workspace is a fresh allocation. From empty buffers: a test before may have left the stream's workspace at
    WORKSPACE_KEPT_MAX, which no request can grow."""
    from qkernels import _runtime as R
    monkeypatch.setattr(R, "_WORKSPACES", {})
    monkeypatch.setattr(R, "_COUNTERS", {})
    monkeypatch.setattr(R, "_RETIRED", [])
    dev = torch.empty(1, device=DEVICE).device      # with its index, as a tensor passes it
    ws, cnt = R.splitk_scratch(dev, 1000, 10)
    ws2, cnt2 = R.splitk_scratch(dev, 500, 5)
    assert ws2.data_ptr() == ws.data_ptr() and cnt2.data_ptr() == cnt.data_ptr()
    assert ws.dtype == torch.float32 and cnt.dtype == torch.int32 and not cnt[:10].any()
    big, _ = R.splitk_scratch(dev, ws.numel() + 1, 10)
    assert big.numel() > ws.numel() and R.splitk_scratch(dev, 10, 10)[0].data_ptr() == big.data_ptr()
    huge, _ = R.splitk_scratch(dev, R.WORKSPACE_KEPT_MAX + 1, 10)
    assert huge.numel() == R.WORKSPACE_KEPT_MAX + 1 and huge.data_ptr() != big.data_ptr()


@pytest.mark.gpu
def test_compiled_cuda_graph_trees_around_split_k():
    """torch.compile(mode="reduce-overhead") records CUDA graph trees from a private memory pool: the split-K
    scratch a linear first needs inside it is made outside that pool (a kept buffer in it makes the trees refuse
    the graph), and the replays give the eager bits."""
    from qkernels.nn import QuantizedLinear
    from qkernels.ops.weight_only import dispatch

    from .helpers import assert_bit_exact
    lin = torch.nn.Linear(4096, 1024, bias=False, device=DEVICE, dtype=torch.float16)
    ql = QuantizedLinear.from_linear(lin, "w4a16")
    x = torch.randn(1, 4096, device=DEVICE, dtype=torch.float16)
    split = dict(path="gemv", BLOCK_N=4, BLOCK_K=1024, num_warps=4, num_stages=1, SPLIT_K=4, MIN_PROGRAMS=1 << 30)
    torch._dynamo.reset()
    with dispatch.use_config(split):
        want = ql(x)
        fn = torch.compile(lambda t: ql(t) * 1.0, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):          # warm-up, recording, replays
            got = fn(x).clone()
    assert_bit_exact(got, want, "compiled replay")


def test_gpus_too_old_for_triton_run_the_twins(monkeypatch):
    """Below compute capability 7.0 (Pascal) Triton compiles nothing: QuantizedLinear and the model runtime run
    their pure-torch twins on the device (one warning), as the ops do (test_every_op_under_every_capability)."""
    import warnings

    import transformers

    import qkernels as qk
    from qkernels.models import from_pretrained
    monkeypatch.setattr(R, "_WARNED", set())
    dt = torch.float16 if DEVICE.type == "cuda" else torch.bfloat16
    lin = torch.nn.Linear(64, 48).to(DEVICE, dt)
    x = torch.randn(3, 64, device=DEVICE, dtype=dt)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    hf = transformers.LlamaForCausalLM(cfg).to(DEVICE, dt).eval()
    ids = torch.randint(0, 64, (1, 5), device=DEVICE)
    fast = from_pretrained(hf, "w4a16", device=DEVICE, dtype=dt, group_size=32)(ids).float()
    with R.simulate_capability((6, 1)):
        for scheme in ("w4a16", "w8a8"):
            q = qk.QuantizedLinear.from_linear(lin, scheme, group_size=32 if scheme == "w4a16" else None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = q(x)
            assert torch.equal(got, q._reference_forward(x))
            assert len(caught) == (1 if scheme == "w4a16" else 0)           # once per device
            assert "compute capability 6.1" in str(caught[0].message) if caught else True
        twin = from_pretrained(hf, "w4a16", device=DEVICE, dtype=dt, group_size=32)(ids).float()
    assert ((twin - fast).norm() / fast.norm()).item() < 2e-2      # the same model, kernels vs twins
    with R.simulate_capability((7, 5)), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert R.runs_kernels(x.half()) and R.too_old(x.device) is None
        assert not R.runs_kernels(x.bfloat16())       # no bf16 arithmetic before 8.0: the twins


def _op_inputs():
    """Fresh inputs for one call of every public op (small shapes)."""
    import qkernels as qk
    dt = torch.float16
    torch.manual_seed(0)
    x = torch.randn(3, 128, device=DEVICE, dtype=dt)
    w = torch.randn(64, 128, device=DEVICE, dtype=dt)
    w8 = qk.quantize(w, "int8", "row")
    wf8 = qk.quantize(w, "fp8_e4m3", "row")
    return dict(x=x, res=torch.randn_like(x), gw=torch.rand(128, device=DEVICE, dtype=dt) + 0.5,
                a8=torch.randint(-128, 128, (3, 128), device=DEVICE, dtype=torch.int8), w8=w8, wf8=wf8,
                pw4=qk.PackedWeight.from_float(w, 4, 32), pw8=qk.PackedWeight.from_float(w, 8, -1, symmetric=True),
                scores=torch.randn(2, 5, 7, device=DEVICE, dtype=dt), gate_up=torch.randn(3, 128, device=DEVICE,
                                                                                           dtype=dt))


def _every_op(t):
    """name -> (outputs of one call of each public op, tolerance: 0 = the same bits)."""
    import qkernels as qk
    x, a8, w8, wf8 = t["x"], t["a8"], t["w8"], t["wf8"]
    a4 = qk.pack_int4(a8 % 8)
    q8 = qk.quantize(x, "int8", "row")
    q4 = qk.quantize(x, "int4", "group", group_size=32, symmetric=False)
    qf8 = qk.quantize(x, "fp8_e4m3")
    return {
        "quantize int8 row": ((q8.data, q8.scale), 0),
        "quantize int4 group asym": ((q4.data, q4.scale, q4.zero_point), 0),
        "quantize fp8 tensor": ((qf8.data, qf8.scale), 0),
        "quantize int8 static": ((qk.quantize(x, "int8", "row", scale=q8.scale).data,), 0),
        "dequantize": ((qk.dequantize(q8),), 0),
        "quantize_tensor / dequantize_tensor": ((qk.dequantize_tensor(*qk.quantize_tensor(x)),), 0),
        "pack_int4 / unpack_int4": ((a4, qk.unpack_int4(a4)), 0),
        "int8_matmul exact": ((qk.int8_matmul(a8, w8.data.t()),), 0),
        "int8_matmul scaled": ((qk.int8_matmul(a8, w8.data.t(), 0.01, w8.scale.reshape(-1), activation="silu"),), 2e-3),
        "fp8_matmul": ((qk.fp8_matmul(wf8.data[:3], wf8.data.t(), 0.5, wf8.scale.reshape(-1)),), 2e-3),
        "int4_matmul": ((qk.int4_matmul(a4, qk.pack_int4(w8.data % 8), 128),), 0),
        "w8a8_linear": ((qk.w8a8_linear(x, w8.data, w8.scale.reshape(-1)),), 2e-3),
        "w8a8_linear fp8": ((qk.w8a8_linear(x, wf8.data, wf8.scale.reshape(-1), dtype="fp8"),), 2e-3),
        "w4a16_linear": ((qk.w4a16_linear(x, t["pw4"]), qk.w4a16_linear(x[:1], t["pw4"], swiglu=True)), 2e-3),
        "w8a16_linear": ((qk.w8a16_linear(x, t["pw8"]),), 2e-3),
        "rms_norm": (qk.rms_norm(x, t["gw"], residual=t["res"]), 2e-3),
        "rms_norm int8 codes": (qk.rms_norm(x, t["gw"], quantize="int8"), 0),
        "layer_norm": ((qk.layer_norm(x, t["gw"], t["gw"]),), 2e-3),
        "silu_and_mul": ((qk.silu_and_mul(t["gate_up"]),), 2e-3),
        "softmax causal": ((qk.softmax(t["scores"], scale=0.5, causal=True),), 2e-3),
        "w4a16_linear bf16": ((qk.w4a16_linear(x.bfloat16(), t["pw4"]),), 1e-2),
        "rms_norm bf16": ((qk.rms_norm(x.bfloat16(), t["gw"].bfloat16()),), 1e-2),
    }


def test_every_op_under_every_capability(monkeypatch):
    """Every public op gives its result on a GPU of every compute capability from 6.1 up (simulated): below 7.0
    its pure-torch twin runs (one warning per device), an fp8 GEMM below 8.9 and a bf16 call below 8.0 too;
    elsewhere the kernels of that GPU. Compared with the same call on this device as it is: the same bits where
    the arithmetic is exact, else within the op's documented tolerance."""
    import warnings

    from .helpers import assert_bit_exact, rel_err
    inputs = _op_inputs()
    want = _every_op(inputs)
    for cap in ((6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)):
        monkeypatch.setattr(R, "_WARNED", set())
        with R.simulate_capability(cap), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _every_op(inputs)
        notes = {str(c.message) for c in caught}
        assert any("compute capability 6.1" in n and "twins" in n for n in notes) == (cap < (7, 0)), (cap, notes)
        assert any("no FP8 tensor cores" in n for n in notes) == ((7, 0) <= cap < (8, 9)), (cap, notes)
        assert any("no bf16 arithmetic" in n for n in notes) == ((7, 0) <= cap < (8, 0)), (cap, notes)
        for name, (outs, tol) in got.items():
            for g, w in zip(outs, want[name][0]):
                if tol == 0:
                    assert_bit_exact(g, w, f"{name} at {cap}")
                else:
                    assert g.shape == w.shape and g.dtype == w.dtype, (name, cap)
                    assert rel_err(g.float(), w.float()) < tol, (name, cap, rel_err(g.float(), w.float()))


def test_importing_the_ops_and_layers_does_not_import_dynamo():
    """The device queries are marked constant to torch.compile without torch.compiler.assume_constant_result,
    whose import of torch._dynamo cost about a second at our import (every CLI call and test process)."""
    code = ("import sys, qkernels, qkernels.ops.gemm, qkernels.ops.weight_only, qkernels.nn, qkernels.models\n"
            "print('torch._dynamo' in sys.modules, qkernels._runtime.capability._dynamo_marked_constant)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "True"], run.stdout

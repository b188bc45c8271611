"""Device facts and argument checks shared by every launcher.

Nothing here touches a GPU at import time: device queries are cached functions called at
the first launch.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _constant_to_dynamo(fn):
    """torch.compiler.assume_constant_result's mark, set without it: that decorator imports torch._dynamo (about a
    second) at our import. A query so marked is called once while torch.compile traces and its result taken as a
    constant, instead of being traced through its functools cache (Dynamo warns of each cache it traces)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_to_dynamo        # (below too)
def is_interpreter() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (TRITON_INTERPRET=1).

    Triton decides this when a kernel is decorated, so it cannot change in a running process.
    """
    return _interpreter()


@functools.cache
def _interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _device_props(index: int):
    return torch.cuda.get_device_properties(index)


def device_name(device: torch.device | None = None) -> str:
    if is_interpreter() or not torch.cuda.is_available():
        return "cpu-interpreter" if is_interpreter() else "cpu"
    index = (device.index if device is not None and device.index is not None
             else torch.cuda.current_device())
    return _device_props(index).name


# Triton compiles for NVIDIA GPUs of compute capability 7.0 (Volta) and newer. On an older GPU (Pascal, 6.x)
# every op runs its pure-torch twin on that GPU instead of its kernel (call_op, register_twin), and
# QuantizedLinear, the fused modules and qkernels.models take the twins' path as a whole (runs_kernels).
MIN_CAPABILITY = (7, 0)
_SIMULATED: list = [None]       # set only inside simulate_capability()


def simulate_capability(cap: tuple[int, int] | None):
    """Scoped: every device (the interpreter's CPU too) reports compute capability `cap`, so tests reach the
    paths of older GPUs (kernel fallbacks, pure-torch twins) on any machine."""
    return scoped_value(_SIMULATED, cap)


# the device queries a model's forward asks: constants to torch.compile (_constant_to_dynamo)
@_constant_to_dynamo
def capability(device: torch.device) -> tuple[int, int]:
    if _SIMULATED[0] is not None:
        return tuple(_SIMULATED[0])
    if device.type != "cuda":
        return (0, 0)
    index = device.index if device.index is not None else torch.cuda.current_device()
    p = _device_props(index)
    return (p.major, p.minor)


@_constant_to_dynamo
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_props(index).multi_processor_count


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; used for config files and result folders."""
    low = name.lower()
    for key in ("h200", "h100", "h20", "a100", "l40s", "l4", "a10g", "b200", "rtx 4090", "rtx 3090"):
        if key in low:
            return key.replace(" ", "")
    return "".join(c if c.isalnum() else "_" for c in low).strip("_") or "unknown"


# ---------------------------------------------------------------------------------------------
# argument checks: every message names the argument, what was expected and what was got


def check_tensor(name: str, t, *, dtypes=None, ndim_min: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        want = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must have dtype in ({want}), got {str(t.dtype).replace('torch.', '')}")
    if ndim_min is not None and t.dim() < ndim_min:
        raise ValueError(f"{name} must have at least {ndim_min} dimension(s), got shape {tuple(t.shape)}")


def check_kernel_device(name: str, t: torch.Tensor) -> None:
    """Ops run on CUDA tensors (their kernels, or on a GPU too old for Triton their twins), or on CPU tensors
    under the Triton interpreter."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and is_interpreter()):
        return      # a GPU too old for Triton runs the op's twin (call_op)
    raise RuntimeError(
        f"{name} must be on a CUDA device, got {t.device}"
        + ("" if t.device.type != "cpu" else
           " (set TRITON_INTERPRET=1 before importing qkernels to run the kernels on the CPU)"))


def runs_kernels(t: torch.Tensor) -> bool:
    """Whether qkernels' kernels can run on t's device (CUDA of compute capability >= MIN_CAPABILITY, 8.0 for
    bf16 tensors, or the CPU under the interpreter). Modules (QuantizedLinear, qkernels.models) fall back to the
    reference twins elsewhere, on the same device (one warning per device and reason), as the ops do one by one
    (call_op)."""
    return _runs_on(t.device, t.dtype is torch.bfloat16)


@_constant_to_dynamo
def _runs_on(device: torch.device, bf16: bool) -> bool:
    if not (device.type == "cuda" or (device.type == "cpu" and is_interpreter())):
        return False
    if _SIMULATED[0] is None:
        if device.type != "cuda":
            return True
        why = _cuda_why_not(device, bf16)
    else:
        why = _why_not(device, bf16)
    if why:
        warn_once((str(device), why), f"qkernels: {why}: the ops, QuantizedLinear and the model runtime run "
                  f"their pure-torch twins on it (the reference numerics, slower)", stacklevel=5)
    return not why


def _why_not(device: torch.device, bf16: bool) -> str | None:
    """Why the kernels cannot run on this device (for bf16 tensors when bf16), None when they can."""
    why = _why_old(device)
    cap = capability(device)
    if why is None and bf16 and cap < (8, 0):
        why = (f"{device_name(device)} of compute capability {cap[0]}.{cap[1]} has no bf16 arithmetic (8.0 or "
               f"newer) for the kernels' bf16 code")
    return why


_cuda_why_not = functools.cache(_why_not)      # a real GPU's answer never changes: asked on every op call


_WARNED: set = set()


def warn_once(key, message: str, stacklevel: int = 3) -> None:
    """One warning per key (a device and a reason) for the life of the process."""
    if key not in _WARNED:
        _WARNED.add(key)
        import warnings
        warnings.warn(message, stacklevel=stacklevel)


def lacks_fp8(device: torch.device) -> bool:
    """Whether the fp8 GEMM kernels cannot run on the device: no FP8 tensor cores (compute capability < 8.9).
    The interpreter runs them unless a capability is simulated."""
    if device.type != "cuda" and _SIMULATED[0] is None:
        return False
    return capability(device) < (8, 9)


def too_old(device: torch.device) -> str | None:
    """Why Triton's kernels cannot run on this device (None when they can); once per device (launchers and
    modules ask on every call)."""
    if _SIMULATED[0] is None:
        return _cuda_too_old(device) if device.type == "cuda" else None
    return _why_old(device)


@functools.cache
def _cuda_too_old(device: torch.device) -> str | None:
    return _why_old(device)


def _why_old(device: torch.device) -> str | None:
    cap = capability(device)
    if cap < MIN_CAPABILITY:
        return (f"{device_name(device)} of compute capability {cap[0]}.{cap[1]} (Triton's kernels need "
                f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer)")
    return None


def check_same_device(ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and isinstance(t, torch.Tensor) and t.device != ref.device:
            raise RuntimeError(f"{name} must be on the same device as {ref_name} ({ref.device}), got {t.device}")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids; triton.cdiv is a constexpr function that costs ~3 us per host call."""
    return -(-a // b)


def k_splits(split_k: int, steps: int, programs: int = 1, min_programs: int | None = None) -> int:
    """How many slices to split K into (the split-K kernels' SPLIT_K): up to split_k, and with min_programs only
    while the grid has fewer than min_programs programs (no min_programs in a config: no split); at most one per
    step, in equal slices of whole steps, so none is empty."""
    if min_programs is not None:
        split_k = min(split_k, cdiv(min_programs, programs))
    split = max(1, min(split_k, steps))
    return cdiv(steps, cdiv(steps, split)) if split > 1 else 1


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# ---------------------------------------------------------------------------------------------
# output allocation, with a scoped "poison" mode for tests: unwritten elements then show up as
# NaN (floats) or 0x5A (integers) instead of whatever torch.empty returned.

_POISON = [False]


class poison_outputs:
    """Context manager: launchers fill their outputs with a poison value before launching."""

    def __enter__(self):
        self._prev = _POISON[0]
        _POISON[0] = True
        return self

    def __exit__(self, *exc):
        _POISON[0] = self._prev
        return False


def poisoning() -> bool:
    """Whether alloc() poisons what it makes (inside poison_outputs())."""
    return _POISON[0]


def alloc(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An op's output or temporary (poisoned inside poison_outputs(); noted by recording())."""
    if not _POISON[0]:
        out = torch.empty(shape, dtype=dtype, device=device)
    elif dtype.is_floating_point and dtype.itemsize == 1:   # fp8: NaN bit pattern
        out = torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
    elif dtype.is_floating_point:
        out = torch.full(shape, float("nan"), dtype=dtype, device=device)
    else:
        out = torch.full(shape, 0x5A, dtype=dtype, device=device)
    rec = getattr(_THREAD, "recording", None)
    if rec is not None:
        rec.append(out)
    return out


# ---------------------------------------------------------------------------------------------
# kernel launches with a lean host path


# (kernel, device, constexprs, argument facts) -> (its launcher (_launcher), constexpr placeholders); (None, ()): not
# eligible
_LAUNCHES: dict = {}
_FAST_LAUNCH = [os.environ.get("QKERNELS_FAST_LAUNCH", "1") != "0"]


@contextlib.contextmanager
def scoped_update(table: dict, overrides: dict, what: str):
    """Update `table` (a module's tile dict) for the duration of the block; unknown keys are an error."""
    bad = set(overrides) - set(table)
    if bad:
        raise KeyError(f"unknown {what} keys {sorted(bad)}; known: {sorted(table)}")
    old = dict(table)
    table.update(overrides)
    try:
        yield
    finally:
        table.clear()
        table.update(old)


@contextlib.contextmanager
def scoped_value(slot: list, value):
    """slot[0] = value inside the block, the old value back after it: the one mechanism behind qkernels'
    scoped switches and overrides (one-element lists, read on every call)."""
    old = slot[0]
    slot[0] = value
    try:
        yield
    finally:
        slot[0] = old


def fast_launch(enabled: bool):
    """Scoped switch of the direct launch (QKERNELS_FAST_LAUNCH): profilers compare both paths with it."""
    return scoped_value(_FAST_LAUNCH, bool(enabled))


_PDL = [os.environ.get("QKERNELS_PDL", "1") not in ("", "0")]
_NO_PDL: dict = {}
_WITH_PDL = {"PDL": True, "launch_pdl": True}


def pdl_options(device: torch.device) -> dict:
    """Launch keywords for programmatic dependent launch: {"PDL": True, "launch_pdl": True} on NVIDIA GPUs of
    sm_90+ (Hopper), {} elsewhere or when switched off (QKERNELS_PDL=0, `pdl(False)`). A kernel launched so may
    start while the previous kernel in the stream still runs; its PDL constexpr makes it fetch only weights
    until griddepcontrol.wait (kernels/_common._pdl_wait), and lets the next kernel start early in turn. A
    decode step is a chain of short kernels: each one's launch, ramp-up and weight fetch overlap the tail of
    the one before."""
    return _WITH_PDL if _PDL[0] and _pdl_capable(device) else _NO_PDL


@functools.cache
def _pdl_capable(device: torch.device) -> bool:
    """Once per device (launchers ask on every call)."""
    return (device.type == "cuda" and not is_interpreter() and torch.version.hip is None
            and capability(device) >= (9, 0))


def pdl(enabled: bool):
    """Scoped switch of programmatic dependent launch (QKERNELS_PDL): benchmarks compare both with it. CUDA
    graphs keep what was captured."""
    return scoped_value(_PDL, bool(enabled))


# (device index, stream) -> the split-K scratch of that stream: int32 tile counters, zero between launches (the
# last program of a tile resets its counter), and fp32 workspaces for the partials; one set per stream, so
# concurrent launches on two streams do not share them
_COUNTERS: dict = {}
_WORKSPACES: dict = {}
_RETIRED: list = []
WORKSPACE_KEPT_MAX = 1 << 22     # fp32 elements (16 MB): larger split-K workspaces are allocated per call


def splitk_scratch(device: torch.device, numel: int, counters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace of at least numel elements, at least `counters` tile counters) of the current stream, for
    the kernels that add split-K partials themselves. Kernels on one stream run one after another (with
    programmatic dependent launch, a kernel writes its partials and touches its counters only after the one
    before has completed), so they share the buffers and a split-K call allocates nothing; a workspace above
    WORKSPACE_KEPT_MAX elements is a fresh allocation. Made inside a CUDA-graph capture, the buffers come from
    the graph's pool (the counters' zeroing recorded once in that graph) and are kept for the capture stream,
    so the graph's other launches and later graphs captured on that stream reuse them without a memset per
    launch: graphs captured on one stream must not be replayed concurrently on two. Made outside a capture they
    come from PyTorch's default pool even where this thread allocates from a private one (torch.compile's CUDA
    graph trees warm up that way, and refuse a graph whose pool holds tensors that are not its outputs)."""
    key = _stream_key(device)
    cnt = _stream_buffer(_COUNTERS, key, counters, torch.zeros, torch.int32, device)
    if numel > WORKSPACE_KEPT_MAX:
        return torch.empty(numel, dtype=torch.float32, device=device), cnt
    return _stream_buffer(_WORKSPACES, key, numel, torch.empty, torch.float32, device), cnt


def _stream_key(device: torch.device) -> tuple:
    # the raw stream Triton's launch reads too (the interpreter runs programs one after another: one buffer)
    if device.type != "cuda":
        return (device.type, None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (index, _triton_runtime()[1](index))


def _stream_buffer(buffers: dict, key: tuple, n: int, make, dtype: torch.dtype, device: torch.device):
    buf = buffers.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:     # captured graphs may still point at it: never freed
            _RETIRED.append(buf)
        buf = buffers[key] = _kept(make, max(n, 1 << 16), dtype, device)
    return buf


def _kept(make, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """make(n) for a buffer kept across calls. Inside a capture: from the capture's pool, the only memory there is
    then. Outside: allocated by a helper thread, as a private pool set up for this thread (torch.compile's CUDA
    graph trees warm up inside one) claims only this thread's allocations; zeroed here, on the current stream."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make(n, dtype=dtype, device=device)
    out = []
    helper = threading.Thread(target=lambda: out.append(torch.empty(n, dtype=dtype, device=device)))
    helper.start()
    helper.join()
    return out[0].zero_() if make is torch.zeros else out[0]


_THREAD = threading.local()
_INTERPRETER_LOCK = threading.Lock()


def ensure_context(device: torch.device) -> None:
    """Make a CUDA context current on this thread, once per thread. Triton's launcher sets one itself, but it
    encodes host-built TMA descriptors before it does: the first descriptor launch from a new Python thread would
    fail with "invalid device context". Any runtime call on the device makes its primary context current."""
    if not getattr(_THREAD, "has_context", False):
        torch.cuda.current_stream(device).query()
        _THREAD.has_context = True


def _arg_facts(args: tuple) -> tuple:
    """Everything Triton specializes runtime arguments on, or more: for a tensor its dtype and 16-byte
    alignment; for an int == 1, divisibility by 16 and its type class (i32 / i64 / u64); for anything
    else its type. Equal facts therefore mean Triton would pick the same compiled kernel."""
    return tuple([(a.dtype, not a.data_ptr() & 15) if isinstance(a, torch.Tensor) else
                  (a == 1, not a & 15, -2147483648 <= a <= 2147483647, a < 9223372036854775808)
                  if a.__class__ is int else a.__class__ for a in args])


@functools.cache
def _triton_runtime():
    from triton import knobs
    from triton.runtime import driver
    return driver.active.get_current_device, driver.active.get_current_stream, knobs.runtime


def launch(kernel, grid: tuple, *args, **constexprs) -> None:
    """kernel[grid](*args, **constexprs), with runtime arguments positional (in the kernel's order) and
    constexprs / launch options by keyword.

    Triton's own launch path re-binds and re-specializes every argument in Python on each call (~20 us on a
    slow host). Here the first launch for a given set of argument facts goes through Triton (which compiles
    or finds the kernel) and the CompiledKernel it returns is kept; later launches with the same facts
    (_arg_facts: a refinement of Triton's specialization key) call its launcher directly. Launch hooks
    (profilers), the interpreter and QKERNELS_FAST_LAUNCH=0 take Triton's path every time; under the interpreter
    one launch runs at a time (its grid state is global), so ops called from several threads stay correct."""
    if is_interpreter():
        with _INTERPRETER_LOCK:     # the interpreter keeps a launch's grid state in module globals
            kernel[grid](*args, **constexprs)
        return
    if not _FAST_LAUNCH[0]:
        kernel[grid](*args, **constexprs)
        return
    get_device, get_stream, knobs = _triton_runtime()
    device = get_device()
    key = (id(kernel), device, tuple(constexprs.items()), _arg_facts(args))
    entry = _LAUNCHES.get(key)
    hooked = _hooked(knobs.launch_enter_hook) or _hooked(knobs.launch_exit_hook)
    if entry is None or hooked:
        compiled = kernel[grid](*args, **constexprs)
        if entry is None:
            entry = _LAUNCHES[key] = (_launcher(compiled), (None,) * (len(kernel.params) - len(args))) \
                if _fast_eligible(kernel, args) else (None, ())
        rec = getattr(_THREAD, "recording", None)
        if rec is not None:                 # what the direct launch would run (nothing to replay under hooks)
            rec.append(None if hooked or entry[0] is None else (entry[0], _grid3(grid), args, entry[1], device))
        return
    launcher, slots = entry
    if launcher is None:
        kernel[grid](*args, **constexprs)
        rec = getattr(_THREAD, "recording", None)
        if rec is not None:
            rec.append(None)
        return
    grid = _grid3(grid)
    launcher[0](*grid, get_stream(device), *launcher[1], *args, *slots)
    rec = getattr(_THREAD, "recording", None)
    if rec is not None:
        rec.append((launcher, grid, args, slots, device))


def _launcher(compiled) -> tuple:
    """(callable, leading arguments) that launch a CompiledKernel when called as callable(gridX, gridY, gridZ,
    stream, *leading, *kernel arguments): the C entry point of Triton's launcher where the kernel needs no scratch
    memory (the launcher's Python wrapper only allocates that), else the wrapper."""
    run = compiled.run
    entry = getattr(run, "launch", None)
    if (entry is not None and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0):
        return entry, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                       compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


@contextlib.contextmanager
def recording():
    """What this thread's block does, in order, in the list the block gets: the direct launches (launcher (_launcher),
    grid, args, constexpr placeholders, device), None for work that cannot be replayed (a launch through Triton's
    own path, cuBLAS: not_replayable), and the tensors alloc() made (ops/_eager.py replays them with new arguments
    in place of an op's own launch path)."""
    out: list = []
    outer = getattr(_THREAD, "recording", None)
    _THREAD.recording = out
    try:
        yield out
    finally:
        _THREAD.recording = outer
        if outer is not None:
            outer.extend(out)


RETRY = "retry"     # in a recording: this call did one-off work (tuning): record the next call like it instead


def unreplayable() -> None:
    """Mark this thread's recording (if any) as not to be kept: the call is doing work a later call like it will
    not do (autotuning its config), so that later call is the one to record."""
    rec = getattr(_THREAD, "recording", None)
    if rec is not None:
        rec.append(RETRY)


def not_replayable() -> None:
    """Mark this thread's recording (if any) as never to be replayed: the call does work that is not a direct
    launch (cuBLAS writing into a tensor the call allocated), which a replay of its launches would leave out."""
    rec = getattr(_THREAD, "recording", None)
    if rec is not None:
        rec.append(None)


def replay_state() -> tuple:
    """What a recorded launch depends on besides its arguments: the direct launch on, no launch hooks, the
    PDL switch, no simulated capability. A replay is valid only while this equals its value at recording."""
    if is_interpreter() or not _FAST_LAUNCH[0]:
        return False, _PDL[0], _SIMULATED[0]
    knobs = _triton_runtime()[2]
    return (not _hooked(knobs.launch_enter_hook) and not _hooked(knobs.launch_exit_hook), _PDL[0], _SIMULATED[0])


def replay(rec: tuple, args: tuple) -> None:
    """Launch a recorded launch again (same kernel, grid, device, constexprs) with runtime arguments `args`,
    whose specialization facts (_arg_facts) must equal the recorded ones: the caller checks what can change
    (the current device included: current_device_index)."""
    launcher, grid, _, slots, device = rec
    launcher[0](*grid, _triton_runtime()[1](device), *launcher[1], *args, *slots)


def current_device_index() -> int:
    """The device a launch goes to now (what `launch` keys its cache on)."""
    return _triton_runtime()[0]()


def scratch_now(device: torch.device) -> tuple:
    """The current stream's split-K (workspace, counters) as splitk_scratch made them, without making any:
    (None, None) where the stream has none yet."""
    key = _stream_key(device)
    return _WORKSPACES.get(key), _COUNTERS.get(key)


def _grid3(grid: tuple) -> tuple:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


def _hooked(hook) -> bool:
    """Whether a launch hook would do anything: Triton 3.6 keeps an (empty) HookChain there by default."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _fast_eligible(kernel, args) -> bool:
    """The direct launch passes args positionally followed by placeholders for the constexprs (the launcher
    skips constexpr slots), so the runtime parameters must be exactly the leading ones and every later
    parameter a constexpr."""
    params = kernel.params
    return (len(args) <= len(params) and not any(p.is_constexpr for p in params[:len(args)])
            and all(p.is_constexpr for p in params[len(args):]))


_TWINS: dict = {}


def register_twin(op, twin) -> None:
    """The pure-torch twin of custom op `op` (qkernels.reference arithmetic, same arguments and outputs as its
    implementation), which call_op runs on GPUs too old for Triton."""
    _TWINS[op] = twin


def call_op(op, impl, *args):
    """Run a public op: through its torch.library custom op while torch.compile / export trace
    (so the graph sees one opaque op with a fake implementation), and straight through the Python
    implementation in eager mode, which skips about 10 us of dispatcher overhead per call. On a GPU too old for
    Triton (args[0] on it) the op's twin runs there instead, with one warning per device."""
    if torch.compiler.is_compiling():
        return op(*args)
    device = args[0].device
    if (device.type == "cuda" or _SIMULATED[0] is not None) and not _runs_on(device,
                                                                             args[0].dtype is torch.bfloat16):
        return _TWINS[op](*args)
    return impl(*args)


def cache_dir():
    """qkernels' cache directory (autotune results, fetched evaluation data): $QKERNELS_CACHE_DIR, default
    ~/.cache/qkernels. Not created here."""
    from pathlib import Path
    return Path(os.environ.get("QKERNELS_CACHE_DIR") or Path.home() / ".cache" / "qkernels")

"""CUDA graphs of a forward keyed by its input shapes: a call whose key has been seen `capture_after` times is captured
once and replayed from then on, the inputs copied into the graph's static buffers and the outputs cloned out of it.

What it is for: the parts of a forward that run eagerly, once per prompt, and whose host work outweighs their GPU
time (a vision tower's blocks at one image's patches: dozens of small launches per block on a slow host). The decode
step has its own graph (generate.DecodeGraph). Graphs are used only where they can be: CUDA inputs, no gradient
recording, not inside another capture, not under the Triton interpreter, not inside `eager()`; elsewhere the
function runs as it is. A key seen once stays eager (a shape that never comes back costs no capture); at most
`max_graphs` graphs are kept (the least recently used one is dropped), all in one memory pool, their static inputs
views of one shared buffer (graphs replay one at a time, each after its inputs are copied in: many graphs cost the
memory of the largest one's inputs, not of all of them). A capture that fails (an operation CUDA graphs cannot hold)
warns once and leaves this instance eager.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from collections import OrderedDict
from typing import Callable, Hashable

import torch

from .._runtime import is_interpreter


_EAGER = threading.local()


@contextlib.contextmanager
def eager():
    """Inside, every ShapeGraphs runs its function as it is (generate(use_graph=False))."""
    depth = getattr(_EAGER, "depth", 0)
    _EAGER.depth = depth + 1
    try:
        yield
    finally:
        _EAGER.depth = depth


_VERSION = [0]        # modules, parameters and buffers registered anywhere in the process so far (once watched)
_HOOKS: list = []


def _registered(*args) -> None:
    # not while torch.compile traces a forward that registers something (a static cache's buffers): a traced
    # increment would put the counter in the compiled graph's guards and recompile it at every call
    if not torch.compiler.is_compiling():
        _VERSION[0] += 1


def weights_key(module: torch.nn.Module) -> tuple:
    """Where every parameter and buffer of module lies (its data pointers): part of a graph's key, so that a module
    moved, re-quantized, given new layers or a new cache since a capture is captured anew, never replayed on memory
    that is no longer its own. Walking every tensor costs the host ~2 µs per tensor, so the key is kept on the
    module and walked again only when a module, parameter or buffer was registered anywhere since (PyTorch's global
    registration hooks, installed at the first call) or the first parameter or buffer moved (.to(), .half())."""
    if not _HOOKS:
        from torch.nn.modules import module as nn_module
        _HOOKS.extend([nn_module.register_module_module_registration_hook(_registered),
                       nn_module.register_module_parameter_registration_hook(_registered),
                       nn_module.register_module_buffer_registration_hook(_registered)])
    first = (next(module.parameters(), None), next(module.buffers(), None))
    stamp = (_VERSION[0], *(t.data_ptr() if t is not None else 0 for t in first))
    kept = module.__dict__.get("_qkernels_weights_key")
    if kept is not None and kept[0] == stamp:
        return kept[1]
    key = tuple(t.data_ptr() for t in itertools.chain(module.parameters(), module.buffers()))
    module.__dict__["_qkernels_weights_key"] = (stamp, key)
    return key


def _end_generator_capture(dev: torch.device) -> None:
    """After a capture that failed: the device's default random generator was put in capture mode when the capture
    began and left there when it did not end, so every random op after would fail ("Offset increment outside graph
    capture"); a copy of its state (seed and offset, not in capture mode) takes its place."""
    gen = torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
    gen.graphsafe_set_state(gen.clone_state())


ARENA_ALIGN = 256     # bytes: where each static input starts in the shared buffer
SEEN_MAX = 4096       # keys counted before their capture, at most


class ShapeGraphs:
    """CUDA graphs of functions keyed by the caller's key and the inputs' shapes, dtypes and devices:
    `graphs(key, fn, *inputs)` runs fn(*inputs) eagerly until the key has come `capture_after` times, then captures
    it and replays it. `graphs.graphs` holds the captured ones (least recently used first), `clear()` drops them."""

    def __init__(self, capture_after: int = 2, max_graphs: int = 8):
        if not isinstance(capture_after, int) or capture_after < 1:
            raise ValueError(f"capture_after must be an int >= 1 (calls of a key before its capture), "
                             f"got {capture_after!r}")
        if not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an int >= 1, got {max_graphs!r}")
        self.capture_after, self.max_graphs = capture_after, max_graphs
        self.enabled = True
        self.seen: dict = {}
        self.graphs: OrderedDict = OrderedDict()      # key -> (graph, static inputs, static outputs, their buffer)
        self.pool = None
        self.arena: torch.Tensor | None = None        # the static inputs' shared buffer (bytes)

    def could_run(self, inputs: tuple) -> bool:
        """Where a graph of these inputs could run at all: CUDA tensors, no gradients, not under the interpreter."""
        return (not torch.is_grad_enabled() and not is_interpreter()
                and all(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs))

    def usable(self, inputs: tuple) -> bool:
        """could_run, and this instance not turned eager (graphs.eager(), a failed capture), not inside a capture."""
        return (self.enabled and not getattr(_EAGER, "depth", 0) and self.could_run(inputs)
                and not torch.cuda.is_current_stream_capturing())

    def __call__(self, key: Hashable | Callable[[], Hashable], fn: Callable, *inputs: torch.Tensor):
        """fn(*inputs): a tensor or a tuple of tensors, computed on the GPU from inputs alone (no host reads of
        them, no host-to-device copies) whenever the call's key is the same; replayed from a graph once the key has
        come `capture_after` times, else run eagerly. key: a hashable, or a function returning one (called only
        where a graph can run: a key that costs host time to build)."""
        if not inputs:
            raise ValueError("ShapeGraphs needs at least one input tensor (the graph's static input)")
        if not self.usable(inputs):
            return fn(*inputs)
        # inference mode in the key: a graph captured in it holds inference tensors, which a call outside it may
        # not copy into
        key = (key() if callable(key) else key, torch.is_inference_mode_enabled(),
               tuple((tuple(t.shape), t.dtype, t.device) for t in inputs))
        entry = self.graphs.get(key)
        if entry is None:
            if len(self.seen) > SEEN_MAX:             # keys met once, long ago: forgotten rather than piling up
                self.seen.clear()
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] < self.capture_after:
                return fn(*inputs)
            entry = self._capture(key, fn, inputs)
            if entry is None:
                return fn(*inputs)
        self.graphs.move_to_end(key)
        graph, static_in, static_out, _ = entry
        for s, t in zip(static_in, inputs):
            s.copy_(t)
        graph.replay()
        if isinstance(static_out, torch.Tensor):
            return static_out.clone()
        return tuple(t.clone() for t in static_out)

    def static_inputs(self, inputs: tuple) -> tuple:
        """Copies of inputs as views of self.arena (each at a 256-byte boundary), the arena grown (doubled at least)
        where they do not fit it; a graph keeps the arena its inputs view alive."""
        sizes = [-(-t.numel() * t.element_size() // ARENA_ALIGN) * ARENA_ALIGN for t in inputs]
        need = sum(sizes)
        if self.arena is None or self.arena.numel() < need or self.arena.device != inputs[0].device:
            grow = 2 * self.arena.numel() if self.arena is not None and self.arena.device == inputs[0].device else 0
            with torch.inference_mode(False):     # a normal tensor: graphs captured in and out of inference mode
                self.arena = torch.empty(max(need, grow), dtype=torch.uint8, device=inputs[0].device)
        out, at = [], 0
        for t, n in zip(inputs, sizes):
            v = self.arena[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            out.append(v.copy_(t))
            at += n
        return tuple(out)

    def _capture(self, key, fn: Callable, inputs: tuple):
        dev = inputs[0].device
        static_in = self.static_inputs(inputs)
        try:
            s = torch.cuda.Stream(dev)
            s.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(s):
                fn(*static_in)                       # first-call work (allocations, plans) outside the capture
            torch.cuda.current_stream(dev).wait_stream(s)
            if self.pool is None or not self.graphs:
                # a pool lives while a graph captured into it does: once clear() or the LRU dropped them all, the
                # allocator has let the old one go and a capture into its handle would fail
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static_out = fn(*static_in)
        except RuntimeError as e:
            self.enabled = False
            _end_generator_capture(dev)
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {str(e)[:200]}); running eagerly from "
                          f"here on", RuntimeWarning, stacklevel=3)
            return None
        if not (isinstance(static_out, torch.Tensor)
                or isinstance(static_out, tuple) and all(isinstance(t, torch.Tensor) for t in static_out)):
            raise TypeError(f"fn must return a tensor or a tuple of tensors, got {type(static_out).__name__}")
        self.graphs[key] = (graph, static_in, static_out, self.arena)
        self.seen.pop(key, None)
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return self.graphs[key]

    def clear(self) -> None:
        """Drop every graph (the buffers they write may be gone: a cache reallocated, weights moved)."""
        self.graphs.clear()
        self.seen.clear()

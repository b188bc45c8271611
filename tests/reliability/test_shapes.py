"""The shape grid: every public op at M = 0 and M across tile edges (every M from 1 to 129 on a
GPU), odd widths, 3-D inputs, sliced / transposed / unaligned views. Each layout's result equals the
contiguous-input result bit for bit, outputs are poisoned first, and M = 0 gives empty results."""
import pytest
import torch

import qkernels as qk

from ..conftest import ON_GPU
from ..helpers import as_bits, assert_bit_exact
from .ops import LAYOUTS, OPS, as_tuple, available, relayout, relayout_args

M_GRID = list(range(0, 130)) if ON_GPU else [0, 1, 2, 17, 64, 129]


def _cases():
    for spec in OPS:
        ks = spec.ks if ON_GPU else spec.ks[:1]
        for K in ks:
            yield pytest.param(spec, K, id=f"{spec.name}-K{K}")


def _run(spec, args):
    with qk.poison_outputs():
        return as_tuple(spec.run(*args))


@pytest.mark.parametrize("spec,K", list(_cases()))
def test_layouts_equal_contiguous(spec, K):
    if not available(spec):
        pytest.skip("fp8 needs sm_89+")
    for M in M_GRID:
        args = spec.make(M, K, spec.n)
        want = _run(spec, args)
        for t in want:       # inputs are finite: a NaN is a poisoned, unwritten element
            assert not (t.dtype.is_floating_point and t.dtype.itemsize > 1 and torch.isnan(t).any()), \
                f"{spec.name} M={M}: unwritten (poisoned) output elements"
        for how in LAYOUTS:
            got = _run(spec, relayout_args(spec, args, how))
            for g, w in zip(got, want):
                assert_bit_exact(as_bits(g).reshape(as_bits(w).shape), as_bits(w), f"{spec.name} M={M} K={K} {how}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 14336, 4096), (128, 4096, 14336), (4096, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["int8_matmul", "w8a8_linear", "w4a16_linear", "w8a16_linear", "fp8_matmul"])
def test_llama_shapes_views(name, shape):
    from .ops import OPS_BY_NAME
    spec = OPS_BY_NAME[name]
    if not available(spec):
        pytest.skip("fp8 needs sm_89+")
    M, N, K = shape
    args = spec.make(M, K, N)
    want = _run(spec, args)
    got = _run(spec, (relayout(args[0], "sliced"), *args[1:]))
    for g, w in zip(got, want):
        assert_bit_exact(as_bits(g), as_bits(w), f"{name} {shape}")

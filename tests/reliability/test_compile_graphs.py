"""Every custom op is opchecked; every public op runs under torch.compile(fullgraph=True) and inside
CUDA-graph capture with the eager result, bit for bit (gpu)."""
import pathlib
import re

import pytest
import torch

from ..helpers import as_bits, assert_bit_exact, graph_replay
from .ops import OPS, as_tuple, available

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _registered_ops() -> set[str]:
    import qkernels.ops.attention  # noqa: F401  (registration happens at import)
    import qkernels.ops.fused  # noqa: F401
    import qkernels.ops.gemm  # noqa: F401
    import qkernels.ops.quant  # noqa: F401
    import qkernels.ops.w4a8  # noqa: F401
    import qkernels.ops.weight_only  # noqa: F401
    return {name for name in dir(torch.ops.qkernels) if not name.startswith("_")
            and isinstance(getattr(torch.ops.qkernels, name), torch._ops.OpOverloadPacket)}


def test_every_custom_op_is_opchecked():
    """The opcheck calls live next to each op's tests; this test finds every registered qkernels::
    op and the test that opchecks it."""
    ops = _registered_ops()
    assert len(ops) >= 10, ops
    import qkernels.ops as pkg
    src = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    attrs = set(re.findall(r"opcheck\(\w+\.(_\w+_op)\b", src))     # e.g. opcheck(F._norm_op, ...)
    checked = set()
    for mod in (pkg.attention, pkg.fused, pkg.gemm, pkg.quant, pkg.weight_only, pkg.w4a8):
        for a in attrs:
            if hasattr(mod, a):
                checked.add(getattr(mod, a)._name)
    missing = {o for o in ops if o not in checked}
    assert not missing, f"custom ops without a torch.library.opcheck test: {sorted(missing)}"


@pytest.mark.gpu
@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
@pytest.mark.parametrize("M", [1, 33, 256])
def test_compile_fullgraph_and_graph_replay(spec, M):
    if not available(spec):
        pytest.skip("fp8 needs sm_89+")
    args = spec.make(M, spec.ks[0], spec.n)
    eager = as_tuple(spec.run(*args))
    torch._dynamo.reset()
    compiled = as_tuple(torch.compile(spec.run, fullgraph=True)(*args))
    replayed = as_tuple(graph_replay(lambda: spec.run(*args)))
    for e, c, r in zip(eager, compiled, replayed):
        assert_bit_exact(as_bits(c), as_bits(e), f"{spec.name} compiled")
        assert_bit_exact(as_bits(r), as_bits(e), f"{spec.name} graph replay")

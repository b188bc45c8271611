"""Programmatic dependent launch is one mechanism (kernels/_common._pdl_wait and its Gluon twin in
weight_only/gluon_shared): every kernel that takes the PDL constexpr calls it, and nothing else touches
griddepcontrol. A kernel launched with launch_pdl that never waited would read its inputs while the kernel before
still writes them; one that let the next start on its own would bring back the cascade of
docs/design/weight-only.md, "Where a kernel lets the next start". The CPU interpreter runs no kernel with PDL on, so this is checked on the source."""
import ast
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "src" / "qkernels" / "kernels"
HELPERS = {KERNELS / "_common.py", KERNELS / "weight_only" / "gluon_shared.py"}


def _kernels_taking_pdl():
    for path in sorted(KERNELS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and any(a.arg == "PDL" for a in fn.args.args + fn.args.kwonlyargs):
                yield path, fn


def test_every_pdl_kernel_waits_through_the_one_helper():
    found = 0
    for path, fn in _kernels_taking_pdl():
        if path in HELPERS:
            continue
        found += 1
        calls = [n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        assert "_pdl_wait" in calls, f"{path.name}:{fn.name} takes PDL but never calls _pdl_wait"
    assert found >= 10, found      # the GEMVs, GEMMs, norms, SwiGLU, quantize, attention kernels


def test_griddepcontrol_only_in_the_helpers():
    for path in sorted(KERNELS.rglob("*.py")):
        if path in HELPERS:
            continue
        text = path.read_text()
        assert "gdc_launch_dependents" not in text and "gdc_wait" not in text, path.name

"""scripts/ablate_gvt.py's variants still find what they take out of kernels/weight_only/gvt.py (a pattern that no
longer matches stops the script with a message naming it): each variant's source differs from the kernel's and is
valid Python; an unknown part is named in the error."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

ablate = pytest.importorskip("ablate_gvt")


@pytest.mark.parametrize("part", [p for p in ablate.PARTS if p != "base"])
def test_each_part_changes_the_kernel(part):
    base = ablate.variant_source([])
    src = ablate.variant_source([part])
    assert src != base
    compile(src, f"gvt_{part}.py", "exec")


def test_unknown_part_is_named():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "ablate_gvt.py"), "--variants", "nocodes+nothing"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode != 0 and "'nothing'" in run.stderr and "nocodes" in run.stderr

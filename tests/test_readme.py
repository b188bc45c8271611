"""The README stays true: its set-up commands are the ones CI runs, it fits a screenful or three (at most 150 lines),
and its first example runs (on a machine without CUDA: on the CPU through the interpreter, at small sizes)."""
import re
from pathlib import Path

import torch

from tests.conftest import ON_GPU

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_is_a_landing_page():
    assert len(README.splitlines()) <= 150


def test_readme_commands_are_cis():
    install, tests = blocks("bash")[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() == "python -m pytest -q -n auto" and "python3 -m pytest -q -n auto" in ci
    assert install.startswith("pip install torch==2.13.0 triton==3.6.0") and "qkernels bench" in install
    assert 'pip install -q torch==2.13.0 triton==3.6.0 "numpy<2.3"' in ci


def test_readme_first_example_runs():
    code = blocks("python")[0]
    if not ON_GPU:
        code = code.replace('"cuda"', '"cpu"').replace("4096", "128").replace("11008", "96")
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    x, lin = ns["x"], ns["lin"]
    assert ns["qt"].data.dtype == torch.int8 and ns["y"].shape == (x.shape[0], lin.out_features)
    ref = torch.nn.functional.linear(x.float(), lin.weight.float())
    # 4-bit groups of 128 on nn.Linear's uniform init: about 15 levels over each group's range, ~7-12% of the output
    assert float((ns["y"].float() - ref).norm() / ref.norm()) < 0.15

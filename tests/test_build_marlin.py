"""scripts/build_marlin.sh (Marlin built from its public source as a benchmark peer, on a GPU machine): without its
source, or without a GPU, it says what it expected and exits 2 before building anything."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(src, site):
    env = dict(os.environ, MARLIN_SRC=str(src), MARLIN_SITE=str(site), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["bash", str(ROOT / "scripts" / "build_marlin.sh")], capture_output=True, text=True,
                          env=env, timeout=300)


def test_build_marlin_names_a_missing_source(tmp_path):
    run = _run(tmp_path / "none", tmp_path / "site")
    assert run.returncode == 2 and "expected Marlin's source (setup.py, marlin/) in" in run.stderr, run.stderr


def test_build_marlin_needs_a_gpu(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "setup.py").write_text("raise SystemExit('not to be built here')\n")
    run = _run(tmp_path / "src", tmp_path / "site")
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr, run.stderr
    assert not (tmp_path / "site").exists()

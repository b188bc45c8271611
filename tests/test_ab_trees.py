"""scripts/ab_trees.py (source trees compared in the decode chain) runs: on a CPU small shapes under the
interpreter, one line per case with a positive time for each tree and round; a tree without the package is
named in the error."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_trees.py"), *args], capture_output=True,
                          text=True, env=env, timeout=900)


def test_ab_trees_times_each_tree_and_round():
    run = _run("--tree", "here", "--tree", str(ROOT / "src"), "--schemes", "w4a16", "--ms", "1", "2",
               "--shapes", "128x256", "--rounds", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("w4a16 M=")]
    assert [l.split()[1] for l in lines] == ["M=1", "M=2"], run.stdout
    for line in lines:
        cells = line.split("best / [0]:")[0].split()[3:]
        times = [float(v) for v in cells if not v.startswith("[")]
        assert len(times) == 4 and all(t > 0 for t in times), line


def test_ab_trees_names_a_bad_tree(tmp_path):
    run = _run("--tree", "here", "--tree", str(tmp_path))
    assert run.returncode != 0 and f"--tree '{tmp_path}'" in run.stderr and "qkernels/__init__.py" in run.stderr

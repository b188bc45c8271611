"""scripts/ab_trees.py (source trees compared in the decode chain) runs: on a CPU small shapes under the
interpreter, one line per case with a positive time for each tree and round; a tree without the package is
named in the error."""
from .helpers import ROOT, run_script


def _run(*args):
    return run_script("ab_trees.py", *args)


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


def test_ab_trees_times_the_decode_step():
    """--step: the runtime's decode step per tree, scheme and batch (on a CPU the tiny model, eagerly)."""
    run = _run("--tree", "here", "--tree", str(ROOT / "src"), "--step", "llama3-8b", "--schemes", "fp16",
               "--batches", "1", "--rounds", "1")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("llama3-8b fp16 batch 1 step")]
    assert len(lines) == 1, run.stdout
    times = [float(v) for v in lines[0].split("best / [0]:")[0].split("step")[1].split() if not v.startswith("[")]
    assert len(times) == 2 and all(t > 0 for t in times), lines[0]


def test_ab_trees_step_schemes_only_with_step():
    run = _run("--tree", "here", "--tree", "here", "--schemes", "fp16")
    assert run.returncode != 0 and "fp16 and w4a16+head are for --step" in run.stderr

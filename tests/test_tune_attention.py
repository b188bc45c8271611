"""scripts/tune_attention.py (decode attention's configs timed in the runtime's decode step) runs: on a CPU the tiny
model under the interpreter, a line per (batch, candidate) with a positive time and a pick per batch; --write
refused there."""
from .helpers import run_script


def _run(*args):
    return run_script("tune_attention.py", *args)


def test_tune_attention_times_each_candidate():
    run = _run("--batches", "1", "3")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [l for l in run.stdout.splitlines() if l.startswith("batch ")]
    assert [l.split()[1] for l in rows] == ["1", "1", "3", "3"], run.stdout
    assert all(float(l.split()[-1]) > 0 for l in rows), run.stdout
    picks = [l for l in run.stdout.splitlines() if l.startswith("==> batch")]
    assert [l.split()[3] for l in picks] == ["(bucket", "(bucket"] and "bucket 4)" in picks[1], run.stdout


def test_tune_attention_write_needs_a_gpu():
    run = _run("--write")
    assert run.returncode != 0 and "--write needs a GPU" in run.stderr

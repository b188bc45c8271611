"""scripts/table_ab.py (config tables compared in the runtime's decode step) runs: on a CPU a tiny model under the
interpreter, one line per (scheme, batch) with a positive step time per table, each table in its own process."""
import json

from .helpers import run_script


def _run(*args):
    return run_script("table_ab.py", *args)


def test_table_ab_times_each_table(tmp_path):
    (tmp_path / "h100.json").write_text(json.dumps({"w4a16": {}}))
    run = _run("--table", "shipped", "--table", str(tmp_path), "--schemes", "w4a16", "--batches", "1", "2")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("w4a16, ")]
    assert [l.split()[1] for l in lines] == ["1", "2"], run.stdout
    for line in lines:
        times = [float(t) for t in line.split()[2:]]
        assert len(times) == 2 and all(t > 0 for t in times), line


def test_table_ab_names_a_bad_table():
    run = _run("--table", "/no/such/dir")
    assert run.returncode != 0 and "--table '/no/such/dir'" in run.stderr and "<gpu slug>.json" in run.stderr

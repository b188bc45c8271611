"""scripts/table_ab.py (config tables compared in the runtime's decode step) runs: on a CPU a tiny model under the
interpreter, one line per (scheme, batch) with a positive step time per table, each table in its own process."""
import importlib.util
import json
from pathlib import Path

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


def _module():
    spec = importlib.util.spec_from_file_location("table_ab", Path(__file__).resolve().parents[1] / "scripts" /
                                                  "table_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_changes_lists_each_entry_a_sweep_changed_and_applies_them_one_by_one():
    ab = _module()
    cfg = {"path": "wg", "BLOCK_M": 16}
    old = {"h200.json": {"w4a16": {"16": cfg, "16:N4096:K2048": cfg, "64:N2048:K6144": cfg}, "int8": {"1": cfg}},
           "h100.json": {"w4a16": {"16": cfg}}}
    new = {"h200.json": {"w4a16": {"16": cfg, "16:N4096:K2048": dict(cfg, SPLIT_K=4), "16:N12288:K2048": cfg},
                         "int8": {"1": cfg}},
           "h100.json": {"w4a16": {"16": cfg}}, "a100.json": {"w4a16": {}}}
    got = ab.changes(old, new)
    assert got == [("h200.json", "w4a16", "16:N4096:K2048", dict(cfg, SPLIT_K=4)),
                   ("h200.json", "w4a16", "16:N12288:K2048", cfg),
                   ("h200.json", "w4a16", "64:N2048:K6144", None)]
    one = ab.applied(old, got[:1])
    assert one["h200.json"]["w4a16"]["16:N4096:K2048"] == dict(cfg, SPLIT_K=4)
    assert old["h200.json"]["w4a16"]["16:N4096:K2048"] == cfg          # OLD itself untouched
    assert ab.applied(old, got)["h200.json"] == new["h200.json"]


def test_each_times_old_and_every_changed_entry(tmp_path):
    old, new, keep = tmp_path / "old", tmp_path / "new", tmp_path / "keep"
    old.mkdir()
    new.mkdir()
    cfg = {"path": "wg", "BLOCK_M": 16, "BLOCK_N": 64, "GROUP_M": 8, "STAGES": 4, "num_warps": 4}
    (old / "h200.json").write_text(json.dumps({"w4a16": {"16": cfg}}))
    (new / "h200.json").write_text(json.dumps({"w4a16": {"16": cfg, "16:N64:K128": dict(cfg, SPLIT_K=2)}}))
    run = _run("--table", str(old), "--table", str(new), "--each", "--keep", str(keep), "--batches", "1")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert any(l.startswith("OLD ") for l in lines) and any(l.startswith("w4a16 16:N64:K128") for l in lines), lines
    assert "of 1 entries win at every batch" in run.stdout
    kept = json.loads((keep / "h200.json").read_text())
    assert kept in (json.loads((old / "h200.json").read_text()), json.loads((new / "h200.json").read_text()))


def test_each_and_keep_are_checked():
    run = _run("--table", "shipped", "--each")
    assert run.returncode != 0 and "--each compares two tables" in run.stderr
    run = _run("--table", "shipped", "--table", "shipped", "--keep", "/tmp/x")
    assert run.returncode != 0 and "--keep goes with --each" in run.stderr

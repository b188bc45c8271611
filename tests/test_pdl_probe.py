"""scripts/pdl_probe.py (the runtime's decode step with one projection's weight-only launches taken off PDL per
table): its tables hold exactly the configs the shipped table gives those shapes, with "PDL": false, and nothing
else changed; on a CPU it runs table_ab's interpreter check over them."""
import importlib.util
import json
from pathlib import Path

from qkernels import configs

from .helpers import run_script

ROOT = Path(__file__).resolve().parents[1]


def _probe():
    spec = importlib.util.spec_from_file_location("pdl_probe", ROOT / "scripts" / "pdl_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pdl_off_table_overrides_only_the_named_shapes():
    probe = _probe()
    shapes = probe.projection_shapes("qwen3-1.7b")
    assert shapes == {"q|k|v": (4096, 2048), "o": (2048, 2048), "gate|up": (12288, 2048), "down": (2048, 6144)}
    table = configs.load("h100")
    before = json.dumps(table, sort_keys=True)
    out = probe.pdl_off_table(table, ["w4a16", "w8a16"], [8, 32], [shapes["down"]])
    assert json.dumps(table, sort_keys=True) == before                   # the shipped table is not touched
    for kind in ("w4a16", "w8a16"):
        for m in (8, 32):
            got = configs.lookup(out[kind], m, 2048, 6144)
            assert got == dict(configs.lookup(table[kind], m, 2048, 6144), PDL=False)
            assert configs.lookup(out[kind], m, 4096, 2048) == configs.lookup(table[kind], m, 4096, 2048)
        added = set(out[kind]) - set(table[kind])
        assert added <= {f"{configs.bucket_key(table[kind], m)}:N2048:K6144" for m in (8, 32)}
    assert {k: v for k, v in out.items() if k not in ("w4a16", "w8a16")} == \
        {k: v for k, v in table.items() if k not in ("w4a16", "w8a16")}


def test_pdl_probe_runs_table_ab(tmp_path):
    run = run_script("pdl_probe.py", "--projections", "down", "--batches", "2", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "down" / "h100.json").exists() and not (tmp_path / "all").exists()
    line = next(l for l in run.stdout.splitlines() if l.startswith("w4a16, 2"))
    times = [float(t) for t in line.split()[2:]]
    assert len(times) == 2 and all(t > 0 for t in times), run.stdout


def test_pdl_probe_names_a_bad_model():
    run = run_script("pdl_probe.py", "--model", "gpt2")
    assert run.returncode != 0 and "--model: expected one of" in run.stderr

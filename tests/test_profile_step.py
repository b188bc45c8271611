"""scripts/profile_step.py (the runtime's decode step per kernel, per scheme and batch) runs: on a CPU the bench's tiny
model under the interpreter, one line and one JSON entry per (scheme, batch) with a positive step time."""
import json

from .helpers import run_script


def test_profile_step_times_each_scheme_and_batch(tmp_path):
    out = tmp_path / "steps.json"
    run = run_script("profile_step.py", "--batch", "1", "2", "--schemes", "fp16,w4a16", "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    heads = [l for l in run.stdout.splitlines() if l.startswith("== ")]
    assert len(heads) == 4, run.stdout
    doc = json.loads(out.read_text())
    assert sorted(k.split(" ", 1)[1] for k in doc) == ["b=1 fp16", "b=1 w4a16", "b=2 fp16", "b=2 w4a16"]
    assert all(v["step_us"] > 0 for v in doc.values())


def test_profile_step_times_prefill(tmp_path):
    """--prefill T: a T-token prompt's forward per scheme instead of the decode step (named by --model; on a CPU the
    bench's tiny model runs)."""
    out = tmp_path / "prefill.json"
    run = run_script("profile_step.py", "--prefill", "12", "--schemes", "fp16,w4a16", "--no-graphs",
                     "--json", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert [l.split(":")[0] for l in run.stdout.splitlines() if l.startswith("== ")] == [
        "== qwen3-1.7b prefill 12 tokens fp16", "== qwen3-1.7b prefill 12 tokens w4a16"], run.stdout
    doc = json.loads(out.read_text())
    assert sorted(doc) == ["qwen3-1.7b prefill 12 fp16", "qwen3-1.7b prefill 12 w4a16"] and all(v["us"] > 0 for v in doc.values())

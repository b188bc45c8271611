"""`qkernels bench weight-only` at the CPU size: a run of part of the M grid (`ms`) replaces those rows of the
GPU's earlier file and keeps the others, each stamped with its run, and RESULTS.md names the run the kept rows come
from. Timing is not asserted."""
import json

import pytest

from qkernels.bench import report
from qkernels.bench import weight_only as bw
from tests.conftest import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is scripts/gpu_weight_only.sh's job, not a test's")
def test_bench_weight_only_part_of_the_grid_merges(tmp_path):
    root = tmp_path / "results"
    first = bw.run(str(root))
    assert {r.sizes["M"] for r in first} == set(bw.MS_CPU)
    path = next(root.rglob("weight_only.json"))
    before = dict(json.loads(path.read_text()), date="2026-01-01T00:00:00+00:00")    # an earlier run's file
    path.write_text(json.dumps(before))
    part = bw.run(str(root), ms=[str(bw.MS_CPU[-1])])
    assert {r.sizes["M"] for r in part} == {bw.MS_CPU[-1]}
    doc = json.loads(path.read_text())
    kept = [r for r in doc["rows"] if r["M"] != bw.MS_CPU[-1]]
    again = [r for r in doc["rows"] if r["M"] == bw.MS_CPU[-1]]
    assert len(kept) == sum(r["M"] != bw.MS_CPU[-1] for r in before["rows"]) and len(again) == len(part)
    assert {r["date"] for r in kept} == {before["date"]} and {r["date"] for r in again} == {doc["date"]}
    assert f"Rows of M = {bw.MS_CPU[0]}: from the run of 2026-01-01 00:00 UTC" in report.build(root)
    with pytest.raises(ValueError, match="ms must be among"):
        bw.run(str(root), ms=["3"])

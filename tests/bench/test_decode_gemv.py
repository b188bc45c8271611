"""`qkernels bench decode-gemv` end to end at the CPU size: every provider on every shape and M, the JSON
layout and the derived columns. Timing is not asserted."""
import json

import pytest

from qkernels.bench import decode_gemv as bd
from qkernels.bench import report
from tests.conftest import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_bench_decode_gemv_writes_rows(tmp_path):
    rows = bd.run(str(tmp_path))
    provs = {r.provider for r in rows}
    assert provs == {"fp16 F.linear"} | {f"qkernels {s}" for s in bd.SCHEMES}
    assert {r.sizes["M"] for r in rows} == set(bd.MS_CPU)
    for r in rows:
        assert r.median_us > 0 and r.extra["weight_bytes"] > 0 and r.extra["copies"] >= 2
        assert r.extra["share_of_fp16_bw"] > 0
    doc = json.loads(next(tmp_path.rglob("decode_gemv.json")).read_text())
    assert {"gpu", "torch", "triton", "date", "rows", "peers_missing", "method"} <= set(doc)
    text = report.build(tmp_path)
    assert "## decode_gemv" in text and "| llama3-8b | tiny | 64x128 | 1 |" in text


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_bench_decode_gemv_part_merges_into_earlier_results(tmp_path):
    """--shapes: this run's layers replace theirs in the GPU's decode_gemv.json; other layers keep their rows and
    the date of the run that measured them. A shape not in the grid is an error naming the argument."""
    bd.run(str(tmp_path))
    path = next(tmp_path.rglob("decode_gemv.json"))
    doc = json.loads(path.read_text())
    old = dict(doc["rows"][0], shape="4096x4096", N=4096, K=4096)
    doc["rows"].append(old)
    doc["date"] = "2026-01-01T00:00:00+00:00"
    path.write_text(json.dumps(doc))
    rows = bd.run(str(tmp_path), shapes=["64x128"])
    new = json.loads(path.read_text())
    assert len(new["rows"]) == len(rows) + 1 and new["date"] != doc["date"]
    kept = [r for r in new["rows"] if r["shape"] == "4096x4096"]
    assert len(kept) == 1 and kept[0]["date"] == "2026-01-01T00:00:00+00:00"
    assert all(r["date"] == new["date"] for r in new["rows"] if r["shape"] == "64x128")
    with pytest.raises(ValueError, match=r"shapes must name NxK .* got \['1x1'\]"):
        bd.run(str(tmp_path), shapes=["1x1"])
    with pytest.raises(ValueError, match=r"models must be among .* got \['nope'\]"):
        bd.run(str(tmp_path), models=["nope"])


def _earlier_run(tmp_path, peer: str | None = None):
    """A CPU run's decode_gemv.json, dated as an earlier run (with a row of `peer` beside ours): (its path, the
    document)."""
    bd.run(str(tmp_path))
    path = next(tmp_path.rglob("decode_gemv.json"))
    doc = json.loads(path.read_text())
    doc["date"] = "2026-01-01T00:00:00+00:00"
    doc["rows"] = [dict(r, date=doc["date"]) for r in doc["rows"]]
    if peer:
        doc["rows"].append(dict(doc["rows"][0], provider=peer))
    path.write_text(json.dumps(doc))
    return path, doc


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_bench_decode_gemv_ms_merge_by_layer_and_m(tmp_path):
    """--ms: this run's (layer, M) rows replace theirs; the same layer's rows at other M keep theirs and their date.
    A batch size below 1 is an error naming the argument."""
    path, doc = _earlier_run(tmp_path)
    rows = bd.run(str(tmp_path), ms=["2"])
    assert {r.sizes["M"] for r in rows} == {2}
    new = json.loads(path.read_text())
    assert {r["M"] for r in new["rows"]} == set(bd.MS_CPU) | {2}
    assert all(r["date"] == doc["date"] for r in new["rows"] if r["M"] != 2)
    assert all(r["date"] == new["date"] != doc["date"] for r in new["rows"] if r["M"] == 2)
    with pytest.raises(ValueError, match=r"ms must be positive batch sizes, got \[0\]"):
        bd.run(str(tmp_path), ms=["0"])


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_bench_decode_gemv_providers_merge_beside_the_others(tmp_path):
    """--providers: only the named providers (and fp16, which every ratio is to) run; their rows replace theirs, the
    other providers' rows stay with their date."""
    path, doc = _earlier_run(tmp_path)
    rows = bd.run(str(tmp_path), providers=["w4a8"])
    assert {r.provider for r in rows} == {"fp16 F.linear", "qkernels w4a8-fp8"}
    new = json.loads(path.read_text())
    assert len(new["rows"]) == len(doc["rows"])
    for r in new["rows"]:
        assert (r["date"] == new["date"]) == (r["provider"] in ("fp16 F.linear", "qkernels w4a8-fp8")), r


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_bench_decode_gemv_keeps_a_peer_this_run_did_not_time(tmp_path):
    """A part of the grid run again (--shapes): a peer not installed for this run (its row at a layer and M measured
    again) keeps its row and date; the providers this run timed replace theirs."""
    path, doc = _earlier_run(tmp_path, peer="gemlite w4a16 g128")
    rows = bd.run(str(tmp_path), shapes=["64x128"])
    new = json.loads(path.read_text())
    peer = [r for r in new["rows"] if r["provider"] == "gemlite w4a16 g128"]
    assert len(peer) == 1 and peer[0]["date"] == doc["date"]
    ours = [r for r in new["rows"] if r["provider"] != "gemlite w4a16 g128"]
    assert len(ours) == len(rows) and all(r["date"] == new["date"] != doc["date"] for r in ours)


@pytest.mark.skipif(not ON_GPU, reason="a profile of CUDA kernels: GPU only")
def test_chain_timeline_sees_every_kernel_of_the_chain():
    """chain_timeline: one profiled replay of a chain of fp16 linears sees one kernel per call, each with a duration
    and a period; a gap is finite (negative where kernels overlap)."""
    import math

    import torch
    w = [torch.randn(256, 512, device="cuda", dtype=torch.float16) for _ in range(6)]
    x = torch.randn(1, 512, device="cuda", dtype=torch.float16)
    tl = bd.chain_timeline([lambda c=c: torch.nn.functional.linear(x, c) for c in w])
    assert tl["kernels_per_call"] >= 1 and tl["kernel_us"] > 0 and tl["period_us"] > 0, tl
    assert math.isfinite(tl["gap_us"]), tl

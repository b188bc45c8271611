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
    assert {r.sizes["M"] for r in rows} == set(bd.MS)
    for r in rows:
        assert r.median_us > 0 and r.extra["weight_bytes"] > 0 and r.extra["copies"] >= 2
        assert r.extra["share_of_fp16_bw"] > 0
    doc = json.loads(next(tmp_path.rglob("decode_gemv.json")).read_text())
    assert {"gpu", "torch", "triton", "date", "rows", "peers_missing", "method"} <= set(doc)
    text = report.build(tmp_path)
    assert "## decode_gemv" in text and "| llama3-8b | tiny | 64x128 | 1 |" in text

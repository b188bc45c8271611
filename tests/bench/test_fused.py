"""`qkernels bench fused` end to end at the CPU sizes: rows, JSON layout, peers in the same run.
Timing is not asserted."""
import json

import pytest

from qkernels.bench import fused as bf
from tests.conftest import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is scripts/gpu_check.sh's job, not a test's")
def test_bench_fused_writes_rows(tmp_path):
    rows = bf.run(str(tmp_path))
    ops = {r.op for r in rows}
    assert ops == {"rms_norm", "add_rms_norm", "layer_norm", "rms_norm_quant_int8", "softmax", "silu_and_mul",
                   "silu_and_mul_quant_int8"}
    for op in ops:
        provs = {r.provider for r in rows if r.op == op}
        assert {"torch", "torch.compile", "qkernels"} <= provs, (op, provs)
    files = list(tmp_path.rglob("fused.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert {"gpu", "torch", "triton", "date", "rows", "copy_bw_gbps"} <= set(doc)
    r0 = doc["rows"][0]
    assert {"op", "provider", "M", "N", "median_us", "pct_copy_bw"} <= set(r0) and r0["median_us"] > 0

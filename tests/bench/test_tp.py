"""`qkernels bench runtime --tp 2` under torchrun: a tiny model over gloo on the CPU (the GPU run, at real sizes, is
scripts/gpu_tp.sh): the rows it writes, and a run of named models merging into the file."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")


def _bench(out, *extra):
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "qkernels.cli",
                          "bench", "runtime", "--tp", "2", "--out", str(out), "--schemes", "fp16", *extra],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    (path,) = out.glob("*/tp.json")
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="on GPUs the benchmark runs real sizes: scripts/gpu_tp.sh")
def test_bench_tp_rows_and_merge(tmp_path):
    """One run of the named model into a file that holds another model's row and profile and a stale row of its
    own: the run's decode and prefill rows at TP = 1 and 2, the stale row replaced, the other model's kept."""
    from qkernels.bench.harness import results_doc, write_json
    earlier = results_doc([], {"profiles": {"other-model fp16 tp=1": [{"kernel": "k", "us_per_step": 1.0,
                                                                      "calls_per_step": 1}]}})
    earlier["rows"] = [dict(model=m, tp=1, op="decode", batch=1, provider="qkernels runtime", scheme="fp16",
                            median_us=1.0) for m in ("other-model", "tiny-llama")]
    write_json("tp", earlier, tmp_path)
    doc = json.loads(_bench(tmp_path, "--models", "tiny-llama").read_text())
    dec = {(r["model"], r["tp"], r["batch"]): r for r in doc["rows"] if r["op"] == "decode"}
    # batches 1 and 16 on a GPU
    assert set(dec) == {("tiny-llama", tp, b) for tp in (1, 2) for b in (1, 2)} | {("other-model", 1, 1)}
    for b in (1, 2):
        two = dec[("tiny-llama", 2, b)]
        assert two["allreduce"] == "gloo" and two["speedup_vs_tp1"] > 0 and two["tokens_per_s"] > 0
    pre = {r["tp"]: r for r in doc["rows"] if r["op"] == "prefill"}
    assert set(pre) == {1, 2} and pre[2]["ttft_vs_tp1"] > 0 and pre[1]["prompt"] == 16
    assert dec[("other-model", 1, 1)]["median_us"] == 1.0
    assert [r["median_us"] for r in doc["rows"] if r["model"] == "tiny-llama"].count(1.0) == 0
    assert len(doc["rows"]) == len(dec) + len(pre)
    assert "other-model fp16 tp=1" in doc["profiles"]

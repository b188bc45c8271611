"""The autotuning fallback for GPUs without a shipped config table: picks the fastest candidate, caches it in
memory and on disk, never tunes where timing is impossible; and (gpu) the real ops on an 'unknown' GPU."""
import json
import logging

import pytest
import torch

from qkernels import autotune, configs

from .conftest import DEVICE


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("QKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_CACHES", {})
    return tmp_path


def _fake(times):
    """run(cfg) records the launches; bench(fn) runs fn once and returns the candidate's time."""
    runs = []
    current = {}

    def run(cfg):
        runs.append(cfg["id"])
        current["id"] = cfg["id"]
        if times[cfg["id"]] is None:
            raise RuntimeError("out of shared memory")

    def bench(fn):
        fn()
        return times[current["id"]]
    return runs, run, bench


def test_picks_fastest_and_caches(cache_dir):
    cands = [{"id": 0}, {"id": 1}, {"id": 2}]
    runs, run, bench = _fake({0: 3.0, 1: 1.0, 2: 2.0})
    assert autotune.tuned("gpu-x", "int8:M16:N64:K64", cands, run, bench) == {"id": 1}
    assert sorted(set(runs)) == [0, 1, 2]
    n = len(runs)
    assert autotune.tuned("gpu-x", "int8:M16:N64:K64", cands, run, bench) == {"id": 1}
    assert len(runs) == n                                   # in-memory hit: nothing launched
    saved = json.loads((cache_dir / "autotune-gpu-x.json").read_text())
    assert saved == {"int8:M16:N64:K64": {"id": 1}}
    autotune._CACHES.clear()                                # a new process: the disk cache answers
    assert autotune.tuned("gpu-x", "int8:M16:N64:K64", cands, run, bench) == {"id": 1}
    assert len(runs) == n
    # another key is tuned on its own
    runs2, run2, bench2 = _fake({0: 1.0, 1: 5.0, 2: 2.0})
    assert autotune.tuned("gpu-x", "int8:M16:N64:K4096", cands, run2, bench2) == {"id": 0}


def test_failing_candidates_are_skipped(cache_dir):
    cands = [{"id": 0}, {"id": 1}, {"id": 2}]
    runs, run, bench = _fake({0: None, 1: 4.0, 2: None})
    assert autotune.tuned("gpu-x", "k", cands, run, bench) == {"id": 1}
    runs, run, bench = _fake({0: None, 1: None, 2: None})
    assert autotune.tuned("gpu-x", "k2", cands, run, bench) == {"id": 0}   # all fail: the default, uncached
    assert "k2" not in autotune._cache("gpu-x")


def test_no_tuning_when_disabled(cache_dir, monkeypatch):
    monkeypatch.setenv("QKERNELS_AUTOTUNE", "0")
    runs, run, bench = _fake({0: 3.0, 1: 1.0})
    assert autotune.tuned("gpu-x", "k", [{"id": 0}, {"id": 1}], run, bench) == {"id": 0}
    assert runs == [] and not (cache_dir / "autotune-gpu-x.json").exists()


def test_no_tuning_while_compiling(cache_dir, monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    runs, run, bench = _fake({0: 3.0, 1: 1.0})
    assert autotune.tuned("gpu-x", "k", [{"id": 0}, {"id": 1}], run, bench) == {"id": 0}
    assert runs == []


def test_corrupt_cache_is_ignored(cache_dir, caplog):
    (cache_dir / "autotune-gpu-x.json").write_text("{not json")
    runs, run, bench = _fake({0: 3.0, 1: 1.0})
    with caplog.at_level(logging.WARNING, logger="qkernels"):
        assert autotune.tuned("gpu-x", "k", [{"id": 0}, {"id": 1}], run, bench) == {"id": 1}
    assert "ignoring autotune cache" in caplog.text
    assert json.loads((cache_dir / "autotune-gpu-x.json").read_text()) == {"k": {"id": 1}}


def test_candidates_default_first_then_shipped_tables():
    assert "h100" in configs.shipped()
    for kind, default in [("int8", configs.DEFAULT_GEMM), ("w4a16", configs.DEFAULT_WEIGHT_ONLY)]:
        for bucket in (1, 16, 128, 4096):
            c = configs.candidates(kind, bucket, default)
            assert c[0] == configs.pick(default, bucket)
            assert configs.pick(configs.load("h100")[kind], bucket) in c
            assert len({json.dumps(x, sort_keys=True) for x in c}) == len(c)


@pytest.mark.gpu
def test_ops_autotune_on_a_gpu_without_table(cache_dir, monkeypatch):
    """Pretend this GPU has no table: int8_matmul and w4a16_linear tune on first use, give the reference
    results, write the cache, and the next process reads it without timing anything."""
    import qkernels as qk
    from qkernels import reference as ref
    from qkernels.ops import gemm as G
    from qkernels.ops import weight_only as WO
    for mod in (G, WO, WO.dispatch):     # the table lookup (dispatch) and the autotune cache's name (WO)
        monkeypatch.setattr(mod, "gpu_slug", lambda name: "no-such-gpu")     # no configs/no-such-gpu.json
    G._gemm_config_bucket.cache_clear()
    WO.dispatch._config_bucket.cache_clear()
    try:
        a = torch.randint(-128, 128, (40, 512), dtype=torch.int8, device=DEVICE)
        b = torch.randint(-128, 128, (384, 512), dtype=torch.int8, device=DEVICE)
        assert torch.equal(qk.int8_matmul(a, b.t()), ref.int_mm(a, b.t()))
        w = torch.randn(384, 512, device=DEVICE, dtype=torch.float16)
        pw = qk.PackedWeight.from_float(w, 4, 128)
        x = torch.randn(3, 512, device=DEVICE, dtype=torch.float16)
        y = qk.w4a16_linear(x, pw)
        want = x.float() @ pw.dequantize().float().t()
        assert (y.float() - want).abs().max() <= 1e-2 * want.abs().max()
        keys = set(json.loads((cache_dir / "autotune-no-such-gpu.json").read_text()))
        assert {"int8:M64:N384:K512", "w4a16:M4:N384:K512:g128"} <= keys, keys
        autotune._CACHES.clear()
        monkeypatch.setattr(autotune, "_bench_ms", lambda fn: pytest.fail("tuned again despite the cache"))
        assert torch.equal(qk.int8_matmul(a, b.t()), ref.int_mm(a, b.t()))
        assert torch.equal(qk.w4a16_linear(x, pw), y)
    finally:
        G._gemm_config_bucket.cache_clear()
        WO.dispatch._config_bucket.cache_clear()


def _hammer(cache: str, who: int, n: int, go) -> None:
    import os
    os.environ["QKERNELS_CACHE_DIR"] = cache
    go.wait()
    mine = {}
    for j in range(n):              # as tuned() does: the in-memory cache grows, each result saved at once
        mine[f"p{who}:k{j}"] = {"id": j}
        autotune._save("gpu-x", mine)


def test_two_processes_hammering_the_cache_lose_nothing(cache_dir):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    procs = [ctx.Process(target=_hammer, args=(str(cache_dir), who, 150, go)) for who in range(2)]
    for p in procs:
        p.start()
    go.set()                        # both write at once
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    saved = json.loads((cache_dir / "autotune-gpu-x.json").read_text())
    assert saved == {f"p{w}:k{j}": {"id": j} for w in range(2) for j in range(150)}
    assert not list(cache_dir.glob("*.partial"))

"""Config tables as data: bucket choice, shape overrides, and the shipped tables' sanity."""
import json

import pytest

from qkernels import configs
from qkernels.ops import attention as A

TABLE = {"16": {"id": "a"}, "128": {"id": "b"}, "4096": {"id": "c"}, "128:N14336:K4096": {"id": "b-wide"}}


@pytest.mark.parametrize("M, key", [(0, "16"), (1, "16"), (16, "16"), (17, "128"), (128, "128"), (129, "4096"),
                                    (4096, "4096"), (100000, "4096")])
def test_bucket_key_ignores_override_keys(M, key):
    assert configs.bucket_key(TABLE, M) == key
    assert configs.pick(TABLE, M) is TABLE[key]


def test_lookup_prefers_the_shape_override():
    assert configs.lookup(TABLE, 100, 14336, 4096) == {"id": "b-wide"}
    assert configs.lookup(TABLE, 100, 4096, 4096) == {"id": "b"}
    assert configs.lookup(TABLE, 16, 14336, 4096) == {"id": "a"}      # override is for bucket 128 only


@pytest.mark.parametrize("slug", configs.shipped())
def test_shipped_tables_are_well_formed(slug):
    table = configs.load(slug)
    assert {"int8", "fp8", "w4a16", "w8a16"} <= set(table)
    for kind, tab in table.items():
        buckets = [k for k in tab if k.isdigit()]
        assert buckets, kind
        if kind == "decode_attention":                 # per batch bucket, no shape overrides
            for key, cfg in tab.items():
                assert key.isdigit() and set(cfg) == set(A.ATTENTION_KEYS), (key, cfg)
                with A.use_config(cfg):                # the launcher's own check
                    pass
            continue
        for key, cfg in tab.items():
            if not key.isdigit():                      # override: "<bucket>:N<N>:K<K>" of an existing bucket
                b, n, k = key.split(":")
                assert b in buckets and n[0] == "N" and k[0] == "K" and n[1:].isdigit() and k[1:].isdigit(), key
            if kind in ("w8a8", "w8a8-fp8"):        # W8A8, dynamic activations: the GEMV quantizing x, or two kernels
                assert cfg["path"] in ("gemv", "quantize"), cfg
                if cfg["path"] == "quantize":
                    continue
                assert key.split(":")[0] == "1", key      # decode sizes only
            elif kind == "w4a8-fp8":       # the W4A8 layer's entries (ops/w4a8.py); W4A16: its layers run W4A16's kernels
                assert cfg["path"] == "wg", cfg
            elif kind.startswith("w"):
                assert cfg["path"] in ("gemv", "gv", "gvt", "tc", "mm", "wg", "dequant"), cfg
            if cfg.get("path") == "tc":      # the Gluon kernel: BLOCK_N = 16 x warps x a power of two
                assert kind == "w4a16" and cfg["BLOCK_M"] in (8, 16), cfg
                assert cfg["BLOCK_N"] % (16 * cfg["num_warps"]) == 0, cfg
            if cfg.get("path") == "wg" and kind == "int8":      # the Gluon int8 GEMM (kernels/_gemm_wg.py)
                assert cfg["num_warps"] in (4, 8) and cfg["STAGES"] >= 2 and cfg["BLOCK_K"] % 32 == 0, cfg
                assert cfg["BLOCK_M"] % (16 * cfg["num_warps"]) == 0 and cfg["BLOCK_N"] in (16, 32, 64, 128), cfg
                assert "path" not in cfg["fallback"], cfg
            elif cfg.get("path") == "wg" and kind == "w4a8-fp8":     # the Gluon FP8 wgmma kernel
                if cfg["path"] == "wg":      # 64 weight rows a warpgroup
                    assert cfg["BLOCK_N"] == 64 * (cfg["num_warps"] // 4) and cfg["num_warps"] in (4, 8), cfg
                else:                        # 64 tokens a warpgroup
                    assert cfg["num_warps"] == 4 * cfg["BLOCK_M"] // 64 and cfg["BLOCK_N"] % 32 == 0, cfg
                assert cfg["BLOCK_M"] in (8, 16, 32, 64, 128, 256) and cfg["STAGES"] >= 2, cfg
                assert cfg.get("SPLIT_K", 1) == 1 or "MIN_PROGRAMS" in cfg, cfg
                assert not cfg.get("WS") or "maxnreg" in cfg, cfg      # uncapped WS takes every register
                assert cfg.get("CPG", 1) in (1, 2) and cfg["STAGES"] >= 2 * cfg.get("CPG", 1), cfg   # ring: 2 units
                assert set(cfg) <= {"path", "BLOCK_M", "BLOCK_N", "GROUP_M", "STAGES", "num_warps", "SPLIT_K",
                                    "MIN_PROGRAMS", "WS", "maxnreg", "PDL", "W4A16", "CPG"}, cfg
                continue                     # its Triton fallback is the op's DEFAULT_CONFIGS, added at lookup
            elif cfg.get("path") == "wg":    # the Gluon wgmma kernel: warpgroups split BLOCK_N, BLOCK_M its n
                assert kind in ("w4a16", "w8a16") and cfg["num_warps"] in (4, 8) and cfg["STAGES"] >= 2, cfg
                assert cfg["BLOCK_N"] % (16 * cfg["num_warps"]) == 0, cfg
                assert cfg["BLOCK_M"] in (8, 16, 32, 64, 128, 256), cfg
                assert cfg.get("SPLIT_K", 1) == 1 or cfg["MIN_PROGRAMS"] > 0, cfg
                assert cfg.get("KC", 1) in (1, 2, 4, 8), cfg      # 64-k chunks per ring stage
            if cfg.get("path") == "gv":      # the Gluon GEMV: a step spans 4 WPT chunks of 64 per warp
                assert kind == "w4a16" and cfg["WPT"] in (1, 2, 4, 8), cfg
                assert cfg["BLOCK_K"] % (256 * cfg["WPT"] * cfg["num_warps"]) == 0, cfg
            if cfg.get("path") == "gvt":     # the Gluon tensor-core GEMV: 4- or 8-bit, up to 16 x rows per program
                assert kind in ("w4a16", "w8a16") and cfg["WPT"] in (4, 8, 16), cfg
                assert cfg["TILES"] % cfg["num_warps"] == 0, cfg
                assert cfg.get("STAGES", 1) >= 1 and not (cfg.get("STAGES", 1) > 1 and cfg.get("PAIRS")), cfg
                assert int(key.split(":")[0]) <= 16, key
            if cfg.get("path") in ("tc", "wg", "gv", "gvt"):     # Gluon: a fallback for what it does not run
                assert cfg["fallback"].get("path") not in ("tc", "wg", "gv", "gvt"), cfg
                cfg = cfg["fallback"]
            if cfg.get("path") == "cublas":          # torch._scaled_mm: fp8 only, a tile config for what it does not take
                assert kind == "fp8" and "path" not in cfg["fallback"], cfg
                cfg = cfg["fallback"]
            assert cfg["num_warps"] in (1, 2, 4, 8, 16) and cfg["BLOCK_K"] % 16 == 0, (kind, key, cfg)


def test_set_shape_overrides_rule(capsys):
    shapes = [(4096, 4096), (14336, 4096)]
    a, b = {"id": "a"}, {"id": "b"}
    tab = {"128": a, "128:N4096:K4096": b}                      # a stale override
    results = [([10.0, 50.0], a), ([10.5, 40.0], b)]             # b: 20% faster on the wide shape only
    configs.set_shape_overrides(tab, "int8", 128, shapes, results, a)
    assert tab == {"128": a, "128:N14336:K4096": b}
    results = [([10.0, 50.0], a), ([9.6, 48.0], b)]              # within the noise everywhere: no overrides
    configs.set_shape_overrides(tab, "int8", 128, shapes, results, a)
    assert tab == {"128": a}
    configs.set_shape_overrides(tab, "int8", 128, shapes, results, a, configs.CHAIN_OVERRIDE_GAIN)   # 4% in chains
    assert tab == {"128": a, "128:N4096:K4096": b, "128:N14336:K4096": b}
    tab = {"128": a}
    runs = {("int8", "128"): [([10.0, 50.0], a), ([10.5, 40.0], b)], ("int8", "16"): [([1.0, 2.0], b)]}
    table = {"int8": {"128": a, "16": a}}                        # bucket 16's config was not in that log
    configs.overrides_from_runs(table, runs, shapes, "log")
    assert table["int8"] == {"128": a, "16": a, "128:N14336:K4096": b}
    g = {"path": "wg", "id": "g"}                                # a Gluon bucket config: the table adds a fallback
    table = {"w4a16": {"128": dict(g, fallback=a)}}
    configs.overrides_from_runs(table, {("w4a16", "128"): [([10.0, 50.0], g), ([10.5, 40.0], b)]}, shapes, "log")
    assert table["w4a16"] == {"128": dict(g, fallback=a), "128:N14336:K4096": b}
    table = {"int8": {"1": a}}                                   # a --chain sweep's log: its gain
    runs = {("int8", "1"): [([10.0, 50.0], a), ([9.6, 48.0], b)]}
    configs.overrides_from_runs(table, runs, shapes, "log")
    assert table["int8"] == {"1": a}
    configs.overrides_from_runs(table, runs, shapes, "log", configs.CHAIN_OVERRIDE_GAIN)
    assert table["int8"] == {"1": a, "1:N4096:K4096": b, "1:N14336:K4096": b}
    assert "not in log" in capsys.readouterr().out


def test_config_dir_takes_the_place_of_the_shipped_table(tmp_path, monkeypatch):
    """$QKERNELS_CONFIG_DIR/<slug>.json is the table used where it exists; the shipped one (or none) elsewhere."""
    mine = {"w4a16": {"1": {"path": "gemv", "BLOCK_N": 4, "BLOCK_K": 256, "num_warps": 4}}}
    (tmp_path / "h100.json").write_text(json.dumps(mine))
    monkeypatch.setenv("QKERNELS_CONFIG_DIR", str(tmp_path))
    configs.load.cache_clear()
    try:
        assert configs.table_path("h100") == tmp_path / "h100.json" and configs.load("h100") == mine
        assert configs.table_path("h200") == configs._DIR / "h200.json"      # no file of its own: the shipped one
        assert configs.load("h200") and configs.load("h200") != mine
        assert configs.load("nosuchgpu") == {}
    finally:
        monkeypatch.delenv("QKERNELS_CONFIG_DIR")
        configs.load.cache_clear()
    assert configs.load("h100") != mine

"""scripts/tune_weight_only.py without a GPU: the decode shapes its --chain sweeps time for --models, the shape
overrides it replays from a sweep's log (--from-log) for those models, and the overrides alone of a --shapes sweep."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tune():
    spec = importlib.util.spec_from_file_location("tune_weight_only", ROOT / "scripts" / "tune_weight_only.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_chain_shapes_of_models(tune):
    llama = [(1024, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336)]
    assert tune.CHAIN_SHAPES == tune.chain_shapes(["llama3-8b"]) == llama
    both = tune.chain_shapes(["llama3-8b", "qwen3-1.7b"])
    assert both[:6] == llama and len(both) == 12 and (2048, 6144) in both and (151936, 2048) not in both
    assert tune.chain_shapes(["llama3-8b", "llama3-8b"]) == llama
    with pytest.raises(ValueError, match=r"models: expected names of .*llama3-8b.*got 'gpt2'"):
        tune.chain_shapes(["gpt2"])


def _line(cfg: dict, times: list) -> str:
    return f"w8a16 M=    1 {cfg} {['%.2f' % t for t in times]}"


def test_from_log_of_a_two_model_chain_sweep(tune, tmp_path):
    shapes = tune.chain_shapes(["llama3-8b", "qwen3-1.7b"])
    a = dict(path="gemv", BLOCK_N=4, BLOCK_K=4096, num_warps=8, num_stages=1)
    b = dict(path="gemv", BLOCK_N=2, BLOCK_K=2048, num_warps=2, num_stages=1)
    ta = [10.0] * len(shapes)
    tb = [10.1] * 6 + [5.0] * 6                  # b: level on Llama's shapes, twice as fast on Qwen3's
    log = tmp_path / "sweep.log"
    log.write_text("\n".join([_line(a, ta), _line(b, tb)]) + "\n")
    table = {"w8a16": {"1": dict(a), "1:N4096:K4096": dict(b)}}
    tune.from_log(log, table, [8], shapes)
    tab = table["w8a16"]
    assert tab["1"] == a
    assert all(tab[f"1:N{n}:K{k}"] == b for n, k in shapes[6:])          # Qwen3's shapes take b
    assert not any(f"1:N{n}:K{k}" in tab for n, k in shapes[:6])        # level on Llama's: stale overrides dropped
    # the same log read as a one-model sweep names the mismatch instead of pairing times with the wrong shapes
    with pytest.raises(ValueError, match=r"times 12 shapes, expected 3 \(a plain sweep\) or 6"):
        tune.from_log(log, {"w8a16": {"1": dict(a)}}, [8])


def test_shapes_sweep_writes_overrides_only(tune):
    """--shapes: overrides against the bucket's config, which stays; a Gluon override takes the bucket's fallback; a
    shape where nothing is clearly faster keeps the bucket's config (its stale override dropped)."""
    fb = dict(path="mm", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_N=8, num_warps=4, num_stages=4)
    a = dict(path="wg", BLOCK_M=256, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8)
    b = dict(path="wg", BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=4, num_warps=4)
    tab = {"1024": dict(a, fallback=fb), "1024:N1024:K1024": dict(b, fallback=fb)}
    shapes = [(3072, 1024), (1024, 1024)]
    results = [([10.0, 10.0], a), ([6.0, 9.9], b), ([8.0, 12.0], fb)]
    assert tune.overrides_only(tab, "w4a16", 1024, shapes, results, lambda r: sum(r[0]))
    assert tab["1024"] == dict(a, fallback=fb)                           # the bucket's config stays
    assert tab["1024:N3072:K1024"] == dict(b, fallback=fb)               # 6.0 < 0.95 x 10.0
    assert "1024:N1024:K1024" not in tab                                # 9.9: not clearly faster, dropped
    assert not tune.overrides_only(tab, "w4a16", 1024, shapes, [([1.0, 1.0], b)], lambda r: 0)   # bucket untimed


def test_rank_shapes_of_a_tensor_parallel_runtime(tune):
    """--tp: the runtime's merged q|k|v and gate|up split along N over the ranks, o and down along K; the separate
    projections a Hugging Face model runs (k, v; gate, up) and lm_head are not a rank's."""
    assert tune.rank_shapes(["llama3-8b"], 2) == [(4096, 2048), (3072, 4096), (14336, 4096), (4096, 7168)]
    assert tune.rank_shapes(["llama3-8b", "qwen3-1.7b"], 2)[4:] == [(2048, 1024), (2048, 2048), (6144, 2048),
                                                                  (2048, 3072)]
    with pytest.raises(ValueError, match=r"llama3-8b's o \(4096x4096\) does not split 5 ways along K"):
        tune.rank_shapes(["llama3-8b"], 5)
    # Llama-3-70B, named for tensor parallelism only (bench tp's config: hidden 8192, 64 / 8 heads, 28672)
    assert tune.rank_shapes(["llama3-70b"], 2) == [(5120, 8192), (28672, 8192), (8192, 4096), (8192, 14336)]
    with pytest.raises(ValueError, match=r"models: expected names of .* got 'llama3-405b'"):
        tune.rank_shapes(["llama3-405b"], 2)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "2"], "--tp: expected a rank count > 1 with --chain .* without --chain"),
    (["--chain", "--tp", "2", "--shapes", "4096x4096", "--buckets", "1"], "with --shapes"),
    (["--chain", "--tp", "0", "--buckets", "1"], "got --tp 0"),
    (["--chain", "--tp", "3", "--buckets", "1"], r"does not split 3 ways"),
])
def test_tp_arguments_are_checked_before_any_timing(tune, monkeypatch, capsys, argv, message):
    monkeypatch.setattr("sys.argv", ["tune_weight_only.py"] + argv)
    with pytest.raises(SystemExit):
        tune.main()
    assert re.search(message, capsys.readouterr().err)


def test_chained_overrides_take_the_chain_gain(tune):
    """--tp / --shapes with --chain: a decode chain's timings repeat within ~0.3%, so a shape gets its own config at
    the chain gain (2%), not the one-call graphs' 5%."""
    a = dict(path="gv", BLOCK_N=4, num_warps=4)
    b = dict(path="gvt", TILES=1, WPT=8, num_warps=1)
    tab = {"1": dict(a)}
    results = [([10.0], a), ([9.7], b)]
    assert tune.overrides_only(tab, "w4a16", 1, [(3072, 4096)], results, lambda r: sum(r[0]),
                               tune.configs.CHAIN_OVERRIDE_GAIN)
    assert tab["1:N3072:K4096"] == b and tab["1"] == a
    tab = {"1": dict(a)}
    tune.overrides_only(tab, "w4a16", 1, [(3072, 4096)], results, lambda r: sum(r[0]))
    assert "1:N3072:K4096" not in tab                                    # 9.7 is not 5% faster


def test_every_candidate_makes_a_launch_plan(tune):
    """Each candidate of the decode buckets (M = 1 to 256; gv's persistent grid among them) is a config
    the launcher takes: a plan for Llama-3-8B's 4096x4096 at 132 SMs, no error naming a key it cannot take."""
    from qkernels.ops import weight_only as WO
    seen = set()
    for m in (1, 2, 16, 32, 64, 128, 256):
        for c in tune.candidates(m):
            WO.launch._plan(c, m, 4096, 4096, 4, 128, False, True, False, 132)
            seen.add((c["path"], "PERSISTENT" in c))
    assert ("wg", False) in seen and ("gv", True) in seen

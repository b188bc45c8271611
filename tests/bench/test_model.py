"""Model benchmark pieces (src/qkernels/bench/model.py) on a tiny config; timing is not asserted."""
import pytest
import torch

from qkernels.bench import model as bm
from qkernels.nn import QuantizedLinear
from tests.conftest import DEVICE, ON_GPU

pytest.importorskip("transformers")


def test_build_random_model_with_rotary_buffers():
    cfg = bm.model_configs(tiny=True)["tiny-llama"]
    m = bm.build(cfg, "fp16", DEVICE)
    ref = __import__("transformers").AutoModelForCausalLM.from_config(cfg)
    ours = dict(m.named_buffers())
    for name, buf in ref.named_buffers():
        assert torch.equal(ours[name].cpu(), buf), name       # inv_freq rebuilt, not left uninitialised
    assert all(p.dtype == torch.float16 and torch.isfinite(p).all() for p in m.parameters())
    q = bm.build(cfg, "w4a16", DEVICE)
    assert sum(isinstance(x, QuantizedLinear) for x in q.modules()) == 8     # q|k|v and gate|up fused: 4 per layer
    assert bm.nbytes(q) < bm.nbytes(m) * 0.6


def test_decode_step_runs_and_skip_reasons():
    cfg = bm.model_configs(tiny=True)["tiny-llama"]
    m = bm.build(cfg, "bf16", DEVICE)
    assert bm.decode_step_ms(m, 2, 8, DEVICE, graph=False) > 0
    assert bm.prefill_ms(m, 1, 8, DEVICE, 1) > 0
    assert "8.9" in bm.skip_reason("w8a8-fp8", {"fp8": False})
    assert bm.skip_reason("w8a8", {"fp8": False}) is None


def test_decode_step_rewinds_the_cache_every_step():
    """The timed step writes slot ctx on every call (the cache's per-layer token counts set back before each, in one
    launch): many more calls than the cache's spare slots give the same logits every time, no overflow."""
    cfg = bm.model_configs(tiny=True)["tiny-llama"]
    m = bm.build(cfg, "fp16", DEVICE)
    step = bm.decode_step(m, 1, 8, DEVICE, graph=False)
    first = step().clone()
    for _ in range(12):                 # the cache holds ctx + 8 positions
        assert torch.equal(step(), first)


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is `qkernels bench model`'s job, not a test's")
def test_vision_language_model_runs_when_named(tmp_path):
    """--models qwen3-vl-2b (here its tiny twin): the conditional-generation model is built with its buffers,
    quantized (text and vision linears), and timed on text prompts through its language model."""
    import json
    cfgs = bm.vl_configs(tiny=True)
    if not cfgs:
        pytest.skip("this transformers has no Qwen3-VL")
    rows = bm.run(tmp_path, models=["tiny-qwen3-vl"], schemes=("fp16", "w4a16"))
    got = {(r.op, r.provider) for r in rows}
    assert {("prefill", "fp16"), ("decode", "fp16"), ("prefill", "w4a16"), ("decode", "w4a16")} <= got
    doc = json.loads(next(tmp_path.rglob("model.json")).read_text())
    assert {r["model"] for r in doc["rows"]} == {"tiny-qwen3-vl"} and doc["rows"][0]["layers"] == 2
    q = bm.build(cfgs["tiny-qwen3-vl"], "w4a16", DEVICE)
    assert any(isinstance(m, QuantizedLinear) for n, m in q.named_modules() if ".visual." in f".{n}.")


def test_unknown_model_names_are_refused(tmp_path):
    """A model name the benchmark does not know is an error naming the ones it does (not an empty run)."""
    with pytest.raises(ValueError, match="models must be among .*got \\['no-such-model'\\]"):
        bm.run(tmp_path, models=["no-such-model"], schemes=("fp16",))
    assert not list(tmp_path.rglob("model.json"))

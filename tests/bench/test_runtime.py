"""bench.runtime: a run naming some models merges their rows into the GPU's earlier runtime results; a
vision-language model's image rows; a failing profile does not cost the run its rows."""
import pytest

from qkernels.bench import report
from qkernels.bench.runtime import merge_by_model
from tests.conftest import ON_GPU


def _doc(date, gpu, rows, profiles=None):
    return dict(gpu=gpu, torch="2.x", triton="3.y", date=date, rows=rows, profiles=profiles or {})


def _row(model, scheme, tps):
    return dict(op="decode", provider="qkernels runtime", mode="graph", model=model, scheme=scheme, batch=1, ctx=128,
                tokens_per_s=tps, bw_share=0.5, capture_s=1.0, median_us=1e6 / tps)


def test_merge_replaces_the_named_models_and_stamps_every_row():
    old = _doc("2026-01-01T00:00", "GPU X", [_row("a", "fp16", 100.0), _row("b", "fp16", 50.0)],
               {"a fp16": [1], "b fp16": [2]})
    new = _doc("2026-01-05T00:00", "GPU X", [_row("a", "fp16", 110.0)], {"a fp16": [3]})
    got = merge_by_model(old, new, ["a"])
    assert got["date"] == "2026-01-05T00:00" and got["gpu"] == "GPU X"
    by_model = {r["model"]: r for r in got["rows"]}
    assert len(got["rows"]) == 2 and by_model["a"]["tokens_per_s"] == 110.0 and by_model["b"]["tokens_per_s"] == 50.0
    assert by_model["a"]["date"] == "2026-01-05T00:00" and by_model["b"]["date"] == "2026-01-01T00:00"
    assert all(r["torch"] == "2.x" and r["triton"] == "3.y" for r in got["rows"])
    assert got["profiles"] == {"b fp16": [2], "a fp16": [3]}
    # rows stamped by an earlier merge keep their own run; a document of another GPU is not merged
    again = merge_by_model(got, _doc("2026-01-09T00:00", "GPU X", [_row("a", "w4a16", 300.0)]), ["a"])
    assert {r["model"]: r["date"] for r in again["rows"]} == {"b": "2026-01-01T00:00", "a": "2026-01-09T00:00"}
    # a run of some schemes replaces theirs only: the model's fp16 row from the earlier run stays
    assert sorted((r["model"], r["scheme"], r["date"]) for r in again["rows"]) == [
        ("a", "fp16", "2026-01-05T00:00"), ("a", "w4a16", "2026-01-09T00:00"), ("b", "fp16", "2026-01-01T00:00")]
    other = merge_by_model(old, _doc("2026-01-05T00:00", "GPU Y", [_row("a", "fp16", 1.0)]), ["a"])
    assert [r["model"] for r in other["rows"]] == ["a"]
    assert merge_by_model(None, new, ["a"])["rows"][0]["date"] == "2026-01-05T00:00"


def test_report_names_the_run_of_kept_models(tmp_path):
    import json
    old = _doc("2026-01-01T00:00", "GPU X", [_row("b", "fp16", 50.0)])
    new = _doc("2026-01-05T00:00", "GPU X", [_row("a", "fp16", 110.0)])
    d = tmp_path / "results" / "h100"
    d.mkdir(parents=True)
    (d / "runtime.json").write_text(json.dumps(merge_by_model(old, new, ["a"])))
    text = report.build(tmp_path / "results")
    kept = text.split("#### b:")[1].split("####")[0]
    fresh = text.split("#### a:")[1].split("####")[0]
    assert "From the run of 2026-01-01 (torch 2.x, Triton 3.y)." in kept
    assert "From the run of" not in fresh


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_image_rows_of_a_vision_language_model(tmp_path):
    """bench runtime --models tiny-qwen3-vl: per scheme an image row (vision time, TTFT with the image, decode after
    it) and transformers' eager fp16 TTFT beside it; RESULTS.md shows them and judges the image targets."""
    from qkernels.bench import runtime as br
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3VLConfig"):
        pytest.skip("transformers without Qwen3-VL")
    rows = br.run(str(tmp_path), models=["tiny-qwen3-vl"], schemes=("fp16", "w4a16"))
    img = [r for r in rows if r.op == "image"]
    assert {(r.provider, r.sizes["scheme"]) for r in img} == {("qkernels runtime", "fp16"),
                                                              ("qkernels runtime", "w4a16"), ("HF eager", "fp16")}
    ours = [r for r in img if r.provider == "qkernels runtime"]
    assert all(r.extra["vision_ms"] > 0 and r.extra["ttft_ms"] > 0 and r.extra["tokens_per_s"] > 0 for r in ours)
    assert all(r.extra["vision_eager_ms"] > 0 and r.extra["ttft_eager_ms"] > 0 for r in ours)
    pre = [r for r in rows if r.op == "prefill" and r.sizes["batch"] == 1]     # the text prompt's TTFT, both ways
    assert pre and all(r.extra["ttft_ms"] > 0 and r.extra["ttft_eager_ms"] > 0 for r in pre)
    text = report.build(tmp_path)
    assert "#### tiny-qwen3-vl: one 32x32 image in a 11-token prompt" in text
    assert "- image: W4A16 TTFT ≤ 0.8x transformers' eager fp16:" in text
    assert "- image: W4A16 decode ≥ 1.8x the fp16 runtime at batch 1:" in text


def test_a_failing_profile_is_reported_and_left_out(capsys):
    """A profile is evidence beside the rows: one whose step raises (a compiled path at its recompile limit) is
    reported and left out, the others kept, and the run goes on to write its rows."""
    from qkernels.bench import runtime

    def boom():
        raise RuntimeError("recompile limit")

    profiles = {}
    runtime.profile_into(profiles, "m w4a16 (HF)", boom)
    assert profiles == {} and "profile of m w4a16 (HF) failed, left out: RuntimeError: recompile limit" in \
        capsys.readouterr().out


def test_critical_us_counts_what_each_kernel_adds_to_the_end():
    """critical_us: a kernel started early (PDL) that waits for the one before adds only what it runs past that
    one's end; one that ends inside another adds nothing; idle time between kernels is nobody's; the values add up
    to the busy time."""
    from qkernels.bench.runtime import critical_us
    spans = [("gemv", 0.0, 10.0), ("attn", 2.0, 14.0), ("norm", 3.0, 12.0),    # attn waits on gemv: adds 4
             ("gemv", 20.0, 25.0)]                                             # after 6 idle: its own 5
    got = critical_us(spans)
    assert got == {"gemv": 15.0, "attn": 4.0, "norm": 0.0}
    assert sum(got.values()) == 10.0 + 4.0 + 5.0


def test_a_peer_this_machine_lacks_is_a_clear_error_for_the_hf_path():
    """The Hugging Face path's gemlite scheme on a machine without gemlite (or without an FP8 GPU): a RuntimeError
    naming what is missing, which bench runtime reports as a skipped scheme."""
    import importlib.util

    import torch

    from qkernels.bench.runtime import _hf_converted
    if importlib.util.find_spec("gemlite") is not None:
        pytest.skip("gemlite is installed here: the GPU run measures it")
    hf = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False))
    hf.get_output_embeddings = lambda: None
    with pytest.raises(RuntimeError, match="gemlite-w4a8-fp8 needs gemlite's A8W4_HQQ_INT_dynamic"):
        _hf_converted(hf, "gemlite-w4a8-fp8")


def test_the_gemlite_scheme_swaps_every_linear_but_the_head(monkeypatch):
    """gemlite-w4a8-fp8 on the Hugging Face path: each linear but lm_head becomes the layer gemlite builds from it
    (peers' builder, here a stand-in), the fp16 model's dtype kept (tinygemm's scheme alone turns it bf16)."""
    import torch

    from qkernels.bench import peers as bp
    from qkernels.bench.runtime import _hf_converted

    built = []

    def fake_peers(lin, dev, kinds=None):
        assert kinds == ["w4a8 fp8"]

        def make(lin=lin):
            built.append(lin.weight.shape)
            return torch.nn.Identity()
        return {"gemlite w4a8 fp8 g128": (make, 0)}, []
    monkeypatch.setattr(bp, "peers", fake_peers)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 8, bias=False))
            self.head = torch.nn.Linear(8, 32, bias=False)

        def get_output_embeddings(self):
            return self.head

    m = _hf_converted(Tiny().half(), "gemlite-w4a8-fp8")
    assert [type(x) for x in m.body] == [torch.nn.Identity, torch.nn.Identity]
    assert isinstance(m.head, torch.nn.Linear) and m.head.weight.dtype == torch.float16
    assert built == [torch.Size([16, 8]), torch.Size([8, 16])]


@pytest.mark.skipif(ON_GPU, reason="the full-size GPU run is the GPU script's job, not a test's")
def test_a_run_cut_short_keeps_the_models_it_finished(tmp_path, monkeypatch):
    """runtime.json is written as each model ends: a run stopped inside a later model (a time limit, an error)
    keeps the rows of the models before it, merged into the file as it was."""
    import json

    from qkernels import models as qm
    from qkernels.bench import runtime as br
    from qkernels.bench.harness import results_dir, results_doc

    real = qm.from_pretrained

    def second_fails(hf, *a, **k):
        if hf.config.model_type != "llama":
            raise RuntimeError("stopped")
        return real(hf, *a, **k)

    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3VLConfig"):
        pytest.skip("transformers without Qwen3-VL (the second model)")
    monkeypatch.setattr(qm, "from_pretrained", second_fails)
    d = results_dir(tmp_path)
    d.mkdir(parents=True)
    gpu = results_doc([], {})["gpu"]        # this machine's name: the earlier file is of the same machine
    (d / "runtime.json").write_text(json.dumps(_doc("2026-01-01T00:00", gpu, [_row("other", "fp16", 5.0)])))
    with pytest.raises(RuntimeError, match="stopped"):
        br.run(str(tmp_path), models=["tiny-llama", "tiny-qwen3-vl"], schemes=("fp16",), hf_schemes=())
    kept = json.loads((d / "runtime.json").read_text())
    assert {r["model"] for r in kept["rows"]} == {"tiny-llama", "other"}
    assert {r["op"] for r in kept["rows"] if r["model"] == "tiny-llama"} == {"prefill", "decode", "memory"}

"""SmoothQuant-style smoothing (src/qkernels/nn/smooth.py)."""
import pytest
import torch

from qkernels.nn import QuantizedLinear
from qkernels.nn.convert import quantize_
from qkernels.nn.smooth import smooth_
from tests.conftest import DEVICE
from tests.helpers import rel_err

transformers = pytest.importorskip("transformers")


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    m = transformers.LlamaForCausalLM(cfg).to(DEVICE, torch.float32).eval()
    with torch.no_grad():   # outlier channels in the residual stream, as real LLMs have
        m.model.embed_tokens.weight[:, [3, 17]] *= 40
    return m


def test_smoothing_keeps_the_function_and_flattens_activations():
    m = _llama()
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    seen = {}
    h = m.model.layers[0].self_attn.q_proj.register_forward_hook(lambda mod, i, o: seen.__setitem__("x", i[0]))
    with torch.no_grad():
        want = m(ids).logits
    x0 = seen["x"]
    n = smooth_(m, ids, alpha=0.5)
    assert n == 2 * (3 + 2 + 1)
    with torch.no_grad():
        got = m(ids).logits
    h.remove()
    x1 = seen["x"]
    assert rel_err(got, want) < 1e-5                      # same function in fp32
    ratio = lambda x: (x.abs().amax((0, 1)).max() / x.abs().amax((0, 1)).median()).item()
    assert ratio(x1) < ratio(x0) / 3                      # per-channel ranges flattened


def test_quantize_with_calibration_is_closer():
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    errs = []
    for calib in (None, ids):
        m = _llama()
        with torch.no_grad():
            want = m(ids).logits
        m.half()
        quantize_(m, "w8a8", calibration=calib, progress=False)
        assert sum(isinstance(x, QuantizedLinear) for x in m.modules()) == 8    # 2 layers x (q|k|v o gate|up down)
        with torch.no_grad():
            errs.append(rel_err(m(ids).logits, want))
    assert errs[1] < errs[0]


def test_w4a8_quantize_with_calibration_smooths_first():
    """w4a8-fp8 quantizes its activations, so calibration smooths the model (as for w8a8) before the 4-bit
    rounding; the layers are w4a8-fp8 either way."""
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    norms = []
    for calib in (None, ids):
        m = _llama().half()
        quantize_(m, "w4a8-fp8-g64", calibration=calib, progress=False, fuse=False)
        qs = [x for x in m.modules() if isinstance(x, QuantizedLinear)]
        assert len(qs) == 14 and all(q.scheme.name == "w4a8-fp8" for q in qs)    # 2 layers x 7 projections
        norms.append(m.model.layers[0].input_layernorm.weight.float().clone())
    assert not torch.equal(norms[0], norms[1])                 # the norm took the smoothing's 1 / s


@pytest.mark.parametrize("scheme, method, smoothed", [("w4a8-fp8-g64", "gptq", True), ("w4a16-g64", "gptq", False),
                                                      ("w4a8-fp8-g64", "awq", False)])
def test_calibrated_methods_smooth_the_schemes_that_quantize_activations(scheme, method, smoothed):
    """GPTQ on w4a8-fp8 runs on the smoothed model (w4a16 keeps its activations in fp16: no smoothing); AWQ's own
    activation-aware scales take the smoothing's place (its norms change by AWQ's scales, not by SmoothQuant's)."""
    ids = torch.randint(0, 128, (2, 16), device=DEVICE)
    m = _llama().half()
    ref = _llama().half()
    ref.load_state_dict(m.state_dict())
    if method == "awq":      # what AWQ alone does to the first norm: the same as w4a16's AWQ
        quantize_(ref, "w4a16-g64", calibration=ids, method="awq", progress=False, fuse=False)
    quantize_(m, scheme, calibration=ids, method=method, progress=False, fuse=False)
    got, want = (x.model.layers[0].input_layernorm.weight for x in (m, ref))
    assert torch.equal(got, want) != smoothed


def test_bad_arguments():
    m = _llama()
    with pytest.raises(ValueError, match="alpha must be in"):
        smooth_(m, torch.zeros(1, 4, dtype=torch.long), alpha=1.5)
    with pytest.raises(ValueError, match="calibration feeds SmoothQuant \\(the schemes that quantize activations"):
        quantize_(m.half(), "w4a16", calibration=torch.zeros(1, 4, dtype=torch.long))
    assert smooth_(torch.nn.Linear(4, 4), torch.zeros(1, 4)) == 0   # nothing to smooth

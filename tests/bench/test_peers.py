"""bench/peers.py: which peers a run gets (gemlite's classes stood in for by fakes, bitsandbytes absent), the kinds
filter the weight-only and gemm benches ask with, and the missing ones named."""
import sys
import types

import torch

from qkernels.bench import peers as P


class _Fake:
    def __init__(self, device):
        self.device = device

    def from_linear(self, lin):
        return ("layer", type(self).__name__, tuple(lin.weight.shape))

    def from_weights(self, codes, scales, zeros):
        return ("layer", type(self).__name__, tuple(codes.shape), tuple(scales.shape), tuple(zeros.shape))


def test_peers_named_filtered_and_missing(monkeypatch):
    helper = types.ModuleType("gemlite.helper")
    for name in ("A16W4_HQQ_INT", "A16W8_INT8", "A8W8_int8_dynamic", "A8W8_fp8_dynamic", "A8W4_HQQ_INT_dynamic"):
        setattr(helper, name, type(name, (_Fake,), {}))
    monkeypatch.setitem(sys.modules, "gemlite", types.ModuleType("gemlite"))
    monkeypatch.setitem(sys.modules, "gemlite.helper", helper)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)          # import fails: reported missing
    monkeypatch.setitem(sys.modules, "marlin", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    lin = torch.nn.Linear(256, 64, bias=False, dtype=torch.float16)
    found, missing = P.peers(lin, torch.device("cpu"))
    assert list(found) == ["gemlite w4a16 g128", "gemlite w8a16", "gemlite w8a8 int8", "gemlite w8a8 fp8",
                           "gemlite w4a8 fp8 g128"]
    assert missing == ["bitsandbytes: not installed", "marlin: not built (scripts/build_marlin.sh)"]
    make, nbytes = found["gemlite w4a16 g128"]
    assert nbytes == 64 * 256 // 2 + 4 * 64 * 2                    # codes + fp16 scale and zero per group of 128
    assert make() == ("layer", "A16W4_HQQ_INT", (64, 256), (64, 2), (64, 2))
    assert found["gemlite w8a8 fp8"][0]() == ("layer", "A8W8_fp8_dynamic", (64, 256))
    assert found["gemlite w4a8 fp8 g128"][0]() == ("layer", "A8W4_HQQ_INT_dynamic", (64, 256), (64, 2), (64, 2))
    assert found["gemlite w4a8 fp8 g128"][1] == nbytes
    weight_only, _ = P.peers(lin, torch.device("cpu"), kinds=("w4a16", "w8a16", "nf4"))
    assert list(weight_only) == ["gemlite w4a16 g128", "gemlite w8a16"]
    w8a8, _ = P.peers(lin, torch.device("cpu"), kinds=("w8a8",))
    assert list(w8a8) == ["gemlite w8a8 int8", "gemlite w8a8 fp8"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (8, 0))      # no FP8 tensor cores
    assert not {"gemlite w8a8 fp8", "gemlite w4a8 fp8 g128"} & set(P.peers(lin, torch.device("cpu"))[0])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    monkeypatch.delattr(helper, "A8W4_HQQ_INT_dynamic")                 # an older gemlite: the rest still runs
    found, missing = P.peers(lin, torch.device("cpu"))
    assert "gemlite w8a8 fp8" in found and "gemlite w4a8 fp8 g128" not in found
    assert missing[0] == "gemlite w4a8 fp8: this gemlite has no A8W4_HQQ_INT_dynamic"


def test_marlin_peer_packs_a_symmetric_fake_quantized_weight_once(monkeypatch):
    """Marlin (a stand-in for its Layer): the weight fake-quantized to symmetric groups of 128 (codes -8..7 times the
    group's absmax / 7), packed with scales [N, K / 128] once; further layers are copies."""
    calls = []

    class Layer(torch.nn.Module):
        def __init__(self, k, n, groupsize):
            super().__init__()
            self.args = (k, n, groupsize)

        def pack(self, linear, scales):
            calls.append((linear.weight.detach().clone(), scales.clone()))

    monkeypatch.setitem(sys.modules, "marlin", types.SimpleNamespace(Layer=Layer))
    monkeypatch.setitem(sys.modules, "gemlite", None)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    lin = torch.nn.Linear(256, 64, bias=False, dtype=torch.float16)
    found, missing = P.peers(lin, torch.device("cpu"))
    make, nbytes = found["marlin w4a16 g128 sym"]
    assert nbytes == 64 * 256 // 2 + 2 * 64 * 2                    # codes + an fp16 scale per group of 128
    first, second = make(), make()
    assert first.args == (256, 64, 128) and second is not first and len(calls) == 1
    fq, s = calls[0]
    assert s.shape == (64, 2) and s.dtype == torch.float16 and fq.dtype == torch.float16
    q = fq.float().reshape(64, 2, 128) / s.float()[..., None]      # fp16 weights: codes to within their rounding
    assert (q - q.round()).abs().max() < 1e-2 and q.round().min() >= -8 and q.round().max() <= 7
    w = lin.weight.detach().float().reshape(64, 2, 128)
    assert torch.allclose(s.float(), w.abs().amax(-1) / 7, rtol=1e-3)
    assert ((fq.float().reshape(64, 2, 128) - w).abs() <= s.float()[..., None] / 2 + 1e-3).all()

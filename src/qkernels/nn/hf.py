"""Hugging Face transformers integration: `QKernelsConfig`, registered as the "qkernels" quantization method.

    import qkernels.nn.hf                       # registers the method (qkernels.QKernelsConfig does too)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=QKernelsConfig(scheme="w4a16",
                                                 group_size=128))
    model.save_pretrained(out)                  # codes and scales, config.json with the layer list
    model = AutoModelForCausalLM.from_pretrained(out)    # loads straight into QuantizedLinear modules

From a float checkpoint the weights load as usual and quantize_ then converts every linear but `skip`, one
layer at a time (peak memory: the float model). A directory saved from such a model names its quantized
layers in quantization_config["layers"]; loading it swaps those linears for QuantizedLinear modules before
any weight is read, so the codes load as they are. Fused norm / MLP modules (quantize_'s fuse) are not
used on this path: transformers' own decoder layers stay in place.
"""
from __future__ import annotations

from torch import nn
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..schemes import parse_scheme
from .linear import QuantizedLinear

METHOD = "qkernels"


class QKernelsConfig(QuantizationConfigMixin):
    """scheme: "w4a16" | "w8a16" | "w8a8" | "w8a8-fp8" (or a qkernels.schemes string such as "w4a16-g64-sym");
    group_size / symmetric as for quantize_ (weight-only schemes; stored resolved, defaults filled in); skip:
    linears left in float (names or name suffixes; default lm_head). `layers` is filled when a model is
    quantized: {name: {scheme, in_features, out_features, bias, group_size, symmetric, act_order,
    dtype}}, what a saved directory needs to be rebuilt."""

    def __init__(self, scheme: str = "w4a16", group_size: int | None = None, symmetric: bool | None = None,
                 skip=("lm_head",), layers: dict | None = None, **kwargs):
        parsed = parse_scheme(scheme, group_size=group_size, symmetric=symmetric)   # JSON keeps the plain values
        self.quant_method = METHOD
        self.scheme = parsed.name
        self.group_size = parsed.group_size if parsed.weight_only else None
        self.symmetric = parsed.symmetric if parsed.weight_only else None
        self.skip = list(skip)
        self.layers = layers


def _layer_entries(model: nn.Module) -> dict:
    from .convert import _layer_entry
    return {n: _layer_entry(m) for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}


class QKernelsHfQuantizer(HfQuantizer):
    requires_calibration = False

    def _process_model_before_weight_loading(self, model, **kwargs):
        layers = self.quantization_config.layers
        if not self.pre_quantized or not layers:
            return model
        from .convert import _layer_from_entry, _set_module
        for name, e in layers.items():
            try:
                old = model.get_submodule(name)
            except AttributeError:
                raise ValueError(f"quantization_config names layer {name!r}, which the model does not have") from None
            if not isinstance(old, nn.Linear) or (old.in_features, old.out_features) != (e["in_features"],
                                                                                          e["out_features"]):
                raise ValueError(f"quantization_config's layer {name!r} ({e['out_features']} x {e['in_features']}) "
                                 f"does not match the model's {old}")
            _set_module(model, name, _layer_from_entry(e))
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        cfg = self.quantization_config
        if not self.pre_quantized:
            from .convert import quantize_
            quantize_(model, cfg.scheme, group_size=cfg.group_size, symmetric=cfg.symmetric, skip=tuple(cfg.skip),
                      fuse=False, progress=False)
        else:
            for n, m in model.named_modules():
                if isinstance(m, QuantizedLinear) and m.scheme.weight_only:
                    from ..packed_weight import integer_zeros
                    m.int_zeros = m.symmetric or integer_zeros(m.scale_zero[..., 1], m.bits)
        cfg.layers = _layer_entries(model)
        return model

    def is_serializable(self, safe_serialization=None):
        return True

    @property
    def is_trainable(self) -> bool:
        return False


if METHOD not in __import__("transformers.quantizers.auto", fromlist=["x"]).AUTO_QUANTIZER_MAPPING:
    register_quantization_config(METHOD)(QKernelsConfig)
    register_quantizer(METHOD)(QKernelsHfQuantizer)

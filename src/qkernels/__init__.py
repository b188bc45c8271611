"""qkernels: fast quantized GPU kernels for LLM inference, in Triton.

`import qkernels` is cheap and does no device work: the public names below load their modules on
first use (PEP 562), and kernels compile at their first call. This also lets a program (or the CLI)
choose the Triton interpreter (TRITON_INTERPRET=1) after importing qkernels but before the first op.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "quantize": ".ops.quant", "dequantize": ".ops.quant", "quantize_tensor": ".ops.quant",
    "dequantize_tensor": ".ops.quant", "pack_int4": ".ops.quant", "unpack_int4": ".ops.quant",
    "QuantizedTensor": ".ops.quant",
    "int8_matmul": ".ops.gemm", "fp8_matmul": ".ops.gemm", "int4_matmul": ".ops.gemm", "w8a8_linear": ".ops.gemm",
    "w4a16_linear": ".ops.weight_only", "w8a16_linear": ".ops.weight_only", "w4a8_linear": ".ops.w4a8",
    "PackedWeight": ".packed_weight",
    "rms_norm": ".ops.fused", "layer_norm": ".ops.fused", "silu_and_mul": ".ops.fused", "softmax": ".ops.fused",
    "QuantizedLinear": ".nn", "quantize_": ".nn.convert", "save_quantized": ".nn.convert",
    "load_quantized": ".nn.convert", "load_pretrained": ".nn.checkpoints", "save_gptq": ".nn.checkpoints",
    "save_compressed_tensors": ".nn.checkpoints",
    "QKernelsConfig": ".nn.hf",
    "FORMATS": ".formats", "GRANULARITIES": ".formats",
    "W8A8": ".schemes", "WeightOnly": ".schemes", "PER_CHANNEL": ".schemes", "parse_scheme": ".schemes",
    "poison_outputs": "._runtime",
}
_SUBMODULES = ("reference", "formats", "schemes", "ops", "kernels", "bench", "nn")

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'qkernels' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))

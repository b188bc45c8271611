"""qkernels: fast quantized GPU kernels for LLM inference, in Triton.

Importing does no device work: kernels compile and device facts are read at the first call.
"""
from ._runtime import poison_outputs
from .formats import FORMATS, GRANULARITIES
from .ops.quant import dequantize, dequantize_tensor, pack_int4, quantize, quantize_tensor, unpack_int4
from .quantized_tensor import QuantizedTensor

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "GRANULARITIES", "QuantizedTensor", "dequantize", "dequantize_tensor", "pack_int4",
    "poison_outputs", "quantize", "quantize_tensor", "unpack_int4",
]

from .linear import QuantizedLinear

__all__ = ["QuantizedLinear"]

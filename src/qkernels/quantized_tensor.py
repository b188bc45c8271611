"""QuantizedTensor: quantized codes plus everything needed to turn them back into floats."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QuantizedTensor:
    """Result of `qkernels.quantize`.

    data:        codes. int8 (symmetric int8), uint8 (asymmetric int8), uint8 packed two per byte along
                 the last dim (int4; even index in the low nibble), or torch.float8_e4m3fn / e5m2.
    scale:       float32; shape () for "tensor", (*lead, 1) for "row", (K,) for "column",
                 (*lead, K // group_size) for "group".
    zero_point:  int32 with the scale's shape (asymmetric), else None.
    shape:       logical shape of the original tensor (data's last dim is half of it for int4).
    """

    data: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor | None
    shape: torch.Size
    dtype: str
    granularity: str
    group_size: int | None = None

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        from .ops.quant import dequantize
        return dequantize(self, dtype)

    def __repr__(self) -> str:
        gs = f", group_size={self.group_size}" if self.granularity == "group" else ""
        return (f"QuantizedTensor(shape={tuple(self.shape)}, dtype={self.dtype!r}, granularity={self.granularity!r}"
                f"{gs}, symmetric={self.symmetric}, device={self.data.device})")

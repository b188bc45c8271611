"""Quantized number formats: ranges and storage dtypes (pure data, no device work)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QFormat:
    name: str
    bits: int
    is_float: bool
    q_sym: float            # symmetric dynamic scale = absmax / q_sym
    sym_range: tuple[int, int]    # integer formats: clamp range when symmetric
    asym_range: tuple[int, int] | None   # integer formats: clamp range when asymmetric (unsigned)
    fp_max: float = 0.0     # float formats: largest finite value (saturation bound)
    torch_dtype: torch.dtype | None = None   # storage dtype for float formats

    def qrange(self, symmetric: bool) -> tuple[int, int]:
        if symmetric:
            return self.sym_range
        if self.asym_range is None:
            raise ValueError(f"dtype {self.name!r} supports symmetric quantization only, got symmetric=False")
        return self.asym_range

    def storage_dtype(self, symmetric: bool) -> torch.dtype:
        if self.is_float:
            return self.torch_dtype
        if self.bits == 4:
            return torch.uint8   # packed, two per byte
        return torch.int8 if symmetric else torch.uint8


FORMATS: dict[str, QFormat] = {
    "int8": QFormat("int8", 8, False, 127.0, (-128, 127), (0, 255)),
    "int4": QFormat("int4", 4, False, 7.0, (-8, 7), (0, 15)),
    "fp8_e4m3": QFormat("fp8_e4m3", 8, True, 448.0, (0, 0), None, 448.0, torch.float8_e4m3fn),
    "fp8_e5m2": QFormat("fp8_e5m2", 8, True, 57344.0, (0, 0), None, 57344.0, torch.float8_e5m2),
}

GRANULARITIES = ("tensor", "row", "column", "group")

# Scales are floored at the smallest normal fp32 so that 1/scale stays finite.
SCALE_MIN = 2.0 ** -126


def get_format(dtype: str) -> QFormat:
    if not isinstance(dtype, str) or dtype not in FORMATS:
        raise ValueError(f"dtype must be one of {sorted(FORMATS)}, got {dtype!r}")
    return FORMATS[dtype]

"""QuantizedLinear: an nn.Linear replacement whose forward runs a qkernels quantized GEMM."""
from __future__ import annotations

import torch
from torch import nn

SCHEMES = ("w8a8", "w8a8-fp8")


class QuantizedLinear(nn.Module):
    """y = x @ W.T + b with W stored quantized per output channel.

    Schemes: "w8a8" (int8 weights and per-token dynamic int8 activations), "w8a8-fp8" (float8_e4m3fn
    weights and activations). Buffers: `weight` [N, K] codes, `weight_scale` [N] float32, `bias`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, scheme: str = "w8a8",
                 device=None, dtype: torch.dtype = torch.float16):
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        wdt = torch.int8 if scheme == "w8a8" else torch.float8_e4m3fn
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=wdt, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str = "w8a8") -> "QuantizedLinear":
        from ..ops.quant import quantize
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        dtype = w.dtype if w.dtype in (torch.float16, torch.bfloat16) else torch.float16
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, scheme, w.device, dtype)
        qt = quantize(w, "int8" if scheme == "w8a8" else "fp8_e4m3", "row")
        mod.weight.copy_(qt.data)
        mod.weight_scale.copy_(qt.scale.reshape(-1))
        if linear.bias is not None:
            mod.bias.copy_(linear.bias.detach().to(dtype))
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ..ops.gemm import w8a8_linear
        return w8a8_linear(x, self.weight, self.weight_scale, self.bias,
                           dtype="int8" if self.scheme == "w8a8" else "fp8")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme!r}"

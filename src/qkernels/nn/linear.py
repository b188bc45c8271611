"""QuantizedLinear: an nn.Linear replacement whose forward runs a qkernels quantized GEMM."""
from __future__ import annotations


import torch
from torch import nn

from .. import reference as ref
from .._runtime import runs_kernels
from ..schemes import PER_CHANNEL, W4A8_MIN_M, Scheme, WeightOnly, parse_scheme


class QuantizedLinear(nn.Module):
    """y = x @ W.T + b with W stored quantized.

    scheme: a qkernels.schemes object or the string it parses from (group_size / symmetric beside it).
      W8A8 ("w8a8")                int8 weights per output channel, per-token dynamic int8 activations.
      W8A8(fp8=True) ("w8a8-fp8")  float8_e4m3fn weights and activations.
        Buffers: `weight` [N, K] codes, `weight_scale` [N] float32, `bias`.
      WeightOnly(4) ("w4a16")      4-bit weights, group-wise (PER_CHANNEL = -1: one group per row),
                                   symmetric or with zero points; fp16/bf16 activations.
      WeightOnly(8) ("w8a16")      8-bit weights (default per output channel), fp16/bf16 activations.
      WeightOnly(4, fp8_act=True)  W4A16's weights; a call of W4A8_MIN_M rows or more quantizes its activations
        ("w4a8-fp8")               per token to float8_e4m3fn and multiplies on FP8 tensor cores (ops.w4a8).
        Buffers: `qweight`, `scale_zero` (scales and zero points side by side; `scales` and `zeros`
        are views of it), `perm` (act-order), `bias`, in the PackedWeight layout
        (qkernels.packed_weight). State dicts with separate `scales` / `zeros` entries (before
        qkernels 0.2) still load.

    On a CUDA device (or the CPU under TRITON_INTERPRET=1) forward runs the kernels; on a plain CPU it
    runs their pure-torch twins in qkernels.reference (same numerics; the tests prove they match), so
    a quantized model can be evaluated on a machine without a GPU.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, scheme: str | Scheme = "w8a8",
                 device=None, dtype: torch.dtype = torch.float16, group_size: int | None = None,
                 symmetric: bool | None = None):
        super().__init__()
        scheme = parse_scheme(scheme, group_size=group_size, symmetric=symmetric)
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        if scheme.weight_only:
            from ..packed_weight import _check_group, num_groups, qweight_width
            bits = scheme.bits
            _check_group(scheme.group_size, in_features, bits)
            self.bits, self.group_size, self.symmetric = bits, scheme.group_size, scheme.symmetric
            ng = num_groups(scheme.group_size, in_features)
            self.register_buffer("qweight", torch.zeros(out_features, qweight_width(in_features, bits),
                                                        dtype=torch.uint8, device=device))
            self.int_zeros = True      # the zero points below; from_packed and loads set it from the data
            sz = torch.ones(out_features, ng, 2, dtype=dtype, device=device)
            sz[..., 1] = 2 ** (bits - 1) if scheme.symmetric else 0
            self.register_buffer("scale_zero", sz)
            self.register_buffer("perm", None)
            self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)
            return
        wdt = torch.float8_e4m3fn if scheme.fp8 else torch.int8
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=wdt, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: str | Scheme = "w8a8", group_size: int | None = None,
                    symmetric: bool | None = None) -> "QuantizedLinear":
        """Quantize an nn.Linear. group_size / symmetric apply to the weight-only schemes (defaults in
        qkernels.schemes: w4a16 groups of 128 with zero points, w8a16 per channel and symmetric)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        scheme = parse_scheme(scheme, group_size=group_size, symmetric=symmetric)
        w = linear.weight.detach()
        dtype = w.dtype if w.dtype in (torch.float16, torch.bfloat16) else torch.float16
        if scheme.weight_only:
            from ..packed_weight import PackedWeight
            pw = PackedWeight.from_float(w, scheme.bits, scheme.group_size, scheme.symmetric, scale_dtype=dtype)
            b = linear.bias.detach().to(dtype) if linear.bias is not None else None
            return cls.from_packed(pw, b, scheme.fp8_act)
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, scheme, w.device, dtype)
        if runs_kernels(w):
            from ..ops.quant import quantize
            qt = quantize(w, scheme.format, "row")
            data, scale = qt.data, qt.scale
        else:
            data, scale, _ = ref.quantize(w, scheme.format, "row")
        mod.weight.copy_(data)
        mod.weight_scale.copy_(scale.reshape(-1))
        if linear.bias is not None:
            mod.bias.copy_(linear.bias.detach().to(dtype))
        return mod

    @classmethod
    def from_packed(cls, packed, bias: torch.Tensor | None = None, fp8_act: bool = False) -> "QuantizedLinear":
        """Wrap a PackedWeight (e.g. from PackedWeight.from_gptq / from_awq) as a weight-only layer (fp8_act:
        as a w4a8-fp8 one, the codes and scales as they are)."""
        N, K = packed.shape
        mod = cls(K, N, bias is not None, WeightOnly(packed.bits, packed.group_size, packed.symmetric, fp8_act),
                  packed.device, packed.scales.dtype)
        mod.qweight.copy_(packed.qweight)
        mod.scale_zero.copy_(packed.scale_zero)
        mod.perm = packed.perm
        mod.int_zeros = packed.int_zeros
        if bias is not None:
            mod.bias.copy_(bias)
        return mod

    def to_fp8_act(self) -> str | None:
        """Make this 4-bit weight-only layer a w4a8-fp8 one in place (codes and scales as they are: a GPTQ / AWQ /
        compressed-tensors W4A16 layer run with FP8 activations). Returns why it cannot (the layer then stays as
        it is), or None."""
        s = self.scheme
        if not s.weight_only or s.bits != 4:
            return f"scheme {s.name!r} is not 4-bit weight-only"
        if s.group_size != PER_CHANNEL and s.group_size % 64 or self.in_features % 64:
            return (f"group_size={s.group_size}, in_features={self.in_features}: w4a8-fp8 needs multiples of 64 "
                    f"(or per channel)")
        self.scheme = WeightOnly(4, s.group_size, s.symmetric, fp8_act=True)
        return None

    @classmethod
    def concat(cls, layers: list["QuantizedLinear"], device=None) -> "QuantizedLinear":
        """One layer computing `layers`' outputs side by side (layers sharing their input: q | k | v, gate | up):
        codes, scales (and zero points) and biases concatenated row-wise, which is exactly what quantizing the
        concatenated float weight gives, since every scheme quantizes each output row on its own. The layers must
        agree on scheme, in_features, group size, symmetry, integer zero points, bias or none, and act-order
        permutation: a ValueError says what differs (concat_problem). device: where the new layer's tensors go
        (default: the first layer's)."""
        why = concat_problem(layers)
        if why:
            raise ValueError(f"cannot concatenate these quantized layers: {why}")
        first = layers[0]
        names = ["qweight", "scale_zero"] if first.scheme.weight_only else ["weight", "weight_scale"]
        dev = device if device is not None else getattr(first, names[0]).device
        out = cls(first.in_features, sum(m.out_features for m in layers), first.bias is not None, first.scheme, "meta")
        for n in names + (["bias"] if first.bias is not None else []):
            setattr(out, n, torch.cat([getattr(m, n).detach().to(dev) for m in layers]))
        if first.scheme.weight_only:
            out.perm = first.perm.to(dev) if first.perm is not None else None
            out.int_zeros = first.int_zeros
        return out

    def split(self, sizes: list[int]) -> list["QuantizedLinear"]:
        """The inverse of concat: layers of `sizes` consecutive output rows each (their buffers views of this
        layer's rows)."""
        if sum(sizes) != self.out_features:
            raise ValueError(f"sizes must add up to out_features={self.out_features}, got {sizes}")
        names = ["qweight", "scale_zero"] if self.scheme.weight_only else ["weight", "weight_scale"]
        parts, start = [], 0
        for n in sizes:
            part = type(self)(self.in_features, n, self.bias is not None, self.scheme, "meta")
            for name in names + (["bias"] if self.bias is not None else []):
                setattr(part, name, getattr(self, name)[start:start + n])
            if self.scheme.weight_only:
                part.perm, part.int_zeros = self.perm, self.int_zeros
            parts.append(part)
            start += n
        return parts

    def packed_weight(self):
        """The buffers as a PackedWeight; kept while the buffers are the same tensors (in-place loads keep
        them; .to() / .cuda() replace them), so a forward does not rebuild it."""
        pw = self.__dict__.get("_packed")
        if pw is None or pw.qweight is not self.qweight or pw.scale_zero is not self.scale_zero \
                or pw.perm is not self.perm:
            from ..packed_weight import PackedWeight
            pw = PackedWeight(self.qweight, self.scale_zero, self.bits, self.group_size,
                              (self.out_features, self.in_features), self.perm, self.symmetric, self.int_zeros)
            self.__dict__["_packed"] = pw
        return pw

    @property
    def scales(self) -> torch.Tensor:
        """Weight-only schemes: [N, K / G] view of scale_zero (as PackedWeight.scales)."""
        return self.packed_weight().scales

    @property
    def zeros(self) -> torch.Tensor | None:
        """Weight-only schemes: [N, K / G] view of scale_zero, None when symmetric (as PackedWeight.zeros)."""
        return self.packed_weight().zeros

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # state dicts from before scale_zero: separate `scales` and `zeros`
        if self.scheme.weight_only and prefix + "scales" in state_dict and \
                prefix + "scale_zero" not in state_dict:
            from ..packed_weight import pack_scale_zero
            state_dict[prefix + "scale_zero"] = pack_scale_zero(state_dict.pop(prefix + "scales"),
                                                                state_dict.pop(prefix + "zeros", None), self.bits)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if self.scheme.weight_only:    # the loaded zero points decide (float ones: HQQ); rebuild the view
            from ..packed_weight import integer_zeros
            self.int_zeros = self.symmetric or integer_zeros(self.scale_zero[..., 1], self.bits)
            self.__dict__.pop("_packed", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not runs_kernels(x):
            return self._reference_forward(x)
        gemm, weight_only = _ops()
        if self.scheme.weight_only:
            if self._fp8_rows(x):
                return _w4a8()(x, self.packed_weight(), self.bias)
            return weight_only._weight_only(x, self.packed_weight(), self.bias, self.bits,
                                            f"{self.scheme.name} QuantizedLinear")
        # an eager call replays the launches of the first calls like it (ops/_eager.py; the plans kept on the weight)
        return gemm.w8a8_linear(x, self.weight, self.weight_scale, self.bias, dtype=self.scheme.gemm_dtype)

    def forward_swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """Weight-only schemes, this layer an MLP's merged [gate; up] projection: silu(gate) * up [..., I], the
        bits of forward(x) followed by silu_and_mul (at decode sizes in one kernel: the GEMV's epilogue)."""
        if not self.scheme.weight_only:
            raise TypeError(f"forward_swiglu runs weight-only layers; scheme {self.scheme.name!r} quantizes the "
                            f"SwiGLU output for its next GEMM (ops.fused.silu_and_mul(..., quantize=...))")
        if not runs_kernels(x):
            return ref.silu_and_mul(self._reference_forward(x))[0]
        if self._fp8_rows(x):
            from ..ops.fused import silu_and_mul
            return silu_and_mul(_w4a8()(x, self.packed_weight(), self.bias))
        from ..ops.weight_only import _weight_only
        return _weight_only(x, self.packed_weight(), self.bias, self.bits, f"{self.scheme.name} QuantizedLinear",
                            swiglu=True)

    def forward_quantized(self, q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """w8a8 schemes: forward from activations already quantized per row (codes `q` [..., K] and
        fp32 scales [..., 1], e.g. from a fused norm or silu_and_mul), output in out_dtype."""
        if self.scheme.weight_only:
            raise TypeError(f"forward_quantized takes quantized activations: scheme {self.scheme.name!r} is "
                            f"weight-only")
        dtype = self.scheme.gemm_dtype
        if not runs_kernels(q):
            return ref.w8a8_linear(q, self.weight, self.weight_scale, self.bias, dtype=dtype, x_scale=scale,
                                   out_dtype=out_dtype)
        from ..ops.gemm import w8a8_linear
        return w8a8_linear(q, self.weight, self.weight_scale, self.bias, dtype=dtype, x_scale=scale,
                           out_dtype=out_dtype)

    # codes and fp32 scales keep their dtype when the model is cast (model.half(), .to(bf16)): an
    # e4m3 weight is a float dtype to nn.Module.to, and its scales must stay fp32
    _FIXED_DTYPE = ("weight", "weight_scale", "qweight", "perm")

    def _apply(self, fn, recurse=True):
        before = {k: self._buffers[k].dtype for k in self._FIXED_DTYPE if self._buffers.get(k) is not None}
        kept = {k: self._buffers[k] for k in before}
        super()._apply(fn, recurse)
        for k, dt in before.items():
            t = self._buffers[k]
            if t is not None and t.dtype != dt:
                self._buffers[k] = kept[k].to(t.device)
        return self

    def _fp8_rows(self, x: torch.Tensor) -> bool:
        """Whether this call quantizes its activations to FP8: w4a8-fp8 with W4A8_MIN_M rows or more, unless this
        GPU's table measured W4A16's kernels faster on this shape and M (ops.w4a8.prefers_w4a16; eager calls and
        CUDA graphs: under torch.compile every such call runs W4A8, the table being a file read the trace cannot
        hold)."""
        if not self.scheme.weight_only or not self.scheme.fp8_act or x.numel() < W4A8_MIN_M * x.shape[-1]:
            return False
        if x.device.type != "cuda" or torch.compiler.is_compiling():     # the table is read by eager calls only
            return True
        return not _w4a8(prefers=True)(x.numel() // x.shape[-1], self.out_features, self.in_features, x.device)

    def _reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fp8_rows(x):
            return ref.w4a8_linear(x, self.qweight, self.scales, self.zeros, self.group_size, self.perm, self.bias)
        if self.scheme.weight_only:
            return ref.weight_only_linear(x, self.qweight, self.scales, self.zeros, self.bits, self.group_size,
                                          self.perm, self.bias)
        return ref.w8a8_linear(x, self.weight, self.weight_scale, self.bias,
                               dtype=self.scheme.gemm_dtype)

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme.name!r}"
        if self.scheme.weight_only:
            s += f", group_size={self.group_size}, symmetric={self.symmetric}, act_order={self.perm is not None}"
        return s


def _w4a8(prefers: bool = False):
    """ops.w4a8.w4a8_linear (prefers: its prefers_w4a16), imported on the first w4a8-fp8 forward."""
    if not _W4A8:
        from ..ops.w4a8 import prefers_w4a16, w4a8_linear
        _W4A8.extend((w4a8_linear, prefers_w4a16))
    return _W4A8[1 if prefers else 0]


_W4A8: list = []


def _ops():
    """ops.gemm and ops.weight_only, imported on the first forward (a global read after that, not the import
    machinery on every call; a plain global, which torch.compile reads without tracing a cache)."""
    if _OPS:
        return _OPS
    from ..ops import gemm, weight_only
    _OPS.extend((gemm, weight_only))
    return _OPS


_OPS: list = []


def concat_problem(layers) -> str | None:
    """Why QuantizedLinear.concat cannot join `layers`, or None."""
    facts = [(m.scheme, m.in_features, getattr(m, "group_size", None), getattr(m, "symmetric", None),
              getattr(m, "int_zeros", None), m.bias is not None) for m in layers]
    if any(f != facts[0] for f in facts):
        return f"their configurations (scheme, in_features, group_size, symmetric, int_zeros, bias) differ: {facts}"
    if layers[0].scheme.weight_only and not same_act_order(layers):
        return "their act-order permutations differ: each orders K its own way, so they cannot share one input"
    return None


def same_act_order(layers) -> bool:
    """Whether weight-only `layers` read K in one order: all without an act-order permutation, or all with equal
    ones (what QuantizedLinear.concat needs)."""
    perms = [m.perm for m in layers]
    return all((p is None) == (perms[0] is None) and (p is None or torch.equal(p, perms[0])) for p in perms)

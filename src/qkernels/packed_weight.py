"""PackedWeight: the kernel layout of weight-only quantized linear weights (W4A16 / W8A16), and the
converters into it (float weights, plain integer weights, GPTQ, AWQ and compressed-tensors checkpoint tensors).

Layout (for an nn.Linear weight W of shape [N, K]):
  qweight  uint8, unsigned codes u in [0, 2**bits), row-major along K (a GEMV reads each output
           row contiguously; a tiled kernel reads [BLOCK_N, BLOCK_K] tiles). 8-bit: [N, K].
           4-bit: [N, Kp / 2], K padded with zero codes to Kp, a multiple of 64; in each chunk of 64
           k-values (32 bytes) byte j holds k = j in its low nibble and k = 32 + j in its high nibble,
           so a kernel splits a byte tile into two tiles of 32 consecutive k with no interleaving
           (reference.pack_weight_codes).
  scale_zero  [N, K / G, 2] float16 or bfloat16 (G = group_size; per-channel: [N, 1, 2]): the scale
           and the zero point of each group side by side, so that a kernel fetches both with one 32-bit
           load (which Triton's software pipeliner turns into an asynchronous copy; 16-bit loads stay
           synchronous and stall every step). `scales` and `zeros` are views of it.
           Symmetric weights (zeros None) store the implicit zero point 2**(bits - 1) (the signed code
           q is stored as u = q + 2**(bits - 1)). Integer zero points (GPTQ, AWQ, our asymmetric
           quantizer) and float ones (HQQ) both fit.
  perm     int64 [K] or None: act-order (GPTQ desc_act). The input channels were reordered so that
           groups are contiguous: column j of qweight is input channel perm[j], and x is gathered
           x[..., perm] before the product.
Dequantized weight:  W[n, perm[k]] = (u[n, k] - zero[n, k // G]) * scale[n, k // G].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import reference as ref
from ._runtime import check_tensor
from .schemes import PER_CHANNEL, check_group_size
SCALE_DTYPES = (torch.float16, torch.bfloat16)


def _check_group(group_size: int, K: int, bits: int) -> int:
    """Validates group_size against K; returns the effective group length (K for -1)."""
    check_group_size(group_size)
    if group_size != PER_CHANNEL and K % group_size:
        raise ValueError(f"K={K} (the input features) must be a multiple of group_size={group_size}")
    if bits == 4 and K % 2:
        raise ValueError(f"K={K} must be even for 4-bit weights (two codes per byte)")
    return K if group_size == PER_CHANNEL else group_size


def qweight_width(K: int, bits: int) -> int:
    """Bytes per row of qweight: K (8-bit), or K padded to a multiple of 64, halved (4-bit)."""
    return K if bits == 8 else -(-K // ref.WO_CHUNK) * ref.WO_CHUNK // 2


def num_groups(group_size: int, K: int) -> int:
    return 1 if group_size == PER_CHANNEL else K // group_size


def _check_bits(bits: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")


def integer_zeros(zeros: torch.Tensor, bits: int) -> bool:
    """Whether every zero point is an integer in [0, 2**bits] (GPTQ's stored-minus-one zeros reach 2**bits).
    Reads the values: a device sync, so for conversion and load time, not a forward."""
    if zeros.is_meta:
        return False
    z = zeros.float()
    return bool(((z == z.round()) & (z >= 0) & (z <= 2 ** bits)).all())


def pack_scale_zero(scales: torch.Tensor, zeros: torch.Tensor | None, bits: int) -> torch.Tensor:
    """scales [N, G] and zeros [N, G] (None: the symmetric zero point 2**(bits - 1)) -> [N, G, 2] in
    scales' dtype."""
    z = torch.full_like(scales, 2 ** (bits - 1)) if zeros is None else zeros.to(scales.dtype)
    return torch.stack((scales, z), dim=-1).contiguous()


@dataclass
class PackedWeight:
    """A weight-only quantized [N, K] linear weight in the kernel layout (see the module docstring)."""

    qweight: torch.Tensor
    scale_zero: torch.Tensor  # [N, K / G, 2]: scale, zero point
    bits: int
    group_size: int          # -1: per output channel
    shape: tuple[int, int]   # (N, K)
    perm: torch.Tensor | None = None
    symmetric: bool = False  # zero point 2**(bits - 1) for every group; `zeros` is None
    # every zero point an integer in [0, 2**bits] (symmetric weights, and the converters' asymmetric ones; not
    # HQQ-style float zero points): the kernels may then fold their conversion's magic number into the zero
    # point, exactly. Set by the converters from the data; QuantizedLinear keeps it with its buffers.
    int_zeros: bool = False

    def __post_init__(self):
        if self.scale_zero.dim() != 3 or self.scale_zero.shape[-1] != 2:
            raise ValueError(f"scale_zero must have shape [N, K / group_size, 2], got {tuple(self.scale_zero.shape)}")
        self.scale_zero = self.scale_zero.contiguous()
        self.int_zeros = bool(self.int_zeros or self.symmetric)

    @classmethod
    def from_parts(cls, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int,
                   group_size: int, shape: tuple[int, int], perm: torch.Tensor | None = None) -> "PackedWeight":
        """From separate scales [N, G] and zeros [N, G] (None: symmetric), already in the kernel layout."""
        return cls(qweight, pack_scale_zero(scales, zeros, bits), bits, group_size, tuple(shape), perm,
                   zeros is None, zeros is None or integer_zeros(zeros, bits))

    # ---- properties -----------------------------------------------------------------------
    @property
    def scales(self) -> torch.Tensor:
        """[N, K / G] view of scale_zero."""
        return self.scale_zero[..., 0]

    @property
    def zeros(self) -> torch.Tensor | None:
        """[N, K / G] view of scale_zero, or None for symmetric weights."""
        return None if self.symmetric else self.scale_zero[..., 1]

    @property
    def group_len(self) -> int:
        return self.shape[1] if self.group_size == PER_CHANNEL else self.group_size

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scale_zero, self.perm)
                   if t is not None)

    def to(self, device) -> "PackedWeight":
        mv = (lambda t: None if t is None else t.to(device))
        return PackedWeight(mv(self.qweight), mv(self.scale_zero), self.bits, self.group_size, self.shape,
                            mv(self.perm), self.symmetric, self.int_zeros)

    def codes(self) -> torch.Tensor:
        """Unsigned codes u [N, K] (uint8), in the stored (possibly permuted) column order."""
        return ref.unpack_weight_codes(self.qweight, self.bits, self.shape[1])

    def unpack(self):
        """Back to plain form, exactly: (q [N, K], scales [N, K/G], zeros [N, K/G] or None, g_idx [K]).
        q is int8 signed for symmetric weights, else uint8 unsigned; columns in the original input
        order; g_idx[k] = the group of input channel k (k // G without act-order)."""
        N, K = self.shape
        u = self.codes()
        q = (u.to(torch.int16) - 2 ** (self.bits - 1)).to(torch.int8) if self.symmetric else u
        g = torch.arange(K, device=u.device) // self.group_len
        if self.perm is not None:
            inv = torch.empty_like(self.perm)
            inv[self.perm] = torch.arange(K, device=self.perm.device)
            q, g = q[:, inv], g[inv]
        return q, self.scales, self.zeros, g

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The [N, K] float weight it represents (pure torch; the reference for the kernels)."""
        return ref.weight_only_dequantize(self.qweight, self.scales, self.zeros, self.bits, self.group_size,
                                          self.shape[1], self.perm, dtype)

    def __repr__(self) -> str:
        return (f"PackedWeight(shape={self.shape}, bits={self.bits}, group_size={self.group_size}, "
                f"symmetric={self.symmetric}, act_order={self.perm is not None}, scales={self.scales.dtype}, "
                f"device={self.device})")

    # ---- converters -----------------------------------------------------------------------
    @classmethod
    def from_float(cls, weight: torch.Tensor, bits: int = 4, group_size: int = 128, symmetric: bool = False,
                   scale_dtype: torch.dtype | None = None) -> "PackedWeight":
        """Quantize a float [N, K] weight (round to nearest, min-max scales per group; the numerics of
        `qkernels.reference.quantize`, with the scale rounded to scale_dtype before the codes are chosen)
        and pack it. scale_dtype defaults to the weight's dtype when it
        is fp16/bf16, else fp16."""
        _check_bits(bits)
        check_tensor("weight", weight, dtypes=(torch.float32, torch.float16, torch.bfloat16))
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
        weight = weight.detach()
        N, K = weight.shape
        G = _check_group(group_size, K, bits)
        sdt = scale_dtype or (weight.dtype if weight.dtype in SCALE_DTYPES else torch.float16)
        _check_scale_dtype(sdt)
        gran = "row" if group_size == PER_CHANNEL else "group"
        fmt = "int4" if bits == 4 else "int8"
        _, s, zp = ref.quantize(weight, fmt, gran, G, symmetric)
        s = s.to(sdt).float()          # codes are chosen for the scale as stored (fp16 / bf16)
        data, s, zp = ref.quantize(weight, fmt, gran, G, symmetric, scale=s, zero_point=zp)
        if bits == 4:
            q = ref.unpack_int4(data, signed=symmetric)
        else:
            q = data
        s = s.reshape(N, num_groups(group_size, K))
        zeros = None if symmetric else zp.reshape(N, num_groups(group_size, K)).to(sdt)
        return cls.from_int(q, s.to(sdt), zeros, bits=bits, group_size=group_size)

    @classmethod
    def from_int(cls, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None = None, *, bits: int = 4,
                 group_size: int = 128, g_idx: torch.Tensor | None = None) -> "PackedWeight":
        """Plain integer weight q [N, K] with scales [N, K/G] (and zeros [N, K/G]).

        Symmetric (zeros None): q signed in [-2**(bits-1), 2**(bits-1)); W = q * s. Asymmetric: q
        unsigned in [0, 2**bits); zeros integer or float; W = (q - z) * s. g_idx [K] (optional, GPTQ
        act-order): the group of each input channel; each group must hold exactly G channels."""
        _check_bits(bits)
        check_tensor("q", q, dtypes=(torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64))
        if q.dim() != 2:
            raise ValueError(f"q must be 2-D [N, K], got shape {tuple(q.shape)}")
        N, K = q.shape
        G = _check_group(group_size, K, bits)
        check_tensor("scales", scales, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        ng = num_groups(group_size, K)
        if tuple(scales.shape) != (N, ng):
            raise ValueError(f"scales must have shape {(N, ng)} ([N, K / group_size]), got {tuple(scales.shape)}")
        sdt = scales.dtype if scales.dtype in SCALE_DTYPES else torch.float16
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if zeros is None else (0, 2 ** bits - 1)
        if q.numel() and (int(q.min()) < lo or int(q.max()) > hi):
            kind = "signed (symmetric, zeros=None)" if zeros is None else "unsigned (with zeros)"
            raise ValueError(f"q must hold {kind} {bits}-bit values in [{lo}, {hi}], "
                             f"got values in [{int(q.min())}, {int(q.max())}]")
        if zeros is not None:
            check_tensor("zeros", zeros, dtypes=(torch.float16, torch.bfloat16, torch.float32, torch.int8,
                                                 torch.uint8, torch.int16, torch.int32, torch.int64))
            if tuple(zeros.shape) != (N, ng):
                raise ValueError(f"zeros must have shape {(N, ng)} like scales, got {tuple(zeros.shape)}")
            zeros = zeros.to(sdt).contiguous()
        u = q.to(torch.int16) + (2 ** (bits - 1) if zeros is None else 0)
        perm = None
        if g_idx is not None:
            check_tensor("g_idx", g_idx, dtypes=(torch.int32, torch.int64))
            if tuple(g_idx.shape) != (K,):
                raise ValueError(f"g_idx must have shape ({K},), got {tuple(g_idx.shape)}")
            g_idx = g_idx.to(q.device).long()
            if K and not torch.equal(g_idx, torch.arange(K, device=q.device) // G):
                if g_idx.min() < 0 or g_idx.max() >= ng or bool((torch.bincount(g_idx, minlength=ng) != G).any()):
                    raise ValueError(f"g_idx must assign exactly group_size={G} input channels to each of the "
                                     f"{ng} groups")
                perm = torch.sort(g_idx, stable=True).indices
                u = u[:, perm]
        u = u.to(torch.uint8)
        qweight = ref.pack_weight_codes(u, bits)
        return cls.from_parts(qweight.contiguous(), scales.to(sdt), zeros, bits, group_size, (N, K), perm)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  g_idx: torch.Tensor | None = None, *, bits: int = 4, group_size: int | None = None,
                  checkpoint_format: str = "gptq") -> "PackedWeight":
        """GPTQ tensors (AutoGPTQ / GPTQModel / transformers layout):
        qweight int32 [K * bits / 32, N] packed along K (code of row k in bits (k % p) * bits of word k // p,
        p = 32 / bits); qzeros int32 [K / G, N * bits / 32] packed along N the same way; scales [K / G, N];
        g_idx int32 [K] (act-order; default k // G).
        W[n, k] = (q[k, n] - z[g_idx[k], n] - offset) * scales[g_idx[k], n], offset 1 for the original
        "gptq" checkpoint format (zeros stored minus one) and 0 for "gptq_v2"."""
        _check_bits(bits)
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}")
        check_tensor("qweight", qweight, dtypes=(torch.int32,))
        check_tensor("qzeros", qzeros, dtypes=(torch.int32,))
        check_tensor("scales", scales, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        p = 32 // bits
        K, N = qweight.shape[0] * p, qweight.shape[1]
        if scales.dim() != 2 or scales.shape[1] != N:
            raise ValueError(f"scales must be [K / group_size, N={N}], got {tuple(scales.shape)}")
        ng = scales.shape[0]
        if ng == 0 or K % ng:
            raise ValueError(f"scales must have a row per group: K={K} is not a multiple of {ng} rows")
        G = group_size or K // ng
        if tuple(qzeros.shape) != (ng, N // p):
            raise ValueError(f"qzeros must be [{ng}, N * bits / 32 = {N // p}], got {tuple(qzeros.shape)}")
        q = _unpack_words(qweight.t(), bits).t()[:K]            # [K, N]
        z = _unpack_words(qzeros, bits)[:, :N].to(torch.int16)   # [ng, N]
        if checkpoint_format == "gptq":
            z = z + 1
        gs = PER_CHANNEL if G == K else G
        return cls.from_int(q.t().contiguous(), scales.t().contiguous(), z.t().contiguous().to(scales.dtype),
                            bits=bits, group_size=gs, g_idx=g_idx)

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *,
                 group_size: int | None = None) -> "PackedWeight":
        """AWQ (GEMM layout) tensors: qweight int32 [K, N / 8], qzeros int32 [K / G, N / 8], both packed
        along N eight to a word in the interleaved order: nibble i of word w holds column
        8 w + (0, 2, 4, 6, 1, 3, 5, 7)[i]; scales [K / G, N].  W[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]."""
        check_tensor("qweight", qweight, dtypes=(torch.int32,))
        check_tensor("qzeros", qzeros, dtypes=(torch.int32,))
        check_tensor("scales", scales, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        K, N = qweight.shape[0], qweight.shape[1] * 8
        if scales.dim() != 2 or scales.shape[1] != N:
            raise ValueError(f"scales must be [K / group_size, N={N}], got {tuple(scales.shape)}")
        ng = scales.shape[0]
        if tuple(qzeros.shape) != (ng, N // 8):
            raise ValueError(f"qzeros must be [{ng}, N / 8 = {N // 8}], got {tuple(qzeros.shape)}")
        if ng == 0 or K % ng:
            raise ValueError(f"scales must have a row per group: K={K} is not a multiple of {ng} rows")
        G = group_size or K // ng
        q = _awq_columns(_unpack_words(qweight, 4))      # [K, N]
        z = _awq_columns(_unpack_words(qzeros, 4))       # [ng, N]
        gs = PER_CHANNEL if G == K else G
        return cls.from_int(q.t().contiguous(), scales.t().contiguous(), z.t().contiguous().to(scales.dtype),
                            bits=4, group_size=gs)


    @classmethod
    def from_compressed_tensors(cls, weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                                weight_zero_point: torch.Tensor | None = None, g_idx: torch.Tensor | None = None, *,
                                bits: int, shape: tuple[int, int]) -> "PackedWeight":
        """compressed-tensors "pack-quantized" tensors (llm-compressor's W4A16 / W8A16 checkpoints):
        weight_packed int32 [N, ceil(K * bits / 32)] packed along K (the code of column k in bits (k % p) * bits of
        word k // p, p = 32 / bits), each code stored as the signed value plus 2**(bits - 1); weight_scale [N, K / G]
        (strategy "group"), [N, 1] ("channel") or one value ("tensor"); weight_zero_point (asymmetric) int32
        [ceil(N * bits / 32), K / G] packed along N the same way, or int8 [N, K / G] signed as older writers left
        it; g_idx [K] (activation order "group", older checkpoints): the group of each input channel.
        W[n, k] = (q[n, k] - zp[n, g]) * s[n, g], signed q and zp (zp 0 without weight_zero_point)."""
        _check_bits(bits)
        check_tensor("weight_packed", weight_packed, dtypes=(torch.int32,))
        check_tensor("weight_scale", weight_scale, dtypes=(torch.float16, torch.bfloat16, torch.float32))
        N, K = (int(v) for v in shape)
        p = 32 // bits
        if weight_packed.dim() != 2 or tuple(weight_packed.shape) != (N, -(-K // p)):
            raise ValueError(f"weight_packed must be [N={N}, ceil(K * bits / 32) = {-(-K // p)}] for a [{N}, {K}] "
                             f"weight of {bits}-bit codes, got {tuple(weight_packed.shape)}")
        s = weight_scale.reshape(-1, 1).expand(N, 1) if weight_scale.numel() == 1 else weight_scale
        if s.dim() != 2 or s.shape[0] != N or s.shape[1] == 0 or K % s.shape[1]:
            raise ValueError(f"weight_scale must be [N={N}, K / group_size] with K={K} a multiple of its columns "
                             f"(or one value), got {tuple(weight_scale.shape)}")
        ng = s.shape[1]
        offset = 2 ** (bits - 1)
        u = _unpack_words(weight_packed, bits)[:, :K]                        # unsigned: q + offset
        zeros = None
        if weight_zero_point is not None:
            if weight_zero_point.dtype == torch.int32 and tuple(weight_zero_point.shape) == (-(-N // p), ng):
                zeros = _unpack_words(weight_zero_point.t().contiguous(), bits)[:, :N].t()   # unsigned: zp + offset
            elif weight_zero_point.dtype == torch.int8 and tuple(weight_zero_point.shape) == (N, ng):
                zeros = weight_zero_point.to(torch.int16) + offset
            else:
                raise ValueError(f"weight_zero_point must be int32 [ceil(N * bits / 32) = {-(-N // p)}, {ng}] (packed "
                                 f"along N) or int8 [{N}, {ng}], got {weight_zero_point.dtype} "
                                 f"{tuple(weight_zero_point.shape)}")
        gs = PER_CHANNEL if ng == 1 else K // ng
        if zeros is None:
            return cls.from_int(u.to(torch.int16) - offset, s.contiguous(), None, bits=bits, group_size=gs,
                                g_idx=g_idx)
        return cls.from_int(u, s.contiguous(), zeros.contiguous().to(s.dtype), bits=bits, group_size=gs, g_idx=g_idx)


def _check_scale_dtype(dt) -> None:
    if dt not in SCALE_DTYPES:
        raise TypeError(f"scale_dtype must be float16 or bfloat16, got {dt}")


def _unpack_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, W] -> uint8 [R, W * 32 / bits]: field j of word w (bits j*bits..) goes to column w*p + j."""
    p = 32 // bits
    shifts = torch.arange(0, 32, bits, device=words.device, dtype=torch.int64)
    v = (words.to(torch.int64)[..., None] >> shifts) & (2 ** bits - 1)
    return v.reshape(words.shape[0], words.shape[1] * p).to(torch.uint8)


_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _awq_columns(fields: torch.Tensor) -> torch.Tensor:
    """Undo AWQ's interleave: fields [R, N] in nibble order -> [R, N] in column order."""
    R, N = fields.shape
    out = torch.empty_like(fields)
    f = fields.reshape(R, N // 8, 8)
    o = out.view(R, N // 8, 8)
    for i, col in enumerate(_AWQ_ORDER):
        o[:, :, col] = f[:, :, i]
    return out

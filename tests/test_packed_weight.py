"""PackedWeight converters: exact round trips, and GPTQ / AWQ import against their documented
dequantization formulas (written out independently here, with the packing done bit by bit)."""
import pytest
import torch

import qkernels as qk

from .conftest import DEVICE
from .helpers import assert_bit_exact


def _rand_q(N, K, bits, signed):
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2 ** bits)
    return torch.randint(lo, hi, (N, K), device=DEVICE, dtype=torch.int16).to(torch.int8 if signed else torch.uint8)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, 128, -1])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int_round_trip(bits, group_size, symmetric):
    N, K = 24, 256
    ng = 1 if group_size == -1 else K // group_size
    q = _rand_q(N, K, bits, symmetric)
    s = torch.rand(N, ng, device=DEVICE).half()
    z = None if symmetric else torch.randint(0, 2 ** bits, (N, ng), device=DEVICE).half()
    pw = qk.PackedWeight.from_int(q, s, z, bits=bits, group_size=group_size)
    assert pw.qweight.dtype == torch.uint8 and pw.qweight.shape == (N, K * bits // 8)   # K = 256: no padding
    q2, s2, z2, g = pw.unpack()
    assert_bit_exact(q2, q, "codes")
    assert_bit_exact(s2, s, "scales")
    if z is not None:
        assert_bit_exact(z2, z, "zeros")
    zz = z.float() if z is not None else 0.0
    gi = torch.arange(K, device=DEVICE) // (K if group_size == -1 else group_size)
    want = (q.float() - (zz[:, gi] if z is not None else 0.0)) * s.float()[:, gi]
    assert_bit_exact(pw.dequantize(), want, "dequantized")
    assert_bit_exact(g, gi, "g_idx")


def test_act_order_round_trip():
    N, K, G = 16, 128, 32
    q = _rand_q(N, K, 4, False)
    s = torch.rand(N, K // G, device=DEVICE).half()
    z = torch.randint(0, 16, (N, K // G), device=DEVICE).half()
    g_idx = (torch.randperm(K, device=DEVICE) // G).int()
    pw = qk.PackedWeight.from_int(q, s, z, bits=4, group_size=G, g_idx=g_idx)
    q2, _, _, g2 = pw.unpack()
    assert_bit_exact(q2, q, "codes in input order")
    assert_bit_exact(g2, g_idx.long(), "g_idx")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_from_float_error_bound(bits, symmetric):
    w = torch.randn(32, 256, device=DEVICE)
    pw = qk.PackedWeight.from_float(w, bits, 64, symmetric)
    s = pw.scales.float().repeat_interleave(64, dim=1)
    # round to nearest with the stored scale: within half a step (values at the range's edge may clamp by
    # the fp16 rounding of the scale, relative 2**-11)
    assert ((pw.dequantize() - w).abs() <= 0.5 * s + 2 ** -10 * w.abs() + 1e-6).all()


# --- GPTQ ------------------------------------------------------------------------------------


def _pack_along(v: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned fields into int32 words along `dim`: field j of word w is element w * p + j."""
    p = 32 // bits
    v = v.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // p, p)
    words = torch.zeros(v.shape[:-1], dtype=torch.int64, device=v.device)
    for j in range(p):
        words |= v[..., j] << (bits * j)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)   # as int32 bit patterns
    return words.to(torch.int32).movedim(-1, dim)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_from_gptq(bits, act_order, fmt):
    N, K, G = 64, 256, 64
    q = torch.randint(0, 2 ** bits, (K, N), device=DEVICE)            # GPTQ works in [K, N]
    zeros = torch.randint(0, 2 ** bits - 1, (K // G, N), device=DEVICE)   # stored zeros
    scales = (torch.rand(K // G, N, device=DEVICE) + 0.1).half()
    g_idx = (torch.randperm(K, device=DEVICE) // G if act_order else torch.arange(K, device=DEVICE) // G).int()
    qweight = _pack_along(q, bits, 0)             # [K * bits / 32, N]
    qzeros = _pack_along(zeros, bits, 1)          # [K / G, N * bits / 32]
    pw = qk.PackedWeight.from_gptq(qweight, qzeros, scales, g_idx, bits=bits, checkpoint_format=fmt)
    off = 1 if fmt == "gptq" else 0
    gi = g_idx.long()
    want = (scales.float()[gi] * (q.float() - (zeros[gi].float() + off))).t()   # documented: [K, N] -> [N, K]
    assert_bit_exact(pw.dequantize(), want, "GPTQ dequantization")
    assert (pw.perm is not None) == act_order
    x = torch.randn(3, K, device=DEVICE, dtype=torch.float16)
    f = qk.w4a16_linear if bits == 4 else qk.w8a16_linear
    y = f(x, pw)
    ref_y = (x.float() @ want.t())
    assert ((y.float() - ref_y).norm() / ref_y.norm()) < 2e-3


# --- AWQ -------------------------------------------------------------------------------------

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # nibble i of a word holds column 8 w + AWQ_ORDER[i]


def _pack_awq(v: torch.Tensor) -> torch.Tensor:
    R, N = v.shape
    v = v.to(torch.int64).reshape(R, N // 8, 8)
    words = torch.zeros(R, N // 8, dtype=torch.int64, device=v.device)
    for i, col in enumerate(AWQ_ORDER):
        words |= v[:, :, col] << (4 * i)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def test_from_awq():
    N, K, G = 64, 256, 128
    q = torch.randint(0, 16, (K, N), device=DEVICE)
    zeros = torch.randint(0, 16, (K // G, N), device=DEVICE)
    scales = (torch.rand(K // G, N, device=DEVICE) + 0.1).half()
    pw = qk.PackedWeight.from_awq(_pack_awq(q), _pack_awq(zeros), scales)
    gi = torch.arange(K, device=DEVICE) // G
    want = ((q.float() - zeros[gi].float()) * scales.float()[gi]).t()
    assert_bit_exact(pw.dequantize(), want, "AWQ dequantization")
    q2, s2, z2, _ = pw.unpack()
    assert_bit_exact(q2, q.t().to(torch.uint8), "codes")


def test_gptq_awq_bad_shapes():
    with pytest.raises(ValueError, match=r"qzeros must be \[2, N \* bits / 32 = 8\]"):
        qk.PackedWeight.from_gptq(torch.zeros(16, 64, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32),
                                  torch.ones(2, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"scales must be \[K / group_size, N=64\]"):
        qk.PackedWeight.from_awq(torch.zeros(128, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32),
                                 torch.ones(1, 32, dtype=torch.float16))


def test_scale_zero_storage_is_word_aligned():
    """Kernels read (scale, zero) as one 32-bit word: a scale_zero at an odd fp16 offset gives the same result."""
    pw = qk.PackedWeight.from_float(torch.randn(24, 128, device=DEVICE, dtype=torch.float16), 4, 64)
    base = torch.empty(1 + pw.scale_zero.numel(), dtype=pw.scale_zero.dtype, device=DEVICE)
    sz = base[1:].view(pw.scale_zero.shape)
    sz.copy_(pw.scale_zero)
    assert sz.data_ptr() % 4
    odd = qk.PackedWeight(pw.qweight, sz, pw.bits, pw.group_size, pw.shape, pw.perm, pw.symmetric)
    assert torch.equal(odd.scales, pw.scales) and torch.equal(odd.zeros, pw.zeros)
    x = torch.randn(3, 128, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(qk.w4a16_linear(x, odd), qk.w4a16_linear(x, pw), "misaligned scale_zero")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_from_compressed_tensors(bits, symmetric):
    """compressed-tensors' pack-quantized tensors (codes packed along K, the last word part-filled where K is not a
    whole number of words; zero points packed along N): the dequantized weight is (q - zp) * s of the signed
    values, exactly; a per-tensor scale is every row's."""
    g = torch.Generator().manual_seed(bits + 2 * symmetric)
    half = 2 ** (bits - 1)
    N, p = 24, 32 // bits

    def pack(v, dim):                                    # signed ints -> int32 words along dim, + half, LSB first
        u = (v.to(torch.int64) + half).movedim(dim, -1)
        u = torch.nn.functional.pad(u, (0, -u.shape[-1] % p)).reshape(*u.shape[:-1], -1, p)
        words = (u << (torch.arange(p) * bits)).sum(-1)
        return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32).movedim(-1, dim).contiguous()

    for K, ng in ((196, 1), (256, 8)):                   # 196: the last word part-filled (4-bit)
        q = torch.randint(-half, half, (N, K), generator=g, dtype=torch.int8)
        s = (torch.rand(N, ng, generator=g) * 0.02 + 0.001).to(torch.float16)
        zp = None if symmetric else torch.randint(-half, half, (N, ng), generator=g, dtype=torch.int8)
        cols = torch.arange(K) // (K // ng)
        want = (q.float() - (0 if symmetric else zp.float()[:, cols])) * s.float()[:, cols]
        pw = qk.PackedWeight.from_compressed_tensors(pack(q, 1), s, None if symmetric else pack(zp, 0),
                                                     bits=bits, shape=(N, K))
        assert torch.equal(pw.dequantize(torch.float32), want) and pw.symmetric == symmetric
        if not symmetric:        # zero points as older writers left them: int8, unpacked
            pw = qk.PackedWeight.from_compressed_tensors(pack(q, 1), s, zp, bits=bits, shape=(N, K))
            assert torch.equal(pw.dequantize(torch.float32), want)
    one = torch.tensor([0.01], dtype=torch.float16)     # strategy "tensor"
    pw = qk.PackedWeight.from_compressed_tensors(pack(q, 1), one, bits=bits, shape=(N, K))
    assert torch.equal(pw.dequantize(torch.float32), q.float() * one.float())
    with pytest.raises(ValueError, match=r"weight_packed must be \[N=24"):
        qk.PackedWeight.from_compressed_tensors(pack(q, 1)[:, 1:], one, bits=bits, shape=(N, K))
    with pytest.raises(ValueError, match="weight_scale must be"):
        qk.PackedWeight.from_compressed_tensors(pack(q, 1), torch.ones(N, 3, dtype=torch.float16), bits=bits,
                                                shape=(N, K))
    with pytest.raises(ValueError, match="weight_zero_point must be int32"):
        qk.PackedWeight.from_compressed_tensors(pack(q, 1), one.expand(N, 1).contiguous(),
                                                torch.zeros(N, 1, dtype=torch.int32), bits=bits, shape=(N, K))

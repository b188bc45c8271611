"""w4a8_linear (ops/w4a8.py) against its twin reference.w4a8_linear: the same fp8 activation codes and scales, the
4-bit weight's exact dequantization, fp32 sums in another order (relative error bound)."""
import pytest
import torch

import qkernels as qk
from qkernels import reference as ref
from qkernels._runtime import poison_outputs, simulate_capability
from qkernels.ops import w4a8

from ..conftest import DEVICE, ON_GPU


def _case(N, K, group, symmetric, M, dtype, bias, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(DEVICE, dtype)
    pw = qk.PackedWeight.from_float(w, bits=4, group_size=group, symmetric=symmetric)
    x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
    return x, pw, b


def _check(x, pw, b, cfg=None):
    with poison_outputs():
        if cfg is None:
            y = w4a8.w4a8_linear(x, pw, b)
        else:
            with w4a8.use_config(cfg):
                y = w4a8.w4a8_linear(x, pw, b)
    r = ref.w4a8_linear(x, pw.qweight, pw.scales, pw.zeros, pw.group_size, pw.perm, b)
    assert y.shape == r.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    rel = ((y.float() - r.float()).norm() / r.float().norm()).item()
    assert rel < (2e-3 if x.dtype == torch.float16 else 1e-2), rel     # the output's rounding, a few ulps at most


@pytest.mark.parametrize("N, K, group, symmetric, M, dtype, bias", [
    (96, 256, 128, False, 5, torch.float16, False),
    (64, 128, 64, True, 17, torch.bfloat16, True),
    (80, 192, -1, False, 3, torch.float16, False),
    (33, 128, 128, False, 1, torch.float16, True),         # odd N, one token
])
def test_matches_twin(N, K, group, symmetric, M, dtype, bias):
    _check(*_case(N, K, group, symmetric, M, dtype, bias, seed=N + M))


@pytest.mark.parametrize("cfg", list(w4a8.DEFAULT_CONFIGS.values())[:2]
                         + [dict(w4a8.DEFAULT_CONFIGS[16], SWAP=True)], ids=["m16", "m32", "m16-swap"])
def test_split_k_and_tile_edges(cfg):
    """K split over programs (the last one adds the slices) and M, N past the tile edges."""
    x, pw, b = _case(72, 512, 128, False, 19, torch.float16, True, seed=3)
    _check(x, pw, b, dict(cfg, MIN_PROGRAMS=10 ** 9))


def test_act_order_and_views():
    x, pw, b = _case(64, 256, 64, False, 4, torch.float16, False, seed=5)
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    pw = qk.PackedWeight(pw.qweight, pw.scale_zero, pw.bits, pw.group_size, pw.shape, perm, pw.symmetric, pw.int_zeros)
    big = torch.randn(4, 512, device=DEVICE, dtype=torch.float16)
    view = big[:, ::2]                                        # strided rows
    _check(view, pw, b)
    x3 = x.view(2, 2, 256)
    y3 = w4a8.w4a8_linear(x3, pw)
    assert torch.equal(y3.view(4, -1), w4a8.w4a8_linear(x, pw))


def test_opcheck():
    x, pw, b = _case(64, 128, 64, False, 3, torch.float16, True, seed=2)
    torch.library.opcheck(w4a8._w4a8_op, (x, pw.qweight, pw.scale_zero, b, pw.group_size))


def test_code_as_e4m3_is_exact():
    """The identity the kernel rests on: a 4-bit code u as an e4m3 bit pattern is u * 2**-9."""
    u = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(u.view(torch.float8_e4m3fn).float(), u.float() * 2 ** -9)


def test_bad_inputs_name_the_argument():
    x, pw, b = _case(64, 128, 64, False, 2, torch.float16, False, seed=0)
    with pytest.raises(TypeError, match="w_packed must be a qkernels.PackedWeight"):
        w4a8.w4a8_linear(x, torch.zeros(64, 64, dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match=r"x's last dim must be the weight's in_features K=128"):
        w4a8.w4a8_linear(x[:, :64], pw)
    with pytest.raises(TypeError, match=r"x must have dtype in \(float16, bfloat16\), got float32"):
        w4a8.w4a8_linear(x.float(), pw)
    pw32 = qk.PackedWeight.from_float(torch.randn(64, 128, device=DEVICE).half(), bits=4, group_size=32)
    with pytest.raises(ValueError, match="group_size a multiple of 64 or -1 .* got 32"):
        w4a8.w4a8_linear(x, pw32)
    pw8 = qk.PackedWeight.from_float(torch.randn(64, 128, device=DEVICE).half(), bits=8, group_size=-1)
    with pytest.raises(ValueError, match="needs a 4-bit PackedWeight, got bits=8"):
        w4a8.w4a8_linear(x, pw8)
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        w4a8.w4a8_linear(x, pw, torch.zeros(3, device=DEVICE, dtype=torch.float16))
    with simulate_capability((8, 0)), pytest.raises(RuntimeError, match=r"needs FP8 tensor cores \(compute "
                                                                         r"capability >= 8.9\), got .*8\.0.*w4a16"):
        w4a8.w4a8_linear(x, pw)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability() < (8, 9), reason="FP8 tensor cores")
@pytest.mark.parametrize("M", [1, 2, 16, 17, 31, 64, 65, 128, 129, 256])
@pytest.mark.parametrize("N, K", [(4096, 4096), (1000, 2048), (2048, 6144)])
def test_real_sizes_every_bucket(M, N, K):
    case = _case(N, K, 128, False, M, torch.float16, M % 2 == 1, seed=M)
    _check(*case)
    if M <= 64:
        _check(*case, dict(w4a8.config_for(M), SWAP=True))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability() < (8, 9), reason="FP8 tensor cores")
def test_cuda_graph_and_compile():
    _graph_and_compile_match_eager()


def _graph_and_compile_match_eager():
    """The op replayed in a CUDA graph and compiled with fullgraph=True gives the eager call's bits."""
    x, pw, b = _case(1024, 2048, 128, False, 16, torch.float16, True, seed=9)
    eager = w4a8.w4a8_linear(x, pw, b)
    g = torch.cuda.CUDAGraph()
    w4a8.w4a8_linear(x, pw, b)
    with torch.cuda.graph(g):
        y = w4a8.w4a8_linear(x, pw, b)
    g.replay()
    assert torch.equal(y, eager)
    f = torch.compile(lambda t: w4a8.w4a8_linear(t, pw, b), fullgraph=True)
    assert torch.equal(f(x), eager)


def _hopper():
    return ON_GPU and torch.cuda.get_device_capability() == (9, 0)


def _wg(M, **kw):
    """The Hopper wgmma kernel's bucket config for M, with kw (and no fallback: a case it does not run fails)."""
    cfg = dict(w4a8.WG_CONFIGS[min(max(1 << (M - 1).bit_length(), 16), 256)], **kw)
    return cfg


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90's")
@pytest.mark.parametrize("M", [1, 5, 16, 17, 33, 64, 100, 128, 129, 256])
@pytest.mark.parametrize("N, K, group, symmetric, dtype, bias", [
    (4096, 2048, 128, False, torch.float16, False),
    (1000, 4160, 64, True, torch.bfloat16, True),          # N past a tile edge, an odd number of 64-k chunks
    (768, 1024, -1, False, torch.float16, True),           # per channel
])
def test_wg_matches_twin(M, N, K, group, symmetric, dtype, bias):
    x, pw, b = _case(N, K, group, symmetric, M, dtype, bias, seed=M + N)
    assert w4a8.wg_runs(x.device, pw.int_zeros)
    _check(x, pw, b, _wg(M))
    _check(x, pw, b, _wg(M, MIN_PROGRAMS=10 ** 9))          # K split 4 (2 at M > 128) ways
    _check(x, pw, b, _wg(M, SPLIT_K=1, STAGES=2))
    _check(x, pw, b, _wg(M, CPG=2, MIN_PROGRAMS=10 ** 9))   # one promotion per 128 k (per 64 where the group is 64)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90's")
@pytest.mark.parametrize("bm, bn, warps, ws, cpg", [(8, 64, 4, False, 1), (16, 128, 8, False, 1),
                                                    (64, 128, 8, False, 1), (128, 64, 4, False, 1),
                                                    (16, 64, 4, True, 1), (64, 64, 4, True, 1), (16, 64, 4, False, 2),
                                                    (64, 128, 8, False, 2), (16, 64, 4, True, 2),
                                                    (64, 128, 8, True, 2)])
def test_wg_tiles(bm, bn, warps, ws, cpg):
    x, pw, b = _case(520, 1536, 128, False, 37, torch.float16, True, seed=bm + bn)
    extra = dict(WS=True, maxnreg=96 if bm <= 32 else 168) if ws else {}
    for split in (3, 1):      # 1536 = 12 chunks, 6 units of two: split 3 takes 2 units a slice
        _check(x, pw, b, dict(path="wg", BLOCK_M=bm, BLOCK_N=bn, GROUP_M=4, STAGES=4 if cpg == 2 else 3,
                              num_warps=warps, SPLIT_K=split, MIN_PROGRAMS=10 ** 9, CPG=cpg, **extra))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90's")
def test_wg_zero_points_at_the_ends():
    """Zero points 0 and 16 (GPTQ's stored-minus-one zeros reach 2**bits): -z is an exact e4m3 tile for both."""
    g = torch.Generator().manual_seed(4)
    N, K, G = 192, 512, 128
    codes = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    scales = (torch.rand(N, K // G, generator=g) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 2, (N, K // G), generator=g).half() * 16          # 0 or 16
    pw = qk.PackedWeight.from_parts(ref.pack_weight_codes(codes, 4).to(DEVICE), scales.to(DEVICE), zeros.to(DEVICE),
                                    4, G, (N, K))
    assert pw.int_zeros
    x = torch.randn(24, K, generator=g).to(DEVICE, torch.float16)
    _check(x, pw, None, _wg(24))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90's")
def test_wg_float_zero_points_fall_back():
    """Zero points that are not integers in [0, 16] have no exact e4m3 -z: the Triton kernel runs them."""
    x, pw, b = _case(256, 512, 128, False, 16, torch.float16, False, seed=6)
    pw = qk.PackedWeight.from_parts(pw.qweight, pw.scales, pw.zeros + 0.25, 4, 128, pw.shape)
    assert not pw.int_zeros and not w4a8.wg_runs(x.device, pw.int_zeros)
    _check(x, pw, b, w4a8.config_for(16, x.device))


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="the wgmma kernel is sm_90's")
def test_wg_cuda_graph_and_compile():
    with w4a8.use_config(_wg(16, MIN_PROGRAMS=10 ** 9)):
        _graph_and_compile_match_eager()

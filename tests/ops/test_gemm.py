"""int8 / fp8 / int4 GEMMs and the W8A8 linear vs qkernels.reference."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import qkernels as qk
from qkernels import reference as ref
from qkernels.ops.gemm import MAX_K_INT8

from ..conftest import DEVICE, ON_GPU
from ..helpers import assert_bit_exact, graph_replay, rel_err, shipped_table_entries, table_entry_case

gpu = pytest.mark.gpu
MS = [0, 1, 2, 15, 16, 17, 33, 127, 128, 129]
NK = [(40, 72), (255, 513)]
NEEDS_FP8 = pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability() < (8, 9), reason="fp8 needs sm_89+")


def _i8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)


@pytest.mark.parametrize("N,K", NK)
@pytest.mark.parametrize("M", MS)
def test_int8_exact(M, N, K):
    a, w = _i8(M, K), _i8(N, K)
    with qk.poison_outputs():
        c = qk.int8_matmul(a, w.t())            # transposed view of an nn.Linear weight
    assert_bit_exact(c, ref.int_mm(a, w.t()), "int8 product")
    assert_bit_exact(qk.int8_matmul(a, w.t().contiguous()), c, "contiguous b")


@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 14336, 4096), (129, 4096, 14336), (4096, 4096, 4096)])
@gpu
def test_int8_exact_real_sizes(M, N, K):
    a, w = _i8(M, K), _i8(N, K)
    assert_bit_exact(qk.int8_matmul(a, w.t()), ref.int_mm(a, w.t()))


@gpu
@pytest.mark.parametrize("kind,key,cfg", shipped_table_entries(("int8", "fp8"), DEVICE),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_shipped_gemm_config(kind, key, cfg):
    """Each int8 / fp8 entry of this GPU's table (and its fallback) at its bucket's M on the shape it was tuned for (a
    shape override's N x K; 4096 x 4096 for a bucket), as the dispatch runs it: int8 bit-exact, fp8 to fp32
    rounding."""
    from qkernels.ops import gemm as G
    M, N, K = table_entry_case(key)
    sa, sb = torch.rand(M, device=DEVICE) * 0.01 + 1e-3, torch.rand(N, device=DEVICE) * 0.01 + 1e-3
    if kind == "int8":
        a, w = _i8(M, K), _i8(N, K)
        want = ref.int_mm(a, w.t())
    else:
        a = (torch.randn(M, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
        w = (torch.randn(N, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
        want = ref.scaled_mm(a.float(), w.t().float(), sa, sb, 1.0, None, None, torch.float64)
    for c in [cfg] + ([cfg["fallback"]] if "fallback" in cfg else []):
        with G.use_config(c), qk.poison_outputs():
            if kind == "int8":
                assert_bit_exact(qk.int8_matmul(a, w.t()), want, f"{key} {c}")
            else:
                assert rel_err(qk.fp8_matmul(a, w.t(), sa, sb, out_dtype=torch.float16), want) < 2e-3, f"{key} {c}"


def test_empty_k():
    """K = 0: the product is zero; the epilogue (bias, activation) still applies."""
    a, w = _i8(5, 0), _i8(7, 0)
    with qk.poison_outputs():
        assert_bit_exact(qk.int8_matmul(a, w.t()), torch.zeros(5, 7, dtype=torch.int32, device=DEVICE))
        bias = torch.randn(7, device=DEVICE, dtype=torch.float16)
        got = qk.int8_matmul(a, w.t(), 1.0, 1.0, bias=bias, activation="relu")
    assert_bit_exact(got, torch.relu(bias).expand(5, 7))


def test_int8_worst_case_accumulation():
    """All -128 * -128 over the deepest allowed K stays exact in int32."""
    K = 4096 if not ON_GPU else MAX_K_INT8
    a = torch.full((2, K), -128, dtype=torch.int8, device=DEVICE)
    c = qk.int8_matmul(a, a.t())
    assert c.dtype == torch.int32 and (c == 128 * 128 * K).all()


def test_int8_k_limit():
    K = MAX_K_INT8 + 1
    a = torch.empty((1, K), dtype=torch.int8, device=DEVICE)
    with pytest.raises(ValueError, match=r"K=131072 is too deep for exact int32 accumulation"):
        qk.int8_matmul(a, a.t())


def test_int8_views_and_3d():
    base = _i8(6, 40, 150)
    a = base[:, 3:20, 10:138]                      # 3-D, sliced, unaligned storage offset
    w = _i8(90, 128)[::2]                          # strided weight rows
    got = qk.int8_matmul(a, w.t())
    assert got.shape == (6, 17, 45)
    assert_bit_exact(got, ref.int_mm(a.reshape(-1, 128), w.t()).reshape(6, 17, 45))
    assert_bit_exact(got, qk.int8_matmul(a.contiguous(), w.t().contiguous()))


@pytest.mark.parametrize("act", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("scales", ["row_col", "scalar_tensor", "python_float", "a_only", "none_with_bias"])
def test_int8_epilogue(scales, out_dtype, act):
    M, N, K = 33, 40, 72
    a, w = _i8(M, K), _i8(N, K)
    sa = torch.rand(M, 1, device=DEVICE) * 0.01 + 1e-3
    sb = torch.rand(N, device=DEVICE) * 0.01 + 1e-3
    bias = torch.randn(N, device=DEVICE, dtype=out_dtype if out_dtype != torch.float32 else torch.float16)
    args = {"row_col": (sa, sb), "scalar_tensor": (sa[0, 0], sb), "python_float": (0.002, 0.003),
            "a_only": (sa, None), "none_with_bias": (None, None)}[scales]
    scale_c = 1e-4 if scales == "none_with_bias" else 0.5     # keep unscaled products inside fp16's range
    with qk.poison_outputs():
        got = qk.int8_matmul(a, w.t(), *args, scale_c, bias=bias, activation=act, out_dtype=out_dtype)
    want = ref.scaled_mm(a, w.t(), args[0], args[1], scale_c, bias, act, torch.float64)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[out_dtype]
    assert got.dtype == out_dtype
    assert rel_err(got, want) < tol


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("K", [72, 64, 1000])
def test_int8_gemv_gives_the_mma_bits(K, act):
    """M = 1 runs the int8 GEMV (dp4a; split-K in the interpreter's table), M = 2 the tensor-core kernel: the
    same int32 sums and the same epilogue, so row 0 has the same bits either way."""
    N = 300
    a, w = _i8(2, K), _i8(N, K)
    sa = torch.rand(2, 1, device=DEVICE) * 0.01 + 1e-3
    sb = torch.rand(N, device=DEVICE) * 0.01 + 1e-3
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    with qk.poison_outputs():
        one = qk.int8_matmul(a[:1], w.t(), sa[:1], sb, 0.5, bias=bias, activation=act)
        two = qk.int8_matmul(a, w.t(), sa, sb, 0.5, bias=bias, activation=act)
        exact = qk.int8_matmul(a[1:], w.t())
    assert_bit_exact(one, two[:1], "gemv vs mma epilogue")
    assert_bit_exact(exact, ref.int_mm(a[1:], w.t()), "gemv int32")


def test_use_config_scopes_the_gemv():
    """use_config forces a config (here the GEMV at M = 3, with split-K) inside the block only; a malformed
    config is refused up front."""
    from qkernels.ops import gemm as G
    a, w = _i8(3, 200), _i8(50, 200)
    cfg = dict(path="gemv", BLOCK_N=8, BLOCK_K=64, num_warps=2, SPLIT_K=3, MIN_PROGRAMS=1 << 30,
               fallback=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1))
    with G.use_config(cfg):
        assert G._gemm_config("int8", 3, 50, 200, a.device) is cfg
        with qk.poison_outputs():
            got = qk.int8_matmul(a, w.t())
    assert G._gemm_config("int8", 3, 50, 200, a.device) is not cfg
    assert_bit_exact(got, ref.int_mm(a, w.t()), "forced gemv")
    with pytest.raises(ValueError, match="cfg must be a GEMM config-table entry"):
        with G.use_config({"BLOCK_N": 8}):
            pass


_SPLIT_TILE = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1)


@pytest.mark.parametrize("split,min_programs", [(3, None), (8, None), (4, 1 << 30), (4, 2)])
@pytest.mark.parametrize("M,N,K", [(1, 40, 200), (16, 33, 96), (17, 16, 32), (40, 50, 520)])
def test_tile_kernel_split_k(M, N, K, split, min_programs):
    """The tile kernel with K split (SPLIT_K slices of whole BLOCK_K steps, or fewer: one per step at most, and with
    MIN_PROGRAMS only while the grid is smaller than that; the tile's last program adds the partials in slice order
    and runs the epilogue): int8 and int4 give the exact int32 product and the unsplit kernel's epilogue bits, fp8
    the reference within fp32 rounding; tails in M, N and K; every element written (poisoned outputs); the tile
    counters are left at zero (a second call gives the same bits)."""
    from qkernels.ops import gemm as G
    cfg = dict(_SPLIT_TILE, SPLIT_K=split)
    if min_programs is not None:
        cfg["MIN_PROGRAMS"] = min_programs
    tiles = -(-M // 16) * -(-N // 16)
    want_split = G.k_splits(split, -(-K // 32), tiles, min_programs)
    assert G._tile_plan(cfg, M, N, K) == (dict(_SPLIT_TILE, SPLIT_K=want_split), want_split)
    a, w = _i8(M, K), _i8(N, K)
    sa = torch.rand(M, device=DEVICE) * 0.01 + 1e-3
    sb = torch.rand(N, device=DEVICE) * 0.01 + 1e-3
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    calls = {"exact": lambda: qk.int8_matmul(a, w.t()),
             "scaled": lambda: qk.int8_matmul(a, w.t(), sa, sb, 0.5, bias=bias, activation="silu",
                                              out_dtype=torch.bfloat16)}
    for name, call in calls.items():
        with G.use_config(cfg), qk.poison_outputs():
            got = call()
            again = call()
        with G.use_config(_SPLIT_TILE):
            want = call()
        assert_bit_exact(got, want, f"int8 {name}")
        assert_bit_exact(again, got, f"int8 {name}, second call")
    ap = qk.pack_int4(torch.randint(-8, 8, (M, K), dtype=torch.int8, device=DEVICE))
    bp = qk.pack_int4(torch.randint(-8, 8, (N, K), dtype=torch.int8, device=DEVICE))
    with G.use_config(dict(cfg, BLOCK_K=64)), qk.poison_outputs():     # int4: 32-byte K steps at least
        got4 = qk.int4_matmul(ap, bp, K)
    assert_bit_exact(got4, ref.int4_mm(ap, bp), "int4 product")
    if ON_GPU:   # the GPU's int8 dots take 32 bytes of K at least: a clear error, not a compile failure
        with G.use_config(cfg), pytest.raises(ValueError, match="BLOCK_K >= 64"):
            qk.int4_matmul(ap, bp, K)
    if ON_GPU and torch.cuda.get_device_capability() < (8, 9):
        return
    af = (torch.randn(M, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    wf = (torch.randn(N, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    with G.use_config(cfg), qk.poison_outputs():
        gotf = qk.fp8_matmul(af, wf.t(), sa, sb, bias=bias, out_dtype=torch.float16)
        againf = qk.fp8_matmul(af, wf.t(), sa, sb, bias=bias, out_dtype=torch.float16)
    wantf = ref.scaled_mm(af.float(), wf.t().float(), sa, sb, 1.0, bias, None, torch.float64)
    assert rel_err(gotf, wantf) < 2e-3
    assert_bit_exact(againf, gotf, "fp8, second call (partials added in slice order)")


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_tile_config_pdl_false_is_a_launch_option(dtype):
    """A tile config's "PDL": false launches the GEMM without programmatic dependent launch: no constexpr of the
    config's own, and the W8A8 linear gives the bits of the same config without it (and the reference's value)."""
    from qkernels.ops import gemm as G
    if dtype == "fp8" and ON_GPU and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 GEMMs need sm_89+")
    cfg = dict(_SPLIT_TILE, SPLIT_K=2, PDL=False)
    assert "PDL" not in G._tile_plan(cfg, 20, 48, 256)[0]
    x = torch.randn(20, 256, device=DEVICE, dtype=torch.float16)
    w = torch.randn(48, 256, device=DEVICE)
    ws = w.abs().amax(1) / (127.0 if dtype == "int8" else 448.0)
    wq = (w / ws[:, None]).round().to(torch.int8) if dtype == "int8" else (w / ws[:, None]).to(torch.float8_e4m3fn)
    with qk.poison_outputs():
        with G.use_config(cfg):
            got = qk.w8a8_linear(x, wq, ws, dtype=dtype)
        with G.use_config(dict(_SPLIT_TILE, SPLIT_K=2)):
            want = qk.w8a8_linear(x, wq, ws, dtype=dtype)
    assert_bit_exact(got, want, "PDL false")
    assert rel_err(got, ref.w8a8_linear(x, wq, ws, dtype=dtype)) < 2e-3


def test_tile_kernel_split_k_refused_past_int32_workspace():
    """No split where split x M x N would reach 2**31 workspace elements (int32 offsets in the kernel)."""
    from qkernels.ops import gemm as G
    cfg = dict(_SPLIT_TILE, SPLIT_K=4)
    assert G._tile_plan(cfg, 16, 2 ** 27, 4096)[1] == 1
    assert G._tile_plan(cfg, 16, 2 ** 24, 4096)[1] == 4


WG_FALLBACK = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, GROUP_M=4, num_warps=4, num_stages=2)


@pytest.mark.parametrize("block", [(256, 128, 128, 4, 8), (128, 128, 64, 3, 4)], ids=str)
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (45, 72, 160), (0, 16, 32), (7, 9, 0),
                                   pytest.param(300, 200, 528, marks=gpu), pytest.param(513, 384, 4096, marks=gpu),
                                   # more tiles than SMs (programs take several), K of 1-3 steps (short ones fall back)
                                   pytest.param(2100, 2048, 64, marks=gpu), pytest.param(2100, 2048, 256, marks=gpu),
                                   pytest.param(2100, 2048, 384, marks=gpu)])
def test_int8_wg_path_gives_the_tile_kernels_bits(M, N, K, block):
    """The "wg" path (Gluon TMA + wgmma, Hopper) against the Triton tile kernel, which is its twin everywhere else:
    the exact int32 product, and the same epilogue bits (row / column / scalar scales, bias, fp16 / bf16 / fp32),
    tails in M, N and K included (TMA reads zeros past the tensor); calls it does not take (an activation, K not a
    multiple of 16, fewer k steps than STAGES - 1, a strided weight, no Hopper GPU, the interpreter) run the
    fallback config."""
    from qkernels.ops import gemm as G
    bm, bn, bk, stages, warps = block
    cfg = dict(path="wg", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, STAGES=stages, num_warps=warps,
               fallback=WG_FALLBACK)
    a, w = _i8(M, K), _i8(N, K)
    sa = torch.rand(M, device=DEVICE) * 0.01 + 1e-3
    sb = torch.rand(N, device=DEVICE) * 0.01 + 1e-3
    s0 = torch.tensor(0.004, device=DEVICE)
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    calls = [lambda: qk.int8_matmul(a, w.t()),
             lambda: qk.int8_matmul(a, w.t(), sa, sb),
             lambda: qk.int8_matmul(a, w.t(), s0, sb, 0.5, bias=bias, out_dtype=torch.bfloat16),
             lambda: qk.int8_matmul(a, w.t(), sa, 0.003, 2.0, out_dtype=torch.float32),
             lambda: qk.int8_matmul(a, w.t(), sa, sb, bias=bias, activation="silu")]
    for i, call in enumerate(calls):
        with G.use_config(cfg), qk.poison_outputs():
            got = call()
        with G.use_config(WG_FALLBACK):
            want = call()
        assert_bit_exact(got, want, f"call {i}")
    assert_bit_exact(qk.int8_matmul(a, w.t()), ref.int_mm(a, w.t()), "int32 product")


@gpu
def test_int8_wg_path_runs_on_hopper(monkeypatch):
    """On an sm_90 GPU a forced "wg" config runs the Gluon kernel (not its fallback): launched once, exact."""
    from qkernels.kernels import _gemm_wg
    from qkernels.ops import gemm as G
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wg kernel is Hopper's")
    cfg = dict(path="wg", BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, STAGES=4, num_warps=8,
               fallback=WG_FALLBACK)
    a, w = _i8(1000, 4096), _i8(1536, 4096)
    ran = []
    real = G.launch

    def spy(kernel, *args, **kw):
        ran.append(kernel)
        return real(kernel, *args, **kw)
    monkeypatch.setattr(G, "launch", spy)
    with G.use_config(cfg):
        got = qk.int8_matmul(a, w.t())
    assert ran == [_gemm_wg._i8_wg_kernel]
    assert_bit_exact(got, ref.int_mm(a, w.t()))


@NEEDS_FP8
@pytest.mark.parametrize("M", [1, 129 if ON_GPU else 17])       # the interpreter: an M tail at a fraction of the time
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp8_cublas_path_matches_reference_or_falls_back(M, out_dtype):
    """The "cublas" path (torch._scaled_mm, rowwise scales) gives the reference within fp32-accumulation rounding
    where it runs; calls it does not take (an activation, odd N, the interpreter) run the fallback config."""
    from qkernels.ops import gemm as G
    cfg = dict(path="cublas", fallback=dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, GROUP_M=4, num_warps=4, num_stages=1))
    for N, act in ((256, None), (255, None), (256, "silu")):
        K = 512
        a = (torch.randn(M, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
        w = (torch.randn(N, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
        sa, sb = torch.rand(M, device=DEVICE) + 0.1, torch.rand(N, device=DEVICE) + 0.1
        bias = torch.randn(N, device=DEVICE, dtype=out_dtype)
        with G.use_config(cfg), qk.poison_outputs():
            got = qk.fp8_matmul(a, w.t(), sa, sb, bias=bias, activation=act, out_dtype=out_dtype)
        want = ref.scaled_mm(a.float(), w.t().float(), sa, sb, 1.0, bias, act, torch.float64)
        assert rel_err(got, want) < (2e-3 if out_dtype == torch.float16 else 1e-2), (N, act)


@pytest.mark.parametrize("M", [0, 1, 17, 129])
def test_int4_exact(M):
    for N, K in [(40, 72), (255, 514)]:
        ap = qk.pack_int4(torch.randint(-8, 8, (M, K), dtype=torch.int8, device=DEVICE))
        bp = qk.pack_int4(torch.randint(-8, 8, (N, K), dtype=torch.int8, device=DEVICE))
        with qk.poison_outputs():
            got = qk.int4_matmul(ap, bp, K)
        assert_bit_exact(got, ref.int4_mm(ap, bp), "int4 product")


@NEEDS_FP8
@pytest.mark.parametrize("M", [1, 16, 33, 129])
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp8_vs_reference(M, out_dtype):
    N, K = 255, 513
    a = (torch.randn(M, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(N, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(M, device=DEVICE) + 0.1, torch.rand(N, device=DEVICE) + 0.1
    bias = torch.randn(N, device=DEVICE, dtype=out_dtype)
    got = qk.fp8_matmul(a, w.t(), sa, sb, bias=bias, activation="silu", out_dtype=out_dtype)
    want = ref.scaled_mm(a.float(), w.t().float(), sa, sb, 1.0, bias, "silu", torch.float64)
    assert rel_err(got, want) < (2e-3 if out_dtype == torch.float16 else 1e-2)


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 72), (17, 72), (2, 9, 72), pytest.param((128, 4096), marks=gpu)])
def test_w8a8_linear_matches_reference(shape, x_dtype, dtype):
    K = shape[-1]
    x = torch.randn(shape, device=DEVICE, dtype=x_dtype)
    lin = torch.nn.Linear(K, 40, device=DEVICE, dtype=x_dtype)
    ql = qk.QuantizedLinear.from_linear(lin, "w8a8" if dtype == "int8" else "w8a8-fp8")
    got = ql(x)
    want = ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, dtype)
    assert got.dtype == x_dtype and got.shape == (*shape[:-1], 40)
    assert rel_err(got, want) < (2e-3 if x_dtype == torch.float16 else 1e-2)
    # and close to the unquantized layer: the quantization error itself
    assert rel_err(got, lin(x)) < (0.02 if dtype == "int8" else 0.08)


def test_w8a8_static_activation_scale():
    x = torch.randn(9, 72, device=DEVICE, dtype=torch.float16)
    lin = torch.nn.Linear(72, 40, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin)
    s = torch.tensor(x.abs().max().item() / 127, device=DEVICE)
    got = qk.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, act_scale=s)
    assert rel_err(got, ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, s)) < 2e-3


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_w8a8_linear_prequantized_input(x_dtype, dtype):
    # codes + per-row scales from a fused norm give exactly what the float path computes from the
    # norm's float output (the norm kernel's quantization is quantize(y, fmt, "row") bit for bit)
    x = torch.randn(2, 9, 72, device=DEVICE, dtype=x_dtype)
    w = torch.rand(72, device=DEVICE, dtype=x_dtype) + 0.5
    lin = torch.nn.Linear(72, 40, device=DEVICE, dtype=x_dtype)
    ql = qk.QuantizedLinear.from_linear(lin, "w8a8" if dtype == "int8" else "w8a8-fp8")
    fmt = "int8" if dtype == "int8" else "fp8_e4m3"
    q, s = qk.rms_norm(x, w, quantize=fmt)
    got = qk.w8a8_linear(q, ql.weight, ql.weight_scale, ql.bias, dtype=dtype, x_scale=s, out_dtype=x_dtype)
    want = qk.w8a8_linear(qk.rms_norm(x, w), ql.weight, ql.weight_scale, ql.bias, dtype=dtype)
    assert got.shape == (2, 9, 40) and got.dtype == x_dtype
    assert_bit_exact(got, want)
    twin = ref.w8a8_linear(q, ql.weight, ql.weight_scale, ql.bias, dtype=dtype, x_scale=s, out_dtype=x_dtype)
    if dtype == "int8":      # exact int32 accumulation: bit for bit; fp8 accumulates in fp32 in another order
        assert_bit_exact(got, twin)
    else:
        assert rel_err(got, twin) < 1e-2
    assert_bit_exact(ql.forward_quantized(q, s, x_dtype), got)
    with pytest.raises(ValueError, match="pass their per-row scales as x_scale"):
        qk.w8a8_linear(q, ql.weight, ql.weight_scale, dtype=dtype)
    with pytest.raises(ValueError, match=r"x_scale must hold one fp32 scale per row of x \(M=18\)"):
        qk.w8a8_linear(q, ql.weight, ql.weight_scale, dtype=dtype, x_scale=s[:1])
    with pytest.raises(ValueError, match="x_scale goes with pre-quantized x"):
        qk.w8a8_linear(x, ql.weight, ql.weight_scale, dtype=dtype, x_scale=s)


def _launched(monkeypatch) -> list:
    """The kernels ops.gemm and ops.quant launch from now on (names, in order)."""
    from qkernels.ops import gemm as G, quant as Q
    names = []
    for mod in (G, Q):
        def spy(kernel, grid, *args, _launch=mod.launch, **kw):
            names.append(kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel))
            return _launch(kernel, grid, *args, **kw)
        monkeypatch.setattr(mod, "launch", spy)
    return names


def _w8a8_case(dtype, x_dtype, M, N, K):
    x = torch.randn(M, K, device=DEVICE, dtype=x_dtype) * 2
    lin = torch.nn.Linear(K, N, device=DEVICE, dtype=x_dtype)
    return x, qk.QuantizedLinear.from_linear(lin, "w8a8" if dtype == "int8" else "w8a8-fp8")


def _check_one_launch(got, two, want, dtype, x_dtype):
    """A one-launch W8A8 linear against quantize + GEMM (two) and the reference (want): int8 bit for bit (the same
    codes, scales and exact sums), fp8 within fp32 rounding of sums in another order."""
    if dtype == "int8":
        assert_bit_exact(got, two, "one launch vs quantize + GEMM")
        assert_bit_exact(got, want, "one launch vs reference")
    else:
        assert rel_err(got, want) < (2e-3 if x_dtype == torch.float16 else 1e-2)
        assert rel_err(got, two) < (2e-3 if x_dtype == torch.float16 else 1e-2)


# the W8A8 GEMV that quantizes x itself, forced (a GPU table takes it only where it measured faster)
_TILE = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1)
FUSED = dict(path="gemv", BLOCK_N=8, BLOCK_K=64, num_warps=2, SPLIT_K=2, MIN_PROGRAMS=1 << 30, fallback=_TILE)


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (1, 37, 200), (1, 44, 1000), (3, 45, 256)])
def test_w8a8_gemv_quantizes_x_itself(M, N, K, x_dtype, dtype, monkeypatch):
    """The one-launch W8A8 GEMV: x quantized per row inside the kernel with the quantize kernel's codes and scale,
    so int8 gives the bits of quantize + GEMM and of the reference (fp8: fp32 sums in another order)."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case(dtype, x_dtype, M, N, K)
    x[:, 5] = -60.0          # an outlier sets each row's scale
    launched = _launched(monkeypatch)
    with G.use_config(FUSED), qk.poison_outputs():
        got = ql(x)
    assert launched == ["_gemv8_kernel"]
    launched.clear()
    with G.use_config(_TILE), qk.poison_outputs():          # quantize kernel, then the tile GEMM
        two = ql(x)
    assert launched == ["_quantize_segments_kernel", "_scaled_mm_kernel"]
    want = ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, dtype)
    _check_one_launch(got, two, want, dtype, x_dtype)


@pytest.mark.parametrize("row", ["zeros", "nan_inf", "tiny"])
def test_w8a8_gemv_special_rows(row):
    """The in-kernel quantization on rows the quantize kernel has rules for: all zeros (scale 1), NaN / inf
    (NaN codes 0, inf saturates, the scale from the finite values) and subnormal-sized values (scale floor)."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case("int8", torch.float16, 1, 24, 128)
    if row == "zeros":
        x.zero_()
    elif row == "nan_inf":
        x[0, 3], x[0, 70], x[0, 71] = float("nan"), float("inf"), -float("inf")
    else:
        x.mul_(1e-6)
    with G.use_config(FUSED):
        got = ql(x)
    assert_bit_exact(got, ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, "int8"))


def test_w8a8_gemv_other_calls_quantize_first(monkeypatch):
    """Calls the one-launch GEMV does not take (K not a multiple of 4, a strided row) quantize first; a bias and a
    python w_scale are in its epilogue; the tables send M above their GEMV bucket to quantize + GEMM."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case("int8", torch.float16, 1, 24, 130)
    launched = _launched(monkeypatch)
    with G.use_config(FUSED):
        got = ql(x)
    assert launched == ["_quantize_segments_kernel", "_scaled_mm_kernel"]      # (nor does the 8-bit GEMV)
    assert_bit_exact(got, ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, "int8"))
    x, ql = _w8a8_case("int8", torch.float16, 1, 24, 256)
    strided = torch.randn(1, 512, device=DEVICE, dtype=torch.float16)[:, ::2]
    launched.clear()
    with G.use_config(FUSED):
        got = ql(strided)
        assert launched == ["_quantize_segments_kernel", "_gemv8_kernel"]
        assert_bit_exact(got, ref.w8a8_linear(strided, ql.weight, ql.weight_scale, ql.bias, None, "int8"))
        launched.clear()
        got = qk.w8a8_linear(x, ql.weight, 0.01, bias=ql.bias)
        assert launched == ["_gemv8_kernel"]
    assert_bit_exact(got, ref.w8a8_linear(x, ql.weight, torch.tensor(0.01), ql.bias, None, "int8"))
    launched.clear()
    x3 = torch.randn(3, 256, device=DEVICE, dtype=torch.float16)
    got = ql(x3)
    assert launched[0] == "_quantize_segments_kernel" and len(launched) == 2
    assert_bit_exact(got, ref.w8a8_linear(x3, ql.weight, ql.weight_scale, ql.bias, None, "int8"))


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("N,K", [(4096, 4096), (14336, 4096), (4096, 14336), (1024, 4096)])
@pytest.mark.parametrize("cfg", ["table", "fused"])
@gpu
def test_w8a8_decode_real_sizes(cfg, N, K, dtype):
    """W8A8 at M = 1 on the decode shapes, as the shipped table runs it and forced through the one-launch GEMV
    with a tuner candidate's tiles (split-K and all), against the reference; and replayed in a CUDA graph."""
    import contextlib
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case(dtype, torch.float16, 1, N, K)
    scope = G.use_config(dict(FUSED, BLOCK_N=16, BLOCK_K=1024, num_warps=4, SPLIT_K=2, MIN_PROGRAMS=512)) \
        if cfg == "fused" else contextlib.nullcontext()
    with scope:
        with qk.poison_outputs():
            got = ql(x)
        replayed = graph_replay(lambda: ql(x))
    want = ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, dtype)
    if dtype == "int8":
        assert_bit_exact(got, want)
    else:
        assert rel_err(got, want) < 2e-3
    assert_bit_exact(replayed, got, "graph replay")


# the tensor-core GEMV (Gluon, GPUs only): two 16-row tiles per warp, 8 words (128 k) per step, K split 4 ways
_GVT = dict(path="gvt", TILES=2, WPT=8, num_warps=1, SPLIT_K=4, MIN_PROGRAMS=1 << 30, fallback=_TILE)


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("M,N,K", [(1, 40, 64), (1, 300, 1024), (3, 45, 320), (8, 64, 192), (9, 37, 256),
                                   (16, 96, 512), (20, 72, 128)])
@pytest.mark.parametrize("cfg", [_GVT, dict(_GVT, TILES=4, WPT=4, num_warps=2, SPLIT_K=1), dict(_GVT, WPT=16)],
                         ids=["split4", "two-warps", "wpt16"])
@gpu
def test_w8a8_gvt_quantizes_x_itself(cfg, M, N, K, x_dtype, dtype, monkeypatch):
    """The one-launch tensor-core W8A8 GEMV: x quantized per row inside the kernel with the quantize kernel's codes
    and scales, so int8 gives the bits of quantize + GEMM and of the reference (fp8: fp32 sums in another order);
    rows and columns past M / N, K past the last whole step (EVEN_K false), split-K, two x tiles (M > 8), more
    programs along M (M > 16), a bias."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case(dtype, x_dtype, M, N, K)
    x[:, 5] = -60.0          # an outlier sets each row's scale
    launched = _launched(monkeypatch)
    with G.use_config(cfg), qk.poison_outputs():
        got = ql(x)
        again = ql(x)
    assert launched == ["_w8a8_gvt_kernel"] * 2
    with G.use_config(_TILE):          # quantize kernel, then the tile GEMM
        two = ql(x)
    want = ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, dtype)
    _check_one_launch(got, two, want, dtype, x_dtype)
    assert_bit_exact(again, got, "second call (split-K partials added in slice order)")


@pytest.mark.parametrize("dtype", ["int8", pytest.param("fp8", marks=NEEDS_FP8)])
@pytest.mark.parametrize("row", ["zeros", "nan_inf", "tiny"])
@gpu
def test_w8a8_gvt_special_rows(row, dtype):
    """The tensor-core GEMV's quantization on rows the quantize kernel has rules for (as
    test_w8a8_gemv_special_rows for the 8-bit GEMV): the same codes and scales, so int8 gives the reference's bits
    and fp8 its NaN pattern and values."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case(dtype, torch.float16, 2, 48, 256)
    if row == "zeros":
        x[1].zero_()
    elif row == "nan_inf":
        x[0, 3], x[0, 70], x[0, 71] = float("nan"), float("inf"), -float("inf")
    else:
        x[1].mul_(1e-6)
    with G.use_config(_GVT):
        got = ql(x)
    want = ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, dtype)
    if dtype == "int8":
        assert_bit_exact(got, want)
    else:
        assert torch.equal(got.isnan(), want.isnan())
        assert rel_err(torch.nan_to_num(got[1]), torch.nan_to_num(want[1])) < 2e-3


@pytest.mark.parametrize("M", [1, 5, 16])
@gpu
def test_gvt_on_codes_gives_the_tile_kernels_bits(M, monkeypatch):
    """The tensor-core GEMV on pre-quantized x (int8 / fp8 codes with per-row scales): int8, the tile kernel's
    bits (the same exact sums and fp32 epilogue); fp8 within fp32 rounding of the reference. A call it does not
    take (an activation) runs the config's fallback."""
    from qkernels.ops import gemm as G
    N, K = 72, 320
    a, w = _i8(M, K), _i8(N, K)
    sa, sb = torch.rand(M, device=DEVICE) * 0.01, torch.rand(N, device=DEVICE) * 0.01     # sums within fp16
    bias = torch.randn(N, device=DEVICE, dtype=torch.float16)
    launched = _launched(monkeypatch)
    with G.use_config(_GVT), qk.poison_outputs():
        got = qk.int8_matmul(a, w.t(), sa, sb, 0.5, bias=bias, out_dtype=torch.float16)
        assert launched == ["_w8a8_gvt_kernel"]
        launched.clear()
        got_act = qk.int8_matmul(a, w.t(), sa, sb, activation="silu", out_dtype=torch.float16)
        assert launched == ["_scaled_mm_kernel"]
    with G.use_config(_TILE):
        want = qk.int8_matmul(a, w.t(), sa, sb, 0.5, bias=bias, out_dtype=torch.float16)
        want_act = qk.int8_matmul(a, w.t(), sa, sb, activation="silu", out_dtype=torch.float16)
    assert_bit_exact(got, want, "int8 codes")
    assert_bit_exact(got_act, want_act, "int8 codes, the fallback")
    assert rel_err(got, ref.scaled_mm(a, w.t(), sa, sb, 0.5, bias, None, torch.float64)) < 1e-3
    if torch.cuda.get_device_capability() < (8, 9):
        return
    af = (torch.randn(M, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    wf = (torch.randn(N, K, device=DEVICE) * 4).to(torch.float8_e4m3fn)
    launched.clear()
    with G.use_config(_GVT), qk.poison_outputs():
        gotf = qk.fp8_matmul(af, wf.t(), sa, sb, bias=bias, out_dtype=torch.float16)
    assert launched == ["_w8a8_gvt_kernel"]
    wantf = ref.scaled_mm(af.float(), wf.t().float(), sa, sb, 1.0, bias, None, torch.float64)
    assert rel_err(gotf, wantf) < 2e-3


def test_gvt_plan():
    """The gvt launch plan: 16-row tiles, two x tiles past M = 8, K split into slices of whole steps (one step each
    at most), the x rows whose scales a program works out; a malformed config is a clear error."""
    from qkernels.ops import gemm as G
    cfg = dict(path="gvt", TILES=1, WPT=16, num_warps=1, SPLIT_K=16, MIN_PROGRAMS=1 << 30)
    grid, split, cx = G._gvt_plan(cfg, 1, 1024, 4096, "fp8", True)
    assert grid == (64, 16, 1) and split == 16 and cx["EVEN_K"] and cx["MT"] == 1 and cx["XR"] == 1 and cx["FP8"]
    grid, split, cx = G._gvt_plan(dict(cfg, TILES=2, num_warps=2), 20, 72, 320, "int8", False)
    assert grid == (3, 2, 2) and split == 2 and not cx["EVEN_K"] and cx["MT"] == 2 and cx["XR"] == 16
    with pytest.raises(RuntimeError, match="WPT in"):
        G._gvt_plan(dict(cfg, WPT=3), 1, 64, 64, "int8", True)


@pytest.mark.parametrize("K", [200, 256])
def test_gvt_config_runs_its_fallback_where_its_kernel_does_not(K, monkeypatch):
    """A "gvt" config on a call its kernel does not take (K not a multiple of 64; any call under the interpreter,
    Gluon having no CPU twin) runs its fallback config: the W8A8 linear quantizes x then runs the tile GEMM."""
    from qkernels.ops import gemm as G
    x, ql = _w8a8_case("int8", torch.float16, 2, 24, K)
    launched = _launched(monkeypatch)
    with G.use_config(_GVT):
        got = ql(x)
    if K % 64 or not ON_GPU:
        assert launched == ["_quantize_segments_kernel", "_scaled_mm_kernel"]
    assert_bit_exact(got, ref.w8a8_linear(x, ql.weight, ql.weight_scale, ql.bias, None, "int8"))


def test_quantized_linear_state_dict_round_trip():
    lin = torch.nn.Linear(64, 32, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin)
    sd = ql.state_dict()
    assert sd["weight"].dtype == torch.int8 and sd["weight_scale"].shape == (32,)
    fresh = qk.QuantizedLinear(64, 32, scheme="w8a8", device=DEVICE)
    fresh.load_state_dict(sd)
    x = torch.randn(5, 64, device=DEVICE, dtype=torch.float16)
    assert_bit_exact(fresh(x), ql(x))


@pytest.mark.parametrize("call,exc,match", [
    (lambda a, w: qk.int8_matmul(a.float(), w.t()), TypeError, r"a must have dtype in \(int8\), got float32"),
    (lambda a, w: qk.int8_matmul(a, w), ValueError, r"b must have K=72 rows to match a's last dim, got b.shape=\(40, 72\)"),
    (lambda a, w: qk.int8_matmul(a, w.t()[None]), ValueError, r"b must be 2-D \[K, N\], got shape \(1, 72, 40\)"),
    (lambda a, w: qk.int8_matmul(a, w.t(), torch.ones(3, device=DEVICE)), ValueError,
     r"scale_a must be a scalar or have 17 elements .*got shape \(3,\)"),
    (lambda a, w: qk.int8_matmul(a, w.t(), None, torch.ones(39, device=DEVICE)), ValueError,
     r"scale_b must be a scalar or have 40 elements .*got shape \(39,\)"),
    (lambda a, w: qk.int8_matmul(a, w.t(), bias=torch.ones(41, device=DEVICE)), ValueError,
     r"bias must have shape \(40,\), got \(41,\)"),
    (lambda a, w: qk.int8_matmul(a, w.t(), 1.0, activation="tanh"), ValueError, r"activation must be one of"),
    (lambda a, w: qk.int8_matmul(a, w.t(), out_dtype=torch.int8), TypeError, r"out_dtype must be one of"),
    (lambda a, w: qk.int4_matmul(qk.pack_int4(a), qk.pack_int4(w), 70), ValueError,
     r"a_packed's last dim must be k/2=35, got 36"),
    (lambda a, w: qk.int4_matmul(qk.pack_int4(a), qk.pack_int4(w), 71), ValueError, r"k must be a non-negative even"),
    (lambda a, w: qk.w8a8_linear(torch.randn(3, 72, device=DEVICE), w, torch.ones(40, device=DEVICE)), TypeError,
     r"x must have dtype in \(float16, bfloat16\), got float32"),
    (lambda a, w: qk.w8a8_linear(torch.randn(3, 64, device=DEVICE).half(), w, torch.ones(40, device=DEVICE)),
     ValueError, r"w_q must be \[N, K=64\], got shape \(40, 72\)"),
    (lambda a, w: qk.w8a8_linear(torch.randn(3, 72, device=DEVICE).half(), w, torch.ones(40, device=DEVICE),
                                 dtype="fp8"), TypeError, r"w_q must have dtype in \(float8_e4m3fn\), got int8"),
])
def test_bad_inputs(call, exc, match):
    a, w = _i8(17, 72), _i8(40, 72)
    with pytest.raises(exc, match=match):
        call(a, w)


@gpu
def test_gemm_mixed_devices():
    a, w = _i8(4, 64), _i8(8, 64)
    with pytest.raises(RuntimeError, match=r"b must be on the same device as a"):
        qk.int8_matmul(a, w.t().cpu())


@given(m=st.integers(0, 40), n=st.integers(1, 70), k=st.integers(1, 140))
def test_property_int8_exact(m, n, k):
    a, w = _i8(m, k), _i8(n, k)
    assert_bit_exact(qk.int8_matmul(a, w.t()), ref.int_mm(a, w.t()))


def test_opcheck():
    from qkernels.ops import gemm as G
    a, w = _i8(5, 64), _i8(24, 64)
    sa, sb = torch.rand(5, device=DEVICE), torch.rand(24, device=DEVICE)
    torch.library.opcheck(G._scaled_mm_op, (a, w.t(), None, None, 1.0, None, "", None, "int8"))
    torch.library.opcheck(G._scaled_mm_op, (a, w.t(), sa, sb, 0.5, None, "relu", torch.float16, "int8"))
    ap, bp = qk.pack_int4(a), qk.pack_int4(w)
    torch.library.opcheck(G._scaled_mm_op, (ap, bp.t(), None, None, 1.0, None, "", None, "int4"))
    x = torch.randn(5, 64, device=DEVICE, dtype=torch.float16)
    bias = torch.randn(24, device=DEVICE, dtype=torch.float16)
    for rows in (x[:1], x):      # the one-launch GEMV, quantize + GEMM
        torch.library.opcheck(G._w8a8_dynamic_op, (rows, w, sb, 1.0, None, "int8"))
        torch.library.opcheck(G._w8a8_dynamic_op, (rows, w, sb, 0.5, bias, "int8"))


def test_torch_compile_fullgraph():
    lin = torch.nn.Linear(64, 48, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin)
    compiled = torch.compile(ql, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    for M in (7, 1):         # quantize + GEMM; the one-launch GEMV
        x = torch.randn(M, 64, device=DEVICE, dtype=torch.float16)
        assert_bit_exact(compiled(x), ql(x))


@gpu
def test_cuda_graph_replay():
    lin = torch.nn.Linear(256, 512, device=DEVICE, dtype=torch.float16)
    ql = qk.QuantizedLinear.from_linear(lin)
    x = torch.randn(16, 256, device=DEVICE, dtype=torch.float16)
    want = ql(x)
    assert_bit_exact(graph_replay(lambda: ql(x)), want)

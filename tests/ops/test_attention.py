"""Rotary embedding + KV-cache write and decode attention against their reference twins."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import qkernels as qk
from qkernels import reference as ref
from qkernels.ops import attention as A
from qkernels.ops.attention import decode_attention, qkv_rope_cache

from ..conftest import DEVICE as DEV


def _tables(D, S, theta=10000.0):
    return ref.rope_tables(ref.rope_inv_freq(D, theta), S)


@pytest.mark.parametrize("B,T,H,HKV,D", [(1, 1, 4, 2, 16), (2, 5, 4, 4, 32), (3, 3, 6, 2, 64), (1, 7, 8, 1, 128),
                                         (2, 300, 4, 2, 32)])    # prefill sizes: several tokens per program
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_qkv_rope_cache_matches_reference(B, T, H, HKV, D, norm, dtype):
    S = max(24, T + 3)
    g = torch.Generator().manual_seed(B * 100 + T * 10 + H + D)
    qkv = torch.randn(B, T, (H + 2 * HKV) * D, generator=g).to(DEV, dtype)
    pos = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)]).to(DEV)   # any order, no repeats
    cos, sin = (t.to(DEV) for t in _tables(D, S))
    qn = (torch.rand(D, generator=g) + 0.5).to(DEV, dtype) if norm else None
    kn = (torch.rand(D, generator=g) + 0.5).to(DEV, dtype) if norm else None
    kc, vc = torch.full((B, HKV, S, D), 7.0, dtype=dtype, device=DEV), torch.full((B, HKV, S, D), 7.0, dtype=dtype,
                                                                                 device=DEV)
    kr, vr = kc.clone(), vc.clone()
    q = qkv_rope_cache(qkv, pos, cos, sin, kc, vc, H, HKV, q_norm=qn, k_norm=kn, eps=1e-6)
    qr = ref.qkv_rope_cache(qkv, pos, cos, sin, kr, vr, H, HKV, q_norm=qn, k_norm=kn, eps=1e-6)
    # fp32: the GPU may contract x1 * cos - x2 * sin into an FMA (one rounding fewer than the reference)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    torch.testing.assert_close(q, qr, **tol)
    torch.testing.assert_close(kc, kr, **tol)          # untouched slots kept their 7.0
    torch.testing.assert_close(vc, vr, rtol=0, atol=0)  # v is a copy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_rope_cache_rotates_by_rope_positions_writes_at_positions(dtype):
    """rope_positions: each token rotated by its own row of the tables (here a table of one row per token, as
    multimodal positions are built), written to the cache at its position; the same as rotating with tables whose
    rows at the positions are those rows."""
    B, T, H, HKV, D, S = 2, 5, 4, 2, 32, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, T, (H + 2 * HKV) * D, generator=g).to(DEV, dtype)
    pos = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)]).to(DEV)
    rows = torch.randn(B * T, D // 2, generator=g).to(DEV)        # any angles, one row per token
    cos, sin = rows.cos().contiguous(), rows.sin().contiguous()
    rpos = torch.arange(B * T, device=DEV).view(B, T)
    kc = torch.full((B, HKV, S, D), 7.0, dtype=dtype, device=DEV)
    vc = kc.clone()
    kr, vr = kc.clone(), vc.clone()
    q = qkv_rope_cache(qkv, pos, cos, sin, kc, vc, H, HKV, rope_positions=rpos)
    # the reference with tables laid out by position instead: row pos[b, t] holds token (b, t)'s angles (per
    # sequence, as the positions of one sequence do not repeat)
    for b in range(B):
        cb, sb = torch.zeros(S, D // 2, device=DEV), torch.zeros(S, D // 2, device=DEV)
        cb[pos[b]], sb[pos[b]] = cos[rpos[b]], sin[rpos[b]]
        qr = ref.qkv_rope_cache(qkv[b:b + 1], pos[b:b + 1], cb, sb, kr[b:b + 1], vr[b:b + 1], H, HKV)
        tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
        torch.testing.assert_close(q[b:b + 1], qr, **tol)
    torch.testing.assert_close(kc, kr, **tol)
    torch.testing.assert_close(vc, vr, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"rope_positions must have shape \(2, 5\), got \(2, 4\)"):
        qkv_rope_cache(qkv, pos, cos, sin, kc, vc, H, HKV, rope_positions=rpos[:, :4])


@pytest.mark.parametrize("B,H,HKV,D,S", [(1, 4, 1, 64, 40), (2, 8, 2, 128, 33), (3, 6, 6, 32, 17), (2, 32, 8, 64, 70),
                                         (2, 4, 2, 16, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_attention_matches_reference(B, H, HKV, D, S, dtype):
    g = torch.Generator().manual_seed(B + H + D + S)
    q = torch.randn(B, H, D, generator=g).to(DEV, dtype)
    kc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    vc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    lengths = torch.tensor([1, S, S // 2, 3][:B], dtype=torch.int32, device=DEV)    # length 1 and a full cache
    with qk.poison_outputs():     # unwritten outputs would show as NaN
        out = decode_attention(q, kc, vc, lengths)
    want = ref.decode_attention(q, kc, vc, lengths, D ** -0.5)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else \
        dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=4e-3, atol=4e-3)
    torch.testing.assert_close(out, want, **tol)
    # the cache beyond each length is never read: poisoning it changes nothing
    kc2, vc2 = kc.clone(), vc.clone()
    for b in range(B):
        kc2[b, :, int(lengths[b]):] = float("nan")
        vc2[b, :, int(lengths[b]):] = float("nan")
    torch.testing.assert_close(decode_attention(q, kc2, vc2, lengths), out, rtol=0, atol=0)


@pytest.mark.parametrize("H,HKV,D", [(8, 2, 128), (6, 3, 32), (4, 4, 64)])
def test_decode_attention_many_splits(monkeypatch, H, HKV, D):
    """One split per key tile of the cache (as a long cache at batch 1 takes on a GPU): a sequence's keys spread
    over as many as they fill (one tile each, or more once they outnumber the splits), the splits past them unused;
    the combine takes the used splits' log-sum-exps 16 at a time (here up to 40), whatever the other sequence of
    the batch uses."""
    S, block = 40 * 16, 16
    monkeypatch.setattr(A, "_splits", lambda B, n_kv, S_, block_s, waves, device: -(-S_ // block))
    g = torch.Generator().manual_seed(H + D)
    kc = torch.randn(2, HKV, S, D, generator=g).to(DEV, torch.float16)
    vc = torch.randn(2, HKV, S, D, generator=g).to(DEV, torch.float16)
    for lens in ([1, S], [block, block + 1], [S - 5, 3 * block]):
        q = torch.randn(2, H, D, generator=g).to(DEV, torch.float16)
        lengths = torch.tensor(lens, dtype=torch.int32, device=DEV)
        with qk.poison_outputs():
            out = decode_attention(q, kc, vc, lengths)
        torch.testing.assert_close(out, ref.decode_attention(q, kc, vc, lengths, D ** -0.5), rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_attention_one_split_writes_the_output_itself(monkeypatch, dtype):
    """One split per sequence and KV head (a large batch on a GPU: B x Hkv programs fill the waves): the first pass
    writes the output in q's dtype itself, without the combine, over any length (one key, one tile, several, the
    whole cache), prefetching or not, the same result as the reference's."""
    monkeypatch.setattr(A, "_splits", lambda B, n_kv, S_, block_s, waves, device: 1)
    g = torch.Generator().manual_seed(5)
    B, H, HKV, D, S = 5, 8, 2, 64, 70
    q = torch.randn(B, H, D, generator=g).to(DEV, dtype)
    kc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    vc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    lengths = torch.tensor([1, 16, 17, 40, S], dtype=torch.int32, device=DEV)
    want = ref.decode_attention(q, kc, vc, lengths, D ** -0.5)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else \
        dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=4e-3, atol=4e-3)
    for prefetch in (False, True):
        with qk.poison_outputs():
            out = decode_attention(q, kc, vc, lengths, prefetch=prefetch)
        assert out.dtype == dtype
        torch.testing.assert_close(out, want, **tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("len_dtype", [torch.int32, torch.int64])
def test_decode_attention_prefetch_gives_the_same_result(dtype, len_dtype):
    """prefetch=True (the first key tile's settled rows read before the PDL wait, the newest after it) changes
    nothing: the same bits as without it, the newest row taken wherever it falls (first tile or later, the first
    row, a split's last), lengths 1 and S included, as int32 and as int64 (the runtime's)."""
    g = torch.Generator().manual_seed(7)
    B, H, HKV, D, S = 6, 8, 2, 64, 70
    q = torch.randn(B, H, D, generator=g).to(DEV, dtype)
    kc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    vc = torch.randn(B, HKV, S, D, generator=g).to(DEV, dtype)
    lengths = torch.tensor([1, 2, 16, 17, 40, S], dtype=len_dtype, device=DEV)
    with qk.poison_outputs():
        fetched = decode_attention(q, kc, vc, lengths, prefetch=True)       # the interpreter's config: PREFETCH
    torch.testing.assert_close(fetched, decode_attention(q, kc, vc, lengths), rtol=0, atol=0)
    for block in (16, 32):          # the newest row in the first tile or a later one; a config without PREFETCH
        for early in (True, False):
            with A.use_config(dict(BLOCK_S=block, num_warps=4, num_stages=1, WAVES=1, PREFETCH=early)):
                torch.testing.assert_close(decode_attention(q, kc, vc, lengths, prefetch=True),
                                           decode_attention(q, kc, vc, lengths), rtol=0, atol=0)
    with pytest.raises(ValueError, match="prefetch must be a bool"):
        decode_attention(q, kc, vc, lengths, prefetch=1)


def test_decode_attention_under_a_forced_config():
    """use_config (what scripts/tune_attention.py times) reaches the kernel: 32-key tiles, one stage, two warps
    give the reference's result; a malformed config is refused by name."""
    g = torch.Generator().manual_seed(11)
    B, H, HKV, D, S = 2, 8, 2, 64, 70
    q = torch.randn(B, H, D, generator=g).to(DEV, torch.float16)
    kc = torch.randn(B, HKV, S, D, generator=g).to(DEV, torch.float16)
    vc = torch.randn(B, HKV, S, D, generator=g).to(DEV, torch.float16)
    lengths = torch.tensor([S, 33], dtype=torch.int32, device=DEV)
    with A.use_config(dict(BLOCK_S=32, num_warps=2, num_stages=1, WAVES=1, PREFETCH=False)), qk.poison_outputs():
        out = decode_attention(q, kc, vc, lengths)
    torch.testing.assert_close(out, ref.decode_attention(q, kc, vc, lengths, D ** -0.5), rtol=4e-3, atol=4e-3)
    for bad in (dict(BLOCK_S=24, num_warps=4, num_stages=1, WAVES=1, PREFETCH=False), dict(BLOCK_S=32, num_warps=4),
                dict(BLOCK_S=32, num_warps=4, num_stages=1, WAVES=1, PREFETCH=1),
                dict(BLOCK_S=32, num_warps=3, num_stages=1, WAVES=1, PREFETCH=False)):
        with pytest.raises(ValueError, match="cfg must be a decode-attention config"):
            A.use_config(bad)


def test_opcheck():
    """Schema, fake impl, mutation declaration (the caches) and autograd registration agree with the kernel."""
    B, T, H, HKV, D, S = 2, 3, 4, 2, 32, 16
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(B, T, (H + 2 * HKV) * D, generator=g).to(DEV, torch.float16)
    pos = torch.stack([torch.randperm(S, generator=g)[:T] for _ in range(B)]).to(DEV)
    cos, sin = (t.to(DEV) for t in _tables(D, S))
    kc = torch.randn(B, HKV, S, D, generator=g).to(DEV, torch.float16)
    vc = torch.randn(B, HKV, S, D, generator=g).to(DEV, torch.float16)
    for norm in (None, (torch.rand(D, generator=g) + 0.5).to(DEV, torch.float16)):
        torch.library.opcheck(A._qkv_rope_cache_op, (qkv, pos, pos, cos, sin, kc, vc, norm, norm, H, HKV, 1e-6))
    q = torch.randn(B, H, D, generator=g).to(DEV, torch.float16)
    lengths = torch.tensor([S, 5], dtype=torch.int32, device=DEV)
    for prefetch in (False, True):
        torch.library.opcheck(A._decode_attention_op, (q, kc, vc, lengths, D ** -0.5, prefetch))


def test_bad_inputs_are_named():
    q = torch.randn(1, 4, 16, device=DEV)
    kc = torch.randn(1, 3, 8, 16, device=DEV)
    with pytest.raises(ValueError, match="k_cache must be"):
        decode_attention(q, kc, kc, torch.ones(1, dtype=torch.int32, device=DEV))
    kc = torch.randn(1, 2, 8, 16, device=DEV)
    with pytest.raises(ValueError, match="lengths must have shape"):
        decode_attention(q, kc, kc, torch.ones(2, dtype=torch.int32, device=DEV))
    cos, sin = (t.to(DEV) for t in _tables(16, 8))
    with pytest.raises(ValueError, match="qkv's last dim"):
        qkv_rope_cache(torch.randn(1, 1, 100, device=DEV), torch.zeros(1, 1, dtype=torch.int64, device=DEV), cos,
                       sin, kc, kc.clone(), 4, 2)
    with pytest.raises(ValueError, match="cos must be"):
        qkv_rope_cache(torch.randn(1, 1, 128, device=DEV), torch.zeros(1, 1, dtype=torch.int64, device=DEV),
                       cos[:4], sin[:4], kc, kc.clone(), 4, 2)


@pytest.mark.skipif(not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists(),
                    reason="Triton's CUDA tools are not installed")
def test_decode_attention_kernel_compiles_for_hopper():
    """The split kernel (PREFETCH on and off; DIRECT) and the combine build offline for sm_90 (no GPU: the
    interpreter does not type-check loops) with int32 and int64 lengths: a loop-carried tile whose index type
    follows the lengths' once compiled under the interpreter and failed on the GPU. Under PDL the split kernel lets
    the next kernel start early except in DIRECT (its PTX)."""
    code = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qkernels.kernels._attention import _decode_attention_split_kernel as k, _decode_attention_combine_kernel as k2
for lens in ("*i32", "*i64"):
    for prefetch, direct in ((False, False), (True, False), (True, True)):
        part = "*fp16" if direct else "*fp32"
        types = dict(q_ptr="*fp16", k_ptr="*fp16", v_ptr="*fp16", len_ptr=lens, o_part_ptr=part, lse_ptr=part,
                     scale="fp32")
        cx = dict(N_KV=8, GROUP=4, BLOCK_G=16, D=128, BLOCK_D=128, BLOCK_S=64, DOT_PRECISION="tf32",
                  PREFETCH=prefetch, PDL=True, DIRECT=direct)
        sig = {n: "constexpr" if n in cx else types.get(n, "i32") for n in k.arg_names}
        c = triton.compile(ASTSource(k, sig, cx, {}), target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=4, num_stages=2))
        ptx = c.asm["ptx"]
        # every grid waits for the kernel before; the one-split grid (several waves) lets the next start only as it
        # exits (_pdl_wait not EARLY), the split grids early
        assert "griddepcontrol.wait" in ptx
        assert ("griddepcontrol.launch_dependents" in ptx) == (not direct), (prefetch, direct)
        print(lens, prefetch, direct, "built")
    types = dict(o_part_ptr="*fp32", lse_ptr="*fp32", len_ptr=lens, out_ptr="*fp16")
    cx = dict(D=128, BLOCK_D=128, BLOCK_S=64, BLOCK_SPLITS=16, PDL=True)
    sig = {n: "constexpr" if n in cx else types.get(n, "i32") for n in k2.arg_names}
    triton.compile(ASTSource(k2, sig, cx, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    print(lens, "combine built")
"""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    env.pop("TRITON_INTERPRET", None)       # a real compile
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.stdout.splitlines()) == 8, run.stdout

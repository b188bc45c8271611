"""Readers of a 4-bit weight in the decode chain: how many bytes per second do kernels that only READ the codes of an
N x 4096 weight (N x 2048 bytes: no scales, no dequantization, no products) move, timed as `bench decode-gemv` times a
provider (one CUDA graph calling it on copies spanning >= 256 MB), against fp16 `F.linear` on the N x 4096 fp16
weight (4x the bytes) in the same run? The ratio is what these load schemes reach on that shape, a yardstick for a
W4A16 GEMV's "share of fp16's bytes/s", not a bound: a GEMV with another grid can read faster (docs/design.md, "The
M = 1 GEMV's loads").

Readers (one program per block of rows, each reading its rows whole, a step of ROWS x SEG bytes at a time):
  - `ld`: per-thread loads, the next step in registers a step ahead (how our GEMVs load), 16 rows x 128 bytes per
    one-warp program; `ld+pdl` the same launched with programmatic dependent launch, the first step loaded before
    griddepcontrol.wait (as our kernels are launched);
  - `tma`: scripts/probe_tma_stream.py's persistent ring of TMA boxes (one mbarrier per stage, 64 x 256-byte boxes,
    8 stages, 4 warps, two CTAs per SM): the bulk-copy engine cuBLAS's GEMV uses.

--patterns: instead, one weight (28672 x 2048 bytes) read by `ld` in other steps (ROWS x SEG bytes, warps), row-major
or tiled (each program's step contiguous, as a pre-shuffled layout would store it), with WORK dependent integer ops
per word on top; then through Triton's pipeliner (num_stages 1-8: plain loads, and TMA descriptor loads).

Usage: PYTHONPATH=src python3 scripts/probe_decode_ceiling.py [--rows 1024 4096 ...] [--patterns]
       (a GPU; TMA: Hopper)
"""
import argparse
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from qkernels.bench.decode_gemv import chain_copies, chain_us

ROWS_DEFAULT = [1024, 4096, 6144, 14336, 28672, 57344, 128256]


@triton.jit
def _work(v, WORK: tl.constexpr):
    for _ in tl.static_range(WORK):
        v = v * 1664525 + 1013904223
    return v


@triton.jit
def _read_kernel(w_ptr, out_ptr, KB: tl.constexpr, ROWS: tl.constexpr, SEG: tl.constexpr, PDL: tl.constexpr,
                 TILED: tl.constexpr = False, WORK: tl.constexpr = 0):
    """Rows [pid ROWS, (pid + 1) ROWS) of a [N, KB] byte matrix read as int32 words, SEG bytes per row and step, the
    next step's words loaded a step ahead (none past the last step: a load in flight holds the program's exit up);
    an XOR of them stored (so no load is dead). TILED: the program's bytes stored step after step ([KB / SEG, ROWS,
    SEG] each); WORK: dependent multiply-adds per word."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, SEG // 4)[None, :]
    w32 = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    if TILED:
        p = w32 + pid.to(tl.int64) * (ROWS * KB // 4) + r * (SEG // 4) + c
        ss: tl.constexpr = ROWS * SEG // 4
    else:
        p = w32 + (pid.to(tl.int64) * ROWS + r) * (KB // 4) + c
        ss: tl.constexpr = SEG // 4
    nxt = tl.load(p, cache_modifier=".cg")
    if PDL:          # the first step is in flight before the previous kernel has ended
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros([ROWS, SEG // 4], tl.int32)
    for s in range(1, KB // SEG):
        cur = nxt
        nxt = tl.load(p + s * ss, cache_modifier=".cg")
        acc ^= _work(cur, WORK)
    acc ^= _work(nxt, WORK)
    tl.store(out_ptr + pid * ROWS * (SEG // 4) + r * (SEG // 4) + c, acc)


@triton.jit
def _pipelined_kernel(w_ptr, out_ptr, KW: tl.constexpr, ROWS: tl.constexpr, SEGW: tl.constexpr):
    """`ld` written as a plain loop (Triton's pipeliner prefetches num_stages - 1 steps through shared memory)."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, SEGW)[None, :]
    p = w_ptr + (pid.to(tl.int64) * ROWS + r) * KW + c
    acc = tl.zeros([ROWS, SEGW], tl.int32)
    for k in range(0, KW, SEGW):
        acc ^= tl.load(p + k, cache_modifier=".cg")
    tl.store(out_ptr + pid * ROWS * SEGW + r * SEGW + c, acc)


@triton.jit
def _descriptor_kernel(desc, out_ptr, KW: tl.constexpr, ROWS: tl.constexpr, SEGW: tl.constexpr):
    """The same through a TMA descriptor ([ROWS, SEGW] int32 boxes; pipelined with num_stages)."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, SEGW)[None, :]
    acc = tl.zeros([ROWS, SEGW], tl.int32)
    for k in range(0, KW, SEGW):
        acc ^= desc.load([pid * ROWS, k])
    tl.store(out_ptr + pid * ROWS * SEGW + r * SEGW + c, acc)


def patterns(dev):
    from triton.tools.tensor_descriptor import TensorDescriptor
    n, kb = 28672, 2048
    ws = [torch.randint(0, 256, (n, kb), device=dev, dtype=torch.uint8) for _ in range(chain_copies(n * kb))]
    out = torch.empty(n * 512, device=dev, dtype=torch.int32)
    gbps = lambda calls: n * kb / chain_us(calls, True) / 1e3       # noqa: E731
    print(f"{n} x {kb} bytes, GB/s in the decode chain: ld by step (rows x bytes, warps), row-major / tiled")
    for work in (0, 8, 16):
        for rows, seg, warps in ((16, 128, 1), (16, 256, 1), (16, 512, 1), (8, 512, 1), (16, 2048, 1), (8, 256, 1),
                                 (32, 256, 2), (64, 128, 4)):
            got = [gbps([lambda w=w: _read_kernel[(n // rows,)](w, out, kb, rows, seg, False, tiled, work,
                                                                 num_warps=warps) for w in ws]) for tiled in (0, 1)]
            print(f"work {work:2d} rows {rows:3d} x {seg:5d} B, {warps} warps: {got[0]:6.0f} / {got[1]:6.0f}",
                  flush=True)
    print("Triton's pipeliner, num_stages 1 3 5 8 (plain loads), 3 5 8 (TMA descriptor loads)")
    wi = [w.view(torch.int32) for w in ws]
    for rows, segw, warps in ((16, 32, 1), (16, 64, 2), (32, 32, 2), (64, 32, 4), (64, 64, 4), (128, 32, 4),
                              (128, 64, 8)):
        ld = [gbps([lambda w=w: _pipelined_kernel[(n // rows,)](w, out, kb // 4, rows, segw, num_warps=warps,
                                                                 num_stages=s) for w in wi]) for s in (1, 3, 5, 8)]
        descs = [TensorDescriptor.from_tensor(w, [rows, segw]) for w in wi]
        tma = [gbps([lambda d=d: _descriptor_kernel[(n // rows,)](d, out, kb // 4, rows, segw, num_warps=warps,
                                                                   num_stages=s) for d in descs]) for s in (3, 5, 8)]
        print(f"rows {rows:3d} x {4 * segw:4d} B, {warps} warps: ld " + " ".join(f"{v:5.0f}" for v in ld)
              + "  tma " + " ".join(f"{v:5.0f}" for v in tma), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS_DEFAULT, help="N of the N x 4096 weights")
    ap.add_argument("--patterns", action="store_true", help="load patterns on one weight instead (see above)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.patterns:
        return patterns(dev)
    hopper = torch.cuda.get_device_capability(dev) >= (9, 0)
    if hopper:
        sys.path.insert(0, os.path.dirname(__file__))
        from probe_tma_stream import _stream_kernel
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.randn(1, 4096, device=dev, dtype=torch.float16)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, Triton {triton.__version__}: GB/s in the "
          f"decode chain; reads of N x 2048 bytes (the 4-bit codes of N x 4096), fp16 F.linear of N x 4096")
    print(f"{'N':>7} {'fp16':>6} {'ld':>6} {'ld+pdl':>6} {'tma':>6}   best read / fp16")
    for n in args.rows:
        nb = n * 2048
        ws = [torch.randint(0, 256, (n, 2048), device=dev, dtype=torch.uint8) for _ in range(chain_copies(nb))]
        out = torch.empty(n * 32 + 8 * sms, device=dev, dtype=torch.int32)
        gbps = {}
        for name, pdl in (("ld", False), ("ld+pdl", True)):
            calls = [lambda w=w: _read_kernel[(n // 16,)](w, out, 2048, 16, 128, pdl, num_warps=1, launch_pdl=pdl)
                     for w in ws]
            gbps[name] = nb / chain_us(calls, True) / 1e3
        if hopper:
            descs = [TensorDescriptor.from_tensor(w, [64, 256], gl.NVMMASharedLayout(0, 8, rank=2)) for w in ws]
            n_tiles = (n // 64) * 8
            calls = [lambda d=d: _stream_kernel[(2 * sms,)](d, out, n_tiles, 8, STAGES=8, CONSUME=False, num_warps=4)
                     for d in descs]
            gbps["tma"] = nb / chain_us(calls, True) / 1e3
        del ws
        wf = [torch.randn(n, 4096, device=dev, dtype=torch.float16) for _ in range(chain_copies(n * 8192))]
        fp16 = n * 8192 / chain_us([lambda w=w: torch.nn.functional.linear(x, w) for w in wf], True) / 1e3
        del wf
        best = max(gbps.values())
        print(f"{n:7d} {fp16:6.0f} {gbps['ld']:6.0f} {gbps['ld+pdl']:6.0f} {gbps.get('tma', float('nan')):6.0f}"
              f"   {best / fp16:.2f}", flush=True)


if __name__ == "__main__":
    main()

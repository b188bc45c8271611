"""Read-bandwidth probe for weight-only access patterns (no math): how fast can a kernel stream a 4-bit
14336 x 4096 weight (29 MB) when each step of a program reads
  rows64   16 rows x 64 B (the tc kernel: rows K/2 bytes apart, 64 B of each per step),
  rows512  8 rows x 512 B (the GEMV's step),
  tile1k   1 KB contiguous (a row-block-major pre-tiled layout: the same 16 x 64 B, stored together),
  tma      boxes of ROWS rows x BOX bytes by TMA into a ring of STAGES shared-memory buffers (Gluon, sm_90),
           read back to registers by the CTA.
Programs XOR their words together and store one word (no dead code). Median of do_bench (L2 flushed), GB/s.
Usage: PYTHONPATH=src python3 scripts/probe_access.py [N K]"""
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@triton.jit
def _probe_kernel(w_ptr, out_ptr, words_per_row, steps_per_prog,
                  ROWS: tl.constexpr, WORDS: tl.constexpr, TILED: tl.constexpr):
    pid = tl.program_id(0)
    blk = tl.program_id(1)
    r = tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, WORDS)[None, :]
    acc = tl.zeros((ROWS, WORDS), dtype=tl.int32)
    s0 = pid * steps_per_prog
    for s in range(s0, s0 + steps_per_prog):
        if TILED:   # block blk's step s: ROWS * WORDS contiguous words
            p = w_ptr + (blk.to(tl.int64) * words_per_row * ROWS + s * ROWS * WORDS) + r * WORDS + c
        else:       # rows blk * ROWS + r, words [s * WORDS, (s + 1) * WORDS) of each
            p = w_ptr + (blk * ROWS + r).to(tl.int64) * words_per_row + s * WORDS + c
        acc ^= tl.load(p, cache_modifier=".cg")
    tl.store(out_ptr + blk * tl.num_programs(0) + pid, tl.xor_sum(tl.xor_sum(acc, 1), 0))


@gluon.jit
def _probe_tma_kernel(desc, out_ptr, steps_per_prog, ROWS: gl.constexpr, WORDS: gl.constexpr,
                      STAGES: gl.constexpr):
    pid = gl.program_id(0)
    blk = gl.program_id(1)
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (WORDS // 4), WORDS // 4], [gl.num_warps(), 1], [1, 0])
    ring = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, WORDS], desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    s0 = pid * steps_per_prog
    for i in gl.static_range(STAGES):    # steps_per_prog >= STAGES
        mbarrier.expect(bars.index(i), ROWS * WORDS * 4)
        tma.async_copy_global_to_shared(desc, [blk * ROWS, (s0 + i) * WORDS], bars.index(i), ring.index(i))
    acc = gl.zeros([ROWS, WORDS], gl.int32, layout=layout)
    for j in range(steps_per_prog):
        st = j % STAGES
        mbarrier.wait(bars.index(st), (j // STAGES) & 1)
        acc ^= ring.index(st).load(layout)
        gl.thread_barrier()        # every warp has read the stage before it is refilled
        nxt = j + STAGES
        if nxt < steps_per_prog:
            mbarrier.expect(bars.index(st), ROWS * WORDS * 4)
            tma.async_copy_global_to_shared(desc, [blk * ROWS, (s0 + nxt) * WORDS], bars.index(st), ring.index(st))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    gl.store(out_ptr + blk * gl.num_programs(0) + pid, gl.xor_sum(gl.xor_sum(acc, 1), 0))


def _tma_cases(w, N, words_per_row, nbytes):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    w2 = w.view(N, words_per_row)
    for rows, words in ((32, 32), (64, 32), (16, 64), (64, 64)):
        lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
        desc = TensorDescriptor.from_tensor(w2, [rows, words], lay)
        steps = words_per_row // words
        for split in (1, 2, 4):
            for stages in (4, 8):
                if steps % split or steps // split < stages:
                    continue
                grid = (split, N // rows)
                out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device="cuda")
                fn = lambda: _probe_tma_kernel[grid](desc, out, steps // split, ROWS=rows, WORDS=words,  # noqa: E731
                                                     STAGES=stages, num_warps=4)
                try:
                    fn()
                    us = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
                except Exception as e:    # noqa: BLE001  (a probe: report and go on)
                    print(f"tma {rows}x{words * 4}B split {split} stages {stages}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                print(f"tma {rows:3d}x{words * 4:3d}B split {split:2d} stages {stages} programs "
                      f"{grid[0] * grid[1]:6d}: {us:7.2f} us {nbytes / us / 1e3:7.1f} GB/s", flush=True)


def main():
    N, K = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (14336, 4096)
    words_per_row = K // 8
    w = torch.randint(-2**31, 2**31 - 1, (N * words_per_row,), dtype=torch.int32, device="cuda")
    nbytes = w.numel() * 4
    for name, rows, words, tiled in (("rows64", 16, 16, False), ("rows512", 8, 128, False),
                                     ("tile1k", 16, 16, True)):
        steps = words_per_row // words
        for split in (1, 2, 4, 8, 16):
            if steps % split:
                continue
            for warps in (1, 2, 4):
                grid = (split, N // rows)
                out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device="cuda")
                fn = lambda: _probe_kernel[grid](w, out, words_per_row, steps // split, ROWS=rows,  # noqa: E731
                                                 WORDS=words, TILED=tiled, num_warps=warps)
                fn()
                us = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
                print(f"{name:8s} split {split:2d} warps {warps} programs {grid[0] * grid[1]:6d}: {us:7.2f} us "
                      f"{nbytes / us / 1e3:7.1f} GB/s", flush=True)
    _tma_cases(w, N, words_per_row, nbytes)
    fp16 = torch.randn(N, K, device="cuda", dtype=torch.float16)
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    us = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, fp16), warmup=10, rep=50,
                                 return_mode="median") * 1e3
    print(f"fp16 cuBLAS F.linear M=1 (reference): {us:.2f} us {N * K * 2 / us / 1e3:.1f} GB/s")


if __name__ == "__main__":
    main()

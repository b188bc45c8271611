"""Read-bandwidth probe for weight-only access patterns (no math): how fast can a kernel stream a 4-bit
14336 x 4096 weight (29 MB) when each step of a program reads
  rows64   16 rows x 64 B (the tc kernel: rows K/2 bytes apart, 64 B of each per step),
  rows512  8 rows x 512 B (the GEMV's step),
  tile1k   1 KB contiguous (a row-block-major pre-tiled layout: the same 16 x 64 B, stored together).
Programs XOR their words together and store one word (no dead code). Median of do_bench (L2 flushed), GB/s.
Usage: PYTHONPATH=src python3 scripts/probe_access.py [N K]"""
import sys

import torch
import triton
import triton.language as tl


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


if __name__ == "__main__":
    main()

"""How fast can one persistent CTA per SM stream packed weights through a TMA ring? The ceiling of a decode GEMV fed
by bulk copies (cuBLAS's fp16 GEMV moves 4.1 TB/s on the H200 that way, issuing on 9% of cycles, where our 4-bit
GEMVs hold their loads in registers and reach 2.2-2.4 TB/s: docs/design.md, "SwiGLU in the wg epilogue ... ncu").
Each program walks boxes [ROWS, COLS] of a uint8 matrix (tiles pid, pid + P, ...) through a STAGES-deep ring of
shared memory (one mbarrier per stage), refilled once every warp is done with it; CONSUME: the warps also read each
box from shared memory (16 bytes per thread and load) and fold it into a checksum, as a GEMV's dequantization would
read its codes, with WORK dependent multiply-adds per byte on top (--work: as a dequantization would spend them).
Prints GB/s per configuration beside torch's device-to-device copy (read + write) of the same bytes.

Usage: PYTHONPATH=src python3 scripts/probe_tma_stream.py [--mb 512] [--work 0 2 4]     (Hopper: TMA, Gluon)
"""
import argparse
import itertools

import torch
import triton  # noqa: F401  (Gluon needs Triton's runtime)
import triton.testing
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def _issue(w_desc, ring, bars, s, t, n_cols, pred):
    """Start loading tile t (row block t // n_cols, column block t % n_cols) into ring stage s."""
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    COLS: gl.constexpr = w_desc.block_type.shape[1]
    mbarrier.expect(bars.index(s), w_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(w_desc, [(t // n_cols) * ROWS, (t % n_cols) * COLS], bars.index(s),
                                    ring.index(s), pred=pred)


@gluon.jit
def _stream_kernel(w_desc, out_ptr, n_tiles, n_cols, STAGES: gl.constexpr, CONSUME: gl.constexpr,
                   WORK: gl.constexpr = 0):
    ROWS: gl.constexpr = w_desc.block_type.shape[0]
    COLS: gl.constexpr = w_desc.block_type.shape[1]
    W: gl.constexpr = gl.num_warps()
    ring = gl.allocate_shared_memory(gl.uint8, [STAGES, ROWS, COLS], w_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    mine = gl.cdiv(n_tiles - pid, P)
    for s in gl.static_range(STAGES):
        _issue(w_desc, ring, bars, s, pid + s * P, n_cols, s < mine)
    # 16 bytes per thread and load: COLS / 16 threads along a row
    TC: gl.constexpr = COLS // 16
    lay: gl.constexpr = gl.BlockedLayout([1, 16], [32 // TC, TC], [W, 1], [1, 0])
    acc = gl.zeros([ROWS, COLS], gl.int32, lay)
    for i in range(mine):
        st = i % STAGES
        mbarrier.wait(bars.index(st), (i // STAGES) & 1)
        if CONSUME:
            v = ring.index(st).load(lay).to(gl.int32)
            for _ in gl.static_range(WORK):      # WORK dependent multiply-adds per byte (nonlinear: none folds)
                v = v * v + 7
            acc = acc ^ v
        gl.thread_barrier()      # every warp is done with stage st
        _issue(w_desc, ring, bars, st, pid + (i + STAGES) * P, n_cols, i + STAGES < mine)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))
    gl.store(out_ptr + pid, gl.sum(gl.sum(acc, axis=1), axis=0))


def main():
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512, help="bytes streamed per call (past L2)")
    ap.add_argument("--work", type=int, nargs="+", default=[0], help="extra instructions per byte (with consume)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cols_total = 4096
    w = torch.randint(0, 256, (args.mb * 2**20 // cols_total, cols_total), dtype=torch.uint8, device=dev)
    nbytes = w.numel()
    dst = torch.empty_like(w)
    ms = triton.testing.do_bench(lambda: dst.copy_(w), warmup=10, rep=100, return_mode="median")
    print(f"{torch.cuda.get_device_name(dev)}: {nbytes / 2**20:.0f} MB; copy_ {2 * nbytes / ms / 1e6:.0f} GB/s "
          f"(read + write)")
    out = torch.empty(8 * sms, dtype=torch.int32, device=dev)
    cases = [(box, st, wp, per, False, 0) for box, st, wp, per in itertools.product(
        [(64, 256), (128, 256), (32, 256)], (4, 8, 12), (4, 8), (1, 2))]
    cases += [(box, st, wp, per, True, wk) for box, st, wp, per, wk in itertools.product(
        [(64, 256), (128, 256), (32, 256)], (4, 8, 12), (4, 8), (1, 2), args.work)]
    for (rows, cols), stages, warps, per_sm, consume, work in cases:
        smem = stages * rows * cols
        if smem * per_sm > 200 * 1024:
            continue
        layout = gl.NVMMASharedLayout(0, 8, rank=2)
        desc = TensorDescriptor.from_tensor(w, [rows, cols], layout)
        n_cols = cols_total // cols
        n_tiles = (w.shape[0] // rows) * n_cols
        grid = (per_sm * sms,)

        def run():
            _stream_kernel[grid](desc, out, n_tiles, n_cols, STAGES=stages, CONSUME=consume, WORK=work,
                                 num_warps=warps)
        try:
            ms = triton.testing.do_bench(run, warmup=10, rep=100, return_mode="median")
        except Exception as e:       # a configuration the GPU cannot hold
            print(f"box {rows}x{cols} stages {stages} warps {warps} x{per_sm}/SM consume {consume}: {e!r}"[:200])
            continue
        print(f"box {rows}x{cols} stages {stages:2d} ({smem // 1024:3d} KB) warps {warps} x{per_sm}/SM "
              f"consume {int(consume)} work {work}: {nbytes / ms / 1e6:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()

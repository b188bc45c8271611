"""Instructions per byte of weight in the main loop of a decode kernel, from an offline compile (no GPU needed:
Triton's ptxas and nvdisasm): the kernel compiled for sm_90 with the divisibility-16 specializations a real launch
gets, its SASS disassembled, the loop (the block between a backward branch's label and the branch) counted
by opcode (the largest, where there are several), and its instruction count divided by the weight bytes a thread
loads per iteration. Registers per thread from cuobjdump. A kernel whose count per byte nears the GPU's issue rate over its memory bandwidth (about 9
lane-instructions per byte on an H100, 6 on an H200) cannot stream its weight at the bandwidth limit.

Usage: python scripts/sass_count.py gemv8-fp8 | gemv8-fp8-quant | w4a16-gemv | w4a16-gv | w4a16-gv-wpt2 |
       w4a16-gv-intz | w4a16-gv-wpt2-intz | w4a16-gvp | w4a16-gvt | w4a16-wg | w4a16-wg-128 | w4a16-wg-swiglu |
       w4a8-wg | w4a8-wg-m64 | w4a8-wg-m128 | w4a8-wg-ws | w4a8-wg[-m64|-m128|-ws]-cpg2 |
       w4a16-wg-tail | w4a16-wg-ws | w4a16-gvt-ring | w4a16-gvt-ring-w4 | w4a16-gvt-ring-t2 |
       w4a16-gvt-ring-m16 | w8a8-gvt | w8a8-gvt-fp8
       [--arch 90] [--top 12] [--tile BLOCK_N BLOCK_K WARPS (gemv8 cases)]
"""
import argparse
import os
import re
import subprocess
import tempfile
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def gemv8_fp8():
    """The 8-bit GEMV on fp8 codes (x already quantized), 2 rows x 1024 k per step, 2 warps."""
    from qkernels.kernels._gemm import _gemv8_kernel as k
    cx = dict(HAS_SCALES=True, SA_PER_ROW=False, SB_PER_COL=True, HAS_BIAS=False, ACT=0, FP8=True, EVEN_K=True,
              BLOCK_N=2, BLOCK_K=1024, SPLIT_K=1, PDL=False, QUANT_A=False, QMIN=0, QMAX=0, QSYM=1.0, FP_MAX=0.0,
              FP8_EMULATE=False, XBLOCK=0)
    types = dict(a_ptr="*u8", b_ptr="*u8", c_ptr="*fp16", sa_ptr="*fp32", sb_ptr="*fp32", bias_ptr="*fp16",
                 scale_c="fp32", ws_ptr="*fp32", cnt_ptr="*i32", M="i32", N="i32", K="i32", stride_am="i32",
                 stride_bn="i32", stride_cm="i32")
    return k, types, cx, 2, ASTSource, 2 * 1024 // 64           # bytes of weight per thread per step


def gemv8_fp8_quant():
    """gemv8-fp8 quantizing x itself (QUANT_A: the W8A8 linear in one launch), x fp16."""
    from qkernels.ops.quant import _format_constexprs
    k, types, cx, warps, source, nbytes = gemv8_fp8()
    f = _format_constexprs("fp8_e4m3", True, False)
    cx.update(QUANT_A=True, QMIN=f["QMIN"], QMAX=f["QMAX"], QSYM=f["QSYM"], FP_MAX=f["FP_MAX"], XBLOCK=2048)
    return k, dict(types, a_ptr="*fp16"), cx, warps, source, nbytes


def w4a16_gemv():
    """The 4-bit weight-only GEMV (group 128), the H100 table's M = 1 bucket config: 4 rows x 2048 k, 4 warps."""
    from qkernels.kernels.weight_only.gemv import _wo_gemv_kernel as k
    cx = dict(BITS=4, GROUP=128, HAS_BIAS=False, EVEN_K=True, BLOCK_N=4, BLOCK_K=2048, SPLIT_K=1, INT_Z=False,
              SWIGLU=False, PDL=False)
    names = [n for n in k.arg_names if n not in cx]
    kinds = ["*fp16", "*u8", "*fp16", "*fp16", "*fp16", "*fp32", "*i32"] + ["i32"] * (len(names) - 7)
    return k, dict(zip(names, kinds)), cx, 4, ASTSource, 4 * 2048 // 2 // 128


def w4a16_gvt():
    """The Gluon tensor-core GEMV, 4-bit, one 16-row tile, WPT 8 (256 k per step), one warp (the H100 table's
    28672x4096 M = 1 entry)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels.weight_only.gvt import _wo_gvt_kernel as k
    cx = dict(GROUP=128, HAS_BIAS=False, TILES=1, WPT=8, MT=1, SPLIT_K=1, EVEN_K=True, SWIGLU=False, PAIRS=False,
              BITS=4, PDL=False, STAGES=1)
    types = dict(x_ptr="*fp16", w_ptr="*i32", sz_ptr="*fp16", bias_ptr="*fp16", out_ptr="*fp16", M="i32", N="i32",
                 K="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32", stride_om="i32", ws_ptr="*fp32",
                 cnt_ptr="*i32")
    return k, types, cx, 1, GluonASTSource, 16 * 256 // 2 // 32


def w4a16_gvt_ring(stages=3, wpt=8, tiles=1, mt=1):
    """w4a16-gvt with its codes through a ring of `stages` async-copy slots (STAGES) instead of registers; mt x tiles
    (2: M = 9..16)."""
    k, types, cx, warps, source, _ = w4a16_gvt()
    cx = dict(cx, STAGES=stages, WPT=wpt, TILES=tiles, MT=mt)
    return k, types, cx, warps, source, tiles * 16 * (128 * wpt // 4) // 2 // 32


def w4a16_gv():
    """The Gluon paired-fp16 GEMV, 4-bit, g128: 8 rows x 1024 k per step, WPT 4, one warp, a ring of 3 stages (the
    H200 table's M = 1 entry on 14336x4096 and the lm_head)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels.weight_only.gv import _wo_gv_kernel as k
    cx = dict(GROUP=128, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=1024, WPT=4, SPLIT_K=1, EVEN_K=True, STAGES=3,
              SWIGLU=False, PDL=False)
    types = dict(x_ptr="*fp16", w_ptr="*i32", sz_ptr="*fp16", bias_ptr="*fp16", out_ptr="*fp16", M="i32", N="i32",
                 K="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32", stride_om="i32", ws_ptr="*fp32",
                 cnt_ptr="*i32")
    return k, types, cx, 1, GluonASTSource, 8 * 1024 // 2 // 32


def w4a16_gv_wpt2():
    """w4a16-gv as the tables' M = 1 bucket default runs it: 8 rows x 2048 k, WPT 2 (chains of two code words), four
    warps, no ring."""
    k, types, cx, _, source, _ = w4a16_gv()
    cx.update(BLOCK_K=2048, WPT=2, STAGES=1)
    return k, types, cx, 4, source, 8 * 2048 // 2 // 128


def w4a16_gv_intz(wpt2=False):
    """w4a16-gv (or, wpt2, w4a16-gv-wpt2) for integer zero points (INT_Z: the zero point taken out in the
    dequantizing fmas, no x sums)."""
    k, types, cx, warps, source, nbytes = w4a16_gv_wpt2() if wpt2 else w4a16_gv()
    return k, types, dict(cx, INT_Z=True), warps, source, nbytes


def w4a16_gvp():
    """w4a16-gv on the persistent grid (PERSISTENT: each program a contiguous run of (row block, step) units), 8 rows
    x 1024 k per unit, WPT 4, one warp, registers a unit ahead."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels.weight_only.gv import _wo_gvp_kernel as k
    _, types, _, _, _, per = w4a16_gv()
    cx = dict(GROUP=128, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=1024, WPT=4, EVEN_K=True, SWIGLU=False, PDL=True)
    return k, types, cx, 1, GluonASTSource, per


def w8a8_gvt(fp8=False, tiles=2, wpt=8, mt=1, xr=1):
    """The Gluon tensor-core W8A8 GEMV quantizing x itself (fp16 x), int8 or fp8 codes: TILES 16-row tiles per warp,
    WPT 8 (128 k per step), one warp, one x row. Its main loop is the one with the MMAs (the absmax loop is larger)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels._gemv_mma import _w8a8_gvt_kernel as k
    cx = dict(SB_PER_COL=True, HAS_BIAS=False, FP8=fp8, QUANT_A=True, QSYM=448.0 if fp8 else 127.0, TILES=tiles,
              WPT=wpt, MT=mt, XR=xr, XB=2048, SPLIT_K=1, EVEN_K=True, PDL=False)
    types = dict(x_ptr="*fp16", w_ptr="*u8", c_ptr="*fp16", sa_ptr="*fp32", sb_ptr="*fp32", bias_ptr="*fp16",
                 scale_c="fp32", ws_ptr="*fp32" if fp8 else "*i32", cnt_ptr="*i32", M="i32", N="i32", K="i32",
                 stride_xm="i32", stride_wn="i32", stride_cm="i32")
    return k, types, cx, 1, GluonASTSource, 16 * tiles * 16 * wpt // 32, "IMMA" if not fp8 else "HMMA"


def _wg_types(bm: int, hb: int) -> dict:
    """The argument types of the wg kernels: x / code-byte TMA descriptors of bm x rows and hb code rows per box,
    pointers, sizes, and the grid's first split-tile program (full)."""
    xl = "NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)"
    wl = "NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)"
    return dict(x_desc=f"tensordesc<fp16[{bm},64],{xl}>", w_desc=f"tensordesc<u8[{hb},32],{wl}>", sz_ptr="*fp16",
                bias_ptr="*fp16", out_ptr="*fp16", M="i32", N="i32", K="i32", stride_sn="i32", stride_om="i32",
                ws_ptr="*fp32", cnt_ptr="*i32", full="i32")


def w4a16_wg(swiglu: bool = False, bn: int = 64):
    """The Gluon wgmma kernel at batched decode: 4-bit, g128, 32 x rows, 64 weight rows, 8 stages of one 64-k chunk,
    split 2 (an H200 table's M = 32 entry on 14336x4096). Its main loop is the smallest one with the HGMMAs (the
    larger ones are the mbarrier waits' retry paths jumping back into it); two chunks per iteration. swiglu: the
    runtime's gate|up (SWIGLU: half-height code boxes, gate and up paired in the epilogue). bn 128: 128 weight rows
    on the one warpgroup (two m64 wgmmas a k step)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels.weight_only.wg import _wo_wg_kernel as k
    bm = 32
    cx = dict(GROUP=128, HAS_BIAS=False, INT_Z=True, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=8, SPLIT_K=2, BITS=4,
              KC=1, SWIGLU=swiglu, TAIL=1, WS=False, PDL=False)
    types = _wg_types(bm, bn // 2 if swiglu else bn)
    return k, types, cx, 4, GluonASTSource, 2 * bn * 32 // 128, "HGMMA", "smallest"


def w4a16_wg_ws():
    """The Gluon wgmma kernel at prefill, warp-specialized (WS: a producer warp issues the TMA copies): 256 x rows,
    128 weight rows, 8 consumer warps, 4 stages (setmaxnreg: 240 registers for the consumers, 24 for the producer)."""
    k, types, cx, warps, source, nbytes, mma, pick = w4a16_wg_tail()
    return k, types, dict(cx, TAIL=1, WS=True), warps, source, nbytes, mma, pick


def w4a16_wg_tail():
    """The Gluon wgmma kernel at prefill with its last wave split along K (TAIL 2): 256 x rows, 128 weight rows, 8
    warps, 4 stages."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels.weight_only.wg import _wo_wg_kernel as k
    bm, bn = 256, 128
    cx = dict(GROUP=128, HAS_BIAS=False, INT_Z=True, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=4, SPLIT_K=1, BITS=4,
              KC=1, SWIGLU=False, TAIL=2, WS=False, PDL=False)
    types = _wg_types(bm, bn)
    return k, types, cx, 8, GluonASTSource, 2 * bn * 32 // 256, "HGMMA", "smallest"


def w4a8_wg(bm: int = 16, bn: int = 64, warps: int = 4, ws: bool = False, cpg: int = 1):
    """The Gluon FP8 wgmma kernel of W4A8 (kernels/_w4a8_wg.py) at batched decode: g128, bm x rows, bn weight rows,
    4 stages of one 64-k chunk, split 2; two promotion units (of cpg chunks) per iteration."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from qkernels.kernels._w4a8_wg import _w4a8_wg_kernel as k
    cx = dict(GROUP=128, HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=4, SPLIT_K=2, CPG=cpg, WS=ws,
              PDL=True)
    xl = "NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)"
    wl = "NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)"
    types = dict(x_desc=f"tensordesc<fp8e4nv[{bm},64],{xl}>", w_desc=f"tensordesc<u8[{bn},32],{wl}>", xs_ptr="*fp32",
                 sz_ptr="*fp16", bias_ptr="*fp16", out_ptr="*fp16", M="i32", N="i32", K="i32", stride_sn="i32",
                 stride_om="i32", ws_ptr="*fp32", cnt_ptr="*i32")
    return k, types, cx, warps, GluonASTSource, 2 * cpg * bn * 32 // (32 * warps), "QGMMA", "first"


CASES = {"gemv8-fp8": gemv8_fp8, "gemv8-fp8-quant": gemv8_fp8_quant, "w4a16-gemv": w4a16_gemv, "w4a16-gv": w4a16_gv,
         "w4a16-gv-wpt2": w4a16_gv_wpt2, "w4a16-gv-intz": w4a16_gv_intz,
         "w4a16-gv-wpt2-intz": lambda: w4a16_gv_intz(True), "w4a16-gvp": w4a16_gvp, "w4a16-gvt": w4a16_gvt,
         "w8a8-gvt": w8a8_gvt, "w8a8-gvt-fp8": lambda: w8a8_gvt(fp8=True), "w4a16-wg": w4a16_wg,
         "w4a16-wg-tail": w4a16_wg_tail, "w4a8-wg": w4a8_wg, "w4a8-wg-m64": lambda: w4a8_wg(64),
         "w4a8-wg-m128": lambda: w4a8_wg(128), "w4a8-wg-cpg2": lambda: w4a8_wg(cpg=2),
         "w4a8-wg-m64-cpg2": lambda: w4a8_wg(64, cpg=2), "w4a8-wg-m128-cpg2": lambda: w4a8_wg(128, cpg=2),
         "w4a8-wg-ws-cpg2": lambda: w4a8_wg(ws=True, cpg=2),
         "w4a8-wg-ws": lambda: w4a8_wg(ws=True), "w4a16-wg-ws": w4a16_wg_ws,
         "w4a16-wg-swiglu": lambda: w4a16_wg(swiglu=True), "w4a16-wg-128": lambda: w4a16_wg(bn=128),
         "w4a16-gvt-ring": w4a16_gvt_ring,
         "w4a16-gvt-ring-w4": lambda: w4a16_gvt_ring(4, 4), "w4a16-gvt-ring-t2": lambda: w4a16_gvt_ring(3, 8, 2),
         # M = 16 as the H200 table has it on 14336x4096 (four tiles, WPT 4, three stages)
         "w4a16-gvt-ring-m16": lambda: w4a16_gvt_ring(3, 4, 4, mt=2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--maxnreg", type=int, help="cap the registers per thread (ptxas; spills show as LDL / STL)")
    ap.add_argument("--tile", type=int, nargs=3, metavar=("BLOCK_N", "BLOCK_K", "WARPS"),
                    help="gemv8 cases: another rows x k step and warps (a table's config)")
    ap.add_argument("--dump", metavar="FILE", help="also write the counted loop's SASS to FILE")
    args = ap.parse_args()
    kernel, types, cx, warps, source, bytes_per_iter, *loop_op = CASES[args.case]()
    if args.tile:
        if not args.case.startswith("gemv8"):
            ap.error("--tile applies to the gemv8 cases")
        cx.update(BLOCK_N=args.tile[0], BLOCK_K=args.tile[1])
        warps, bytes_per_iter = args.tile[2], args.tile[0] * args.tile[1] // (32 * args.tile[2])
    sig = {n: types.get(n, "constexpr") for n in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in types.items()
             if t != "fp32" and not t.startswith("tensordesc")}
    compiled = triton.compile(source(kernel, sig, cx, attrs), target=GPUTarget("cuda", args.arch, 32),
                              options=dict(num_warps=warps, num_stages=1,
                                           **({"maxnreg": args.maxnreg} if args.maxnreg else {})))
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", cubin], capture_output=True,
                               text=True).stdout
    lines = sass.splitlines()
    labels = {l.split(":")[0]: i for i, l in enumerate(lines) if re.match(r"\.L_x_\d+:", l)}
    loops = []         # (start, end) of each block a backward branch closes
    for i, l in enumerate(lines):
        m = re.search(r"BRA\s+`\((\.L_x_\d+)\)", l)
        if m and labels.get(m.group(1), i) < i - 1:     # not the one-instruction trap loop after EXIT
            loops.append((labels[m.group(1)], i))
    code = [[l for l in lines[a:b + 1] if re.search(r"/\*[0-9a-f]{4}\*/", l)] for a, b in loops]
    ops = [[re.sub(r"^.*?\*/\s+(@!?U?P\w+\s+)?", "", l).split()[0] for l in c] for c in code]
    # the main loop: the largest (others: e.g. the row's absmax before it), or the largest with the case's opcode
    # "first": the first such loop in the code (the main loop; later blocks closed by the retry branches of its
    # mbarrier waits span more of it)
    cand = [o for o in ops if not loop_op or any(op.startswith(loop_op[0]) for op in o)]
    body = cand[0] if loop_op[1:] == ["first"] else (min if loop_op[1:] == ["smallest"] else max)(cand, key=len)
    if args.dump:
        with open(args.dump, "w") as f:
            f.write("\n".join(code[next(i for i, o in enumerate(ops) if o is body)]) + "\n")
    regs = re.search(r"REG:(\d+)", usage)
    print(f"{args.case}: loop {len(body)} instructions per thread per iteration, {bytes_per_iter} weight bytes "
          f"-> {len(body) / bytes_per_iter:.1f} per byte; {regs.group(1) if regs else '?'} registers per thread"
          + (f"; other loops: {sorted(len(o) for o in ops if o is not body)}" if len(ops) > 1 else ""))
    spills = sum(op.startswith(("LDL", "STL")) for o in ops for op in o)
    if spills:
        print(f"  local-memory loads / stores (spills) in the loops: {spills}")
    for op, n in Counter(body).most_common(args.top):
        print(f"  {n:5d} {op}")


if __name__ == "__main__":
    main()

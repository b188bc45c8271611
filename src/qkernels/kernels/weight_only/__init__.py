"""Private kernels of the weight-only linears (W4A16 / W8A16), one file per kernel family:

  dequant.py       the code -> float conversion (magic-number asm) and group scales shared by the Triton-language
                   kernels, and the dequantize kernel of the "dequant" path (cuBLAS at large M)
  gemv.py          the decode GEMV (path "gemv"): fp32 FMA chain, split-K, programmatic dependent launch
  gv.py            Gluon decode GEMV with paired fp16 products (path "gv", fp16 x, 4-bit, sm_80+)
  gvt.py           Gluon decode GEMV on tensor cores for M <= 16 (path "gvt", fp16 x, 4/8-bit, integer zero points)
  mm.py            the Triton-language tensor-core GEMM (path "mm"), also the CPU twin of the Gluon kernels
  tc.py            Gluon mma.sync kernel for M <= 16 (path "tc", sm_80+)
  wg.py            Gluon wgmma kernel for large M (path "wg", sm_90)
  gluon_shared.py  word views and the split-K fix-up shared by the Gluon kernels

Launchers and the dispatch rules: ops/weight_only/. Layout: packed_weight.py. Reference:
reference.weight_only_linear. Nothing is imported here: a kernel module loads when its path first runs.
"""

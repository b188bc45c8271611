"""Compile one of our Triton kernels for a GPU target on a machine without a GPU, and summarize what the
compiler made of it: async copies vs synchronous loads in the TTGIR, shared-memory round trips
(local_alloc of registers), the MMA flavour, and a SASS instruction histogram of the hottest loop.

  python scripts/inspect_kernel.py wo_mm   BLOCK_M=16 BLOCK_N=32 BLOCK_K=128 num_warps=2 num_stages=4
  python scripts/inspect_kernel.py wo_gemv BLOCK_N=4 BLOCK_K=1024 num_warps=4 num_stages=2 --dump /tmp/k

Options other than KEY=VALUE: --arch 90 (sm_90), --dtype fp16|bf16, --bits 4|8, --group 128,
--dump DIR (writes ttgir / ptx / sass there). Ptxas and nvdisasm ship in the Triton wheel.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

NVDISASM = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")


def _kernels(dtype: str, bits: int, group: int):
    from qkernels.kernels import _gemm, _weight_only
    wo_args = ["x_ptr", "w_ptr", "sz_ptr", "bias_ptr", "out_ptr", "M", "N", "K",
               "stride_xm", "stride_wn", "stride_sn", "stride_om"]
    wo_types = [f"*{dtype}", "*u8", f"*{dtype}", f"*{dtype}", f"*{dtype}"] + ["i32"] * 7
    wo_flags = dict(BITS=bits, GROUP=group, HAS_BIAS=False, EVEN_K=True)
    return {
        "wo_mm": (_weight_only._wo_mm_kernel, wo_args, wo_types, dict(wo_flags, GROUP_N=8, SPLIT_K=1)),
        "wo_gemv": (_weight_only._wo_gemv_kernel, wo_args, wo_types, dict(wo_flags, SPLIT_K=1)),
        "wo_dequant": (_weight_only._wo_dequant_kernel,
                       ["w_ptr", "sz_ptr", "out_ptr", "N", "K", "stride_wn", "stride_sn", "stride_on"],
                       ["*u8", f"*{dtype}", f"*{dtype}"] + ["i32"] * 5, dict(BITS=bits, GROUP=group, EVEN_K=True)),
        # int8 A [M, K] row-major, B = W.T of an [N, K] weight (stride_bk = 1): the common case
        "gemm": (_gemm._scaled_mm_kernel,
                 ["a_ptr", "b_ptr", "c_ptr", "sa_ptr", "sb_ptr", "bias_ptr", "scale_c", "M", "N", "K",
                  "stride_am", "stride_bn", "stride_cm"],
                 ["*i8", "*i8", f"*{dtype}", "*fp32", "*fp32", f"*{dtype}", "fp32"] + ["i32"] * 6,
                 dict(stride_ak=1, stride_bk=1, stride_cn=1, HAS_SCALES=True, SA_PER_ROW=True, SB_PER_COL=True,
                      HAS_BIAS=False, ACT=0, ACC_INT=True, INT4=False, GROUP_M=8)),
    }


def _tensordesc(dtype: str, block: list[int], swizzle: int, bits: int) -> str:
    """Signature string of a Gluon TMA descriptor argument (NVMMASharedLayout, as the launcher builds it)."""
    return (f"tensordesc<{dtype}[{block[0]}, {block[1]}],NVMMASharedLayout(swizzle_byte_width={swizzle}, "
            f"element_bitwidth={bits}, rank=2, transposed=False, fp4_padded=False, cga_layout=[])>")


def _gluon_kernels(dtype: str, params: dict):
    """Gluon kernels take TMA descriptors whose block shapes follow the constexprs."""
    from qkernels.kernels import _weight_only_wg
    bm, bn = params.get("BLOCK_M", 256), params.get("BLOCK_N", 128)
    return {
        "wo_wg": (_weight_only_wg._wo_wg_kernel,
                  ["x_desc", "w_desc", "sz_ptr", "bias_ptr", "out_ptr", "M", "N", "K", "stride_sn", "stride_om",
                   "ws_ptr", "cnt_ptr"],
                  [_tensordesc(dtype, [bm, 64], 128, 16), _tensordesc("u8", [bn, 32], 0, 8),
                   f"*{dtype}", f"*{dtype}", f"*{dtype}"] + ["i32"] * 5 + ["*fp32", "*i32"],
                  dict(HAS_BIAS=False, INT_Z=False, BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=4, SPLIT_K=1)),
    }


def compile_kernel(fn, names, types, constexprs, arch, num_warps, num_stages):
    sig = dict(zip(names, types))
    for k in constexprs:
        sig[k] = "constexpr"
    # pointers and the leading dims are 16-byte aligned, as they are at real sizes
    params = fn.arg_names
    attrs = {(params.index(n),): [["tt.divisibility", 16]] for n, t in zip(names, types)
             if t.startswith("*") or n in ("N", "K") or n.startswith("stride")}
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn, signature=sig, constexprs={k: v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def summarize(k, dump: str | None):
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([NVDISASM, "-c", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    if dump:
        os.makedirs(dump, exist_ok=True)
        for name, text in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
            with open(os.path.join(dump, f"kernel.{name}"), "w") as f:
                f.write(text)
    print("TTGIR: async copies", ttgir.count("async_copy_global_to_local"),
          "| tt.load", len(re.findall(r"= tt\.load", ttgir)),
          "| local_alloc of a value", len(re.findall(r"ttg\.local_alloc %", ttgir)),
          "| convert_layout", ttgir.count("ttg.convert_layout"),
          "| wgmma", ttgir.count("warp_group_dot"), "| tt.dot", ttgir.count("tt.dot "))
    print("shared memory bytes:", k.metadata.shared, "| registers: see SASS header")
    # the hottest loop: the longest backward branch range. One pass: instruction lines, and for each
    # label the index of the instruction after it
    lines, label_at = [], {}
    for ln in sass.splitlines():
        if re.match(r"\s+/\*[0-9a-f]{4,}\*/", ln):
            lines.append(ln)
        elif re.match(r"\.L_x_\d+:", ln):
            label_at[ln.split(":")[0]] = len(lines)
    best = None
    for i, ln in enumerate(lines):
        tgt = re.search(r"BRA\s.*(\.L_x_\d+)", ln)
        j = label_at.get(tgt.group(1)) if tgt else None
        if j is not None and j < i and (best is None or i - j > best[1] - best[0]):
            best = (j, i)
    body = lines[best[0]:best[1] + 1] if best else lines
    ops = collections.Counter()
    for ln in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", ln)
        if m:
            ops[m.group(1)] += 1
    print(f"hot loop: {len(body)} instructions ({'whole kernel' if not best else 'longest backward branch'})")
    print("  " + ", ".join(f"{op} {n}" for op, n in ops.most_common(40)))
    return len(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kernel")
    ap.add_argument("params", nargs="*")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--dump")
    a = ap.parse_args()
    p = {k: int(v) for k, v in (s.split("=") for s in a.params)}
    table = _gluon_kernels(a.dtype, p) if a.kernel.startswith("wo_wg") else _kernels(a.dtype, a.bits, a.group)
    fn, names, types, flags = table[a.kernel]
    if a.kernel.startswith("wo_wg"):
        flags["GROUP"] = a.group
    nw, ns = p.pop("num_warps", 4), p.pop("num_stages", 3)
    k = compile_kernel(fn, names, types, {**flags, **p}, a.arch, nw, ns)
    summarize(k, a.dump)


if __name__ == "__main__":
    main()

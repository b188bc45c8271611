"""`qkernels export-c`: ahead-of-time compiled kernels for C / C++ programs.

Each exported op is one kernel specialization, compiled by Triton for one GPU architecture (a named target: no
GPU is needed) into C source that embeds its cubin, behind a small C API whose functions take a CUstream and
device pointers:

  qk_quantize_int8_rows   x fp16 [M, K] -> codes int8 [M, K] + scales fp32 [M]   (= quantize(x, "int8", "row"))
  qk_int8_matmul          a int8 [M, K] @ w int8 [N, K]^T -> int32 [M, N], exact   (= int8_matmul(a, w.t()))
  qk_w4a16_gemv           x fp16 [M, K] @ W^T, W a 4-bit group-128 PackedWeight     (= w4a16_linear(x, w) through
                          the GEMV config 8 rows x 2048 k, 4 warps, no split; for decode-sized M)

With int8_matmul exported, cuda_kernels.h also declares the kernel-library guide's C entry point
(docs/guide/index.md), on the same kernel:

  int8_matmul_cuda        A int8 [M, K] @ B int8 [K, N] -> C int32 [M, N], exact; the guide's signature (device
                          pointers, M, N, K, scale_a, scale_b, scale_c, a cudaStream_t)

Every tensor is contiguous and row-major, as the Python ops' inputs are. The output directory holds
qkernels.h / qkernels.c (the API; the cubins embedded, loaded into the current context on first use), example.c
(loads inputs written by Python, runs each op, writes the outputs and times the host cost of a launch) and a
Makefile that builds it against the CUDA driver API (cuda.h: Triton's copy by default; libcuda from the driver).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Spec:
    module: str          # where the kernel lives
    kernel: str
    args: tuple          # the runtime arguments' types in order ("*fp16:16": a 16-byte aligned pointer)
    constexprs: dict     # the specialization
    grid: str            # C expressions of the kernel's runtime arguments
    num_warps: int
    num_stages: int
    api: str             # the C API function: prototype
    body: str            # its body; {launch} is the kernel's launcher


_QUANT = dict(QMIN=-128, QMAX=127, QSYM=127.0, IS_FP8=False, FP_MAX=0.0, FP8_MAN=2, FP8_BIAS=15, FP8_EMULATE=False,
              SYMMETRIC=True, STATIC=False, PACK4=False, BLOCK_R=1, BLOCK_S=1024, ONE_CHUNK=False, PDL=False)
_MM = dict(HAS_SCALES=False, SA_PER_ROW=False, SB_PER_COL=False, HAS_BIAS=False, ACT=0, ACC_INT=True, INT4=False,
           BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, SPLIT_K=1, PDL=False)
W4A16_GEMV = dict(path="gemv", BLOCK_N=8, BLOCK_K=2048, num_warps=4, num_stages=1)   # the exported GEMV's config
_GEMV = dict(BITS=4, GROUP=128, HAS_BIAS=False, EVEN_K=False, BLOCK_N=W4A16_GEMV["BLOCK_N"],
             BLOCK_K=W4A16_GEMV["BLOCK_K"], SPLIT_K=1, INT_Z=False, SWIGLU=False, PDL=False)

SPECS = {
    "quantize": _Spec(
        "qkernels.kernels._quant", "_quantize_segments_kernel",
        ("*fp16:16", "*i8:16", "*fp32:16", "*fp32:16") + ("i32",) * 6, _QUANT, "num_segs, 1, 1", 4, 1,
        "CUresult qk_quantize_int8_rows(CUstream stream, CUdeviceptr x, CUdeviceptr codes, CUdeviceptr scales, "
        "int32_t M, int32_t K)",
        "if (M <= 0 || K <= 0) return CUDA_SUCCESS;\n"
        "    return {launch}(stream, x, codes, scales, scales, M, K, 1, K, 1, K);"),
    "int8_matmul": _Spec(
        "qkernels.kernels._gemm", "_scaled_mm_kernel",
        ("*i8:16", "*i8:16", "*i32:16", "*fp32", "*fp32", "*fp32", "fp32") + ("i32",) * 9 + ("*i32", "*i32"), _MM,
        "((M + 63) / 64) * ((N + 63) / 64), 1, 1", 4, 3,
        "CUresult qk_int8_matmul(CUstream stream, CUdeviceptr a, CUdeviceptr w, CUdeviceptr c, int32_t M, "
        "int32_t N, int32_t K)",
        "if (M <= 0 || N <= 0) return CUDA_SUCCESS;\n"
        "    return {launch}(stream, a, w, c, c, c, c, 1.0f, M, N, K, K, 1, 1, K, N, 1, c, c);"),
    "w4a16": _Spec(
        "qkernels.kernels.weight_only.gemv", "_wo_gemv_kernel",
        ("*fp16:16", "*u8:16", "*fp16:16", "*fp16", "*fp16:16", "*fp32", "*i32") + ("i32",) * 7, _GEMV,
        f"(N + {_GEMV['BLOCK_N'] - 1}) / {_GEMV['BLOCK_N']}, M, 1", W4A16_GEMV["num_warps"],
        W4A16_GEMV["num_stages"],
        "CUresult qk_w4a16_gemv(CUstream stream, CUdeviceptr x, CUdeviceptr qweight, CUdeviceptr scale_zero, "
        "CUdeviceptr out, int32_t M, int32_t N, int32_t K)",
        "if (M <= 0 || N <= 0) return CUDA_SUCCESS;\n"
        "    int32_t row_bytes = (K + 63) / 64 * 32, groups = (K + 127) / 128;\n"
        "    return {launch}(stream, x, qweight, scale_zero, out, out, out, out, M, N, K, K, row_bytes, groups, N);"),
}
_C_TYPES = {"i32": "int32_t", "fp32": "float"}


def cuda_include() -> str:
    """The directory of the cuda.h Triton ships (its launchers are built against it)."""
    import triton
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "include")


def _compile(spec: _Spec, arch: int):
    """The cubin, symbol, shared-memory bytes and runtime parameter names of spec's kernel for sm_<arch>."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = getattr(importlib.import_module(spec.module), spec.kernel)
    names = [n for n in kernel.arg_names if n not in spec.constexprs]
    if len(names) != len(spec.args) or len(names) + len(spec.constexprs) != len(kernel.arg_names):
        raise RuntimeError(f"export spec of {spec.kernel} does not match its parameters {kernel.arg_names}")
    signature = {n: t.split(":")[0] for n, t in zip(names, spec.args)}
    signature.update({n: "constexpr" for n in spec.constexprs})
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in zip(names, spec.args)
             if t.endswith(":16")}
    compiled = triton.compile(ASTSource(kernel, signature, spec.constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages))
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        raise RuntimeError(f"{spec.kernel} needs global scratch memory, which the exported launcher does not give")
    return compiled.asm["cubin"], md.name, md.shared, names


def _launcher(op: str, spec: _Spec, cubin: bytes, symbol: str, shared: int, names: list) -> str:
    """C source of one kernel: its cubin, lazy module load, and a launcher taking the grid's arguments."""
    params = ", ".join(f"{'CUdeviceptr' if t.startswith('*') else _C_TYPES[t.split(':')[0]]} {n}"
                       for n, t in zip(names, spec.args))
    data = ",".join(str(b) for b in cubin)
    args = ", ".join(f"&{n}" for n in names)
    return f"""
/* {spec.kernel} ({spec.module}): {", ".join(f"{k}={v}" for k, v in spec.constexprs.items())},
   num_warps={spec.num_warps}, num_stages={spec.num_stages} */
static const unsigned char {op}_cubin[{len(cubin)}] = {{{data}}};
static CUmodule {op}_module;
static CUfunction {op}_function;

static CUresult {op}_launch(CUstream stream, {params}) {{
    CUresult r = CUDA_SUCCESS;
    if (!{op}_function) {{
        r = cuModuleLoadData(&{op}_module, {op}_cubin);
        if (r == CUDA_SUCCESS) r = cuModuleGetFunction(&{op}_function, {op}_module, "{symbol}");
        if (r == CUDA_SUCCESS && {shared} > 49152)
            r = cuFuncSetAttribute({op}_function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, {shared});
        if (r != CUDA_SUCCESS) {{ {op}_function = NULL; return r; }}
    }}
    unsigned gx = {spec.grid.split(",")[0].strip()}, gy = {spec.grid.split(",")[1].strip()}, \
gz = {spec.grid.split(",")[2].strip()};
    CUdeviceptr global_scratch = 0, profile_scratch = 0;
    void *args[] = {{{args}, &global_scratch, &profile_scratch}};
    return cuLaunchKernel({op}_function, gx, gy, gz, {32 * spec.num_warps}, 1, 1, {shared}, stream, args, NULL);
}}
"""


def export_c(out_dir, ops=tuple(SPECS), gpu: str = "sm_90") -> list[Path]:
    """Compile `ops` (names of SPECS) for `gpu` ("sm_80", "sm_90", ...) into out_dir (no GPU needed); returns the
    files written. Refuses unknown ops and architectures below sm_80 (the 4-bit unpacking and the int8 MMA)."""
    from ._runtime import is_interpreter
    unknown = [o for o in ops if o not in SPECS]
    if unknown or not ops:
        raise ValueError(f"ops must be a non-empty subset of {sorted(SPECS)}, got {list(ops)!r}")
    if not (isinstance(gpu, str) and gpu.startswith("sm_") and gpu[3:].isdigit() and int(gpu[3:]) >= 80):
        raise ValueError(f"gpu must name an architecture sm_80 or newer (e.g. 'sm_90'), got {gpu!r}")
    if is_interpreter():
        raise RuntimeError("export-c compiles the kernels for a GPU: run it without TRITON_INTERPRET=1 (no GPU is "
                           "needed)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    protos, parts = [], []
    for op in ops:
        spec = SPECS[op]
        cubin, symbol, shared, names = _compile(spec, int(gpu[3:]))
        parts.append(_launcher(op, spec, cubin, symbol, shared, names))
        parts.append(f"{spec.api} {{\n    {spec.body.format(launch=op + '_launch')}\n}}\n")
        protos.append(spec.api + ";")
    if "int8_matmul" in ops:
        parts.append(_GUIDE_MATMUL)
    files = {
        "qkernels.h": "/* qkernels: ahead-of-time compiled kernels (`qkernels export-c`), " + gpu + ". Device pointers"
                      " and a\n   CUstream in, a CUresult out; contiguous row-major tensors (see qkernels/export_c.py"
                      ").\n   The kernels load on first use in the current CUDA context. */\n#pragma once\n"
                      "#include <cuda.h>\n#include <stdint.h>\n\n" + "\n".join(protos) + "\n",
        "qkernels.c": '#include "qkernels.h"\n' + "".join(parts),
        "example.c": _EXAMPLE if set(ops) == set(SPECS) else _EXAMPLE_NONE,
        "Makefile": f"CUDA_INC ?= {cuda_include()}\nCFLAGS ?= -O2\nLDLIBS ?= -l:libcuda.so.1 -lm\n\n"
                    "example: example.c qkernels.c qkernels.h" + (" cuda_kernels.h" if "int8_matmul" in ops else "")
                    + "\n"
                    "\t$(CC) $(CFLAGS) -I$(CUDA_INC) -I. -o $@ example.c qkernels.c $(LDLIBS)\n",
    }
    if "int8_matmul" in ops:
        files["cuda_kernels.h"] = _GUIDE_HEADER
    for name, text in files.items():
        (out / name).write_text(text)
    return [out / name for name in files]


# The guide's C interface (cuda_kernels.h): its int8_matmul_cuda on our int8 GEMM kernel. The guide gives no return
# type; this returns the CUresult of the launch. Its scales are read as the Python wrapper reads them
# (qkernels.cuda_wrapper): C is the exact int32 product, whose real value is C * scale_a * scale_b; scale_c, an
# int32 requantization the exported kernel does not do, must be 1 (the guide's value): anything else is refused.
_GUIDE_HEADER = """/* The kernel-library guide's C interface (docs/guide/index.md), on qkernels'
   int8 GEMM (`qkernels export-c`; implemented in qkernels.c, build it with that file).

   C [M, N] int32 = A [M, K] int8 @ B [K, N] int8, exact; all row-major, device pointers (cudaMalloc'd), A and B
   16-byte aligned. scale_a and scale_b are the factors of C's real value, C * scale_a * scale_b ~ (A * scale_a) @
   (B * scale_b), finite and > 0; scale_c must be 1.0f (the guide's value). Returns CUDA_SUCCESS, or
   CUDA_ERROR_INVALID_VALUE for an argument outside these (the kernel does not run), or the launch's error. */
#pragma once
#include <cuda.h>
#include <stdint.h>
#if defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define QK_HAVE_CUDART 1
#endif
#endif
#ifndef QK_HAVE_CUDART
typedef struct CUstream_st *cudaStream_t;     /* as the CUDA runtime's driver_types.h declares it */
#endif
#ifdef __cplusplus
extern "C" {
#endif
CUresult int8_matmul_cuda(const int8_t *A, const int8_t *B, int32_t *C, int M, int N, int K, float scale_a,
                          float scale_b, float scale_c, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
"""

_GUIDE_MATMUL = """
#include <math.h>
#include "cuda_kernels.h"

/* int8_matmul_cuda: the guide's B [K, N] is the kernel's b with strides (N, 1); K at most 131071 keeps the int32
   sum exact, as qkernels.int8_matmul requires */
CUresult int8_matmul_cuda(const int8_t *A, const int8_t *B, int32_t *C, int M, int N, int K, float scale_a,
                          float scale_b, float scale_c, cudaStream_t stream) {
    if (M < 0 || N < 0 || K < 0 || K > 131071 || !(isfinite(scale_a) && scale_a > 0.0f) ||
        !(isfinite(scale_b) && scale_b > 0.0f) || scale_c != 1.0f || !A || !B || !C ||
        ((uintptr_t)A | (uintptr_t)B | (uintptr_t)C) % 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (M == 0 || N == 0) return CUDA_SUCCESS;
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)A, b = (CUdeviceptr)(uintptr_t)B, c = (CUdeviceptr)(uintptr_t)C;
    return int8_matmul_launch((CUstream)stream, a, b, c, c, c, c, 1.0f, M, N, K, K, 1, N, 1, N, 1, c, c);
}
"""

_EXAMPLE_NONE = """/* The example needs every op exported (qkernels export-c DIR without --ops). */
int main(void) { return 0; }
"""

# Reads DIR/dims.txt ("M K N") and the raw inputs the Python side wrote, runs each op on one stream, writes the
# outputs next to them, then prints the host time of one w4a16 launch.
_EXAMPLE = r"""#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "qkernels.h"
#include "cuda_kernels.h"

#define CHECK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_; cuGetErrorString(r_, &s_); \
    fprintf(stderr, "%s failed: %s\n", #x, s_); return 1; } } while (0)

static void *slurp(const char *dir, const char *name, size_t n) {
    char path[4096]; snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb"); void *p = malloc(n);
    if (!f || fread(p, 1, n, f) != n) { fprintf(stderr, "cannot read %zu bytes of %s\n", n, path); exit(1); }
    fclose(f); return p;
}

static int spill(const char *dir, const char *name, CUdeviceptr d, size_t n) {
    char path[4096]; snprintf(path, sizeof path, "%s/%s", dir, name);
    void *p = malloc(n); CHECK(cuMemcpyDtoH(p, d, n));
    FILE *f = fopen(path, "wb"); fwrite(p, 1, n, f); fclose(f); free(p); return 0;
}

static CUdeviceptr upload(const void *h, size_t n) {
    CUdeviceptr d; if (cuMemAlloc(&d, n) != CUDA_SUCCESS || cuMemcpyHtoD(d, h, n) != CUDA_SUCCESS) exit(1);
    return d;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s DIR\n", argv[0]); return 2; }
    const char *dir = argv[1];
    int M, K, N; char path[4096]; snprintf(path, sizeof path, "%s/dims.txt", dir);
    FILE *f = fopen(path, "r"); if (!f || fscanf(f, "%d %d %d", &M, &K, &N) != 3) return 2; fclose(f);
    CUdevice dev; CUcontext ctx; CUstream s;
    CHECK(cuInit(0)); CHECK(cuDeviceGet(&dev, 0)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx)); CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    size_t row4 = (size_t)(K + 63) / 64 * 32, groups = (size_t)(K + 127) / 128;
    CUdeviceptr x = upload(slurp(dir, "x.bin", (size_t)M * K * 2), (size_t)M * K * 2);
    CUdeviceptr a = upload(slurp(dir, "a.bin", (size_t)M * K), (size_t)M * K);
    CUdeviceptr w = upload(slurp(dir, "w.bin", (size_t)N * K), (size_t)N * K);
    CUdeviceptr qw = upload(slurp(dir, "qweight.bin", N * row4), N * row4);
    CUdeviceptr sz = upload(slurp(dir, "scale_zero.bin", N * groups * 4), N * groups * 4);
    CUdeviceptr codes, scales, c, y;
    CHECK(cuMemAlloc(&codes, (size_t)M * K)); CHECK(cuMemAlloc(&scales, (size_t)M * 4));
    CHECK(cuMemAlloc(&c, (size_t)M * N * 4)); CHECK(cuMemAlloc(&y, (size_t)M * N * 2));
    CHECK(qk_quantize_int8_rows(s, x, codes, scales, M, K));
    CHECK(qk_int8_matmul(s, a, w, c, M, N, K));
    CHECK(qk_w4a16_gemv(s, x, qw, sz, y, M, N, K));
    CHECK(cuStreamSynchronize(s));
    if (spill(dir, "codes.out", codes, (size_t)M * K) || spill(dir, "scales.out", scales, (size_t)M * 4) ||
        spill(dir, "c.out", c, (size_t)M * N * 4) || spill(dir, "y.out", y, (size_t)M * N * 2)) return 1;
    /* the guide's call: B [K, N], its scales, the default stream */
    CUdeviceptr b_kn = upload(slurp(dir, "b_kn.bin", (size_t)K * N), (size_t)K * N), c_guide;
    CHECK(cuMemAlloc(&c_guide, (size_t)M * N * 4));
    int8_t *d_A = (int8_t *)(uintptr_t)a, *d_B = (int8_t *)(uintptr_t)b_kn;
    int32_t *d_C = (int32_t *)(uintptr_t)c_guide;
    float scale_a = 1.0f / 127.0f, scale_b = 1.0f / 127.0f, scale_c = 1.0f;
    CHECK(int8_matmul_cuda(d_A, d_B, d_C, M, N, K, scale_a, scale_b, scale_c, NULL));
    if (int8_matmul_cuda(d_A, d_B, d_C, M, N, K, scale_a, scale_b, 2.0f, NULL) != CUDA_ERROR_INVALID_VALUE) {
        fprintf(stderr, "int8_matmul_cuda took scale_c = 2\n"); return 1;
    }
    CHECK(cuCtxSynchronize());
    if (spill(dir, "c_guide.out", c_guide, (size_t)M * N * 4)) return 1;
    /* host cost of a launch: median over 21 batches of 100 calls that are not waited for (as bench.harness.host_us) */
    double per[21];
    for (int b = 0; b < 21; b++) {
        struct timespec t0, t1;
        CHECK(cuStreamSynchronize(s));
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < 100; i++) CHECK(qk_w4a16_gemv(s, x, qw, sz, y, M, N, K));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        per[b] = ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3) / 100;
    }
    CHECK(cuStreamSynchronize(s));
    for (int i = 1; i < 21; i++)            /* insertion sort: the median is per[10] */
        for (int j = i; j > 0 && per[j] < per[j - 1]; j--) { double t = per[j]; per[j] = per[j - 1]; per[j - 1] = t; }
    printf("host_us_per_launch %.2f\n", per[10]);
    return 0;
}
"""


"""Shared @triton.jit helpers: exact rounding, fp8 conversion, programmatic dependent launch (_pdl_*) and
split-K reduced inside a kernel (_k_slice, _splitk_fixup).

Rounding. `_rint` rounds half to even with the classic magic-number add: (y + 1.5*2**23) - 1.5*2**23
is exact for |y| < 2**22. Callers clamp y to the integer range first, so this always holds, and the
clamp (a min/max) sits between the multiply that makes y and the add, so the compiler cannot fuse
them into an FMA that would round differently. It runs identically on GPUs and in the Triton
interpreter (whose libdevice has no rint).

FP8. On GPUs with sm_89+ the hardware conversion (round to nearest even, saturating) is used. The
Triton interpreter's numpy fp8 conversion rounds ties away from even, so under the interpreter (and
on older GPUs) `_f32_to_fp8_bits_emulated` computes the same RNE result with exact power-of-two
arithmetic. Both paths return the fp8 bit pattern as uint8.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .._runtime import is_interpreter

# The interpreter's fp32 -> bf16 cast truncates; GPUs round to nearest even. Kernels store through
# `_cast` so both give the same bits.
INTERPRET: tl.constexpr = tl.constexpr(is_interpreter())


@triton.jit
def _cast(x, ty: tl.constexpr):
    """x (fp32) -> ty with round-to-nearest-even on every backend."""
    if INTERPRET:
        if ty == tl.bfloat16:
            b = x.to(tl.uint32, bitcast=True)
            r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            r = tl.where(x != x, b, r)
            return r.to(tl.float32, bitcast=True).to(tl.bfloat16)
    return x.to(ty)


@triton.jit
def _silu_mul_narrow(g, u, DT: tl.constexpr):
    """SwiGLU: silu(g) * u in fp32, rounded to DT (returned in DT); the same bits in every kernel that applies it
    (silu_and_mul, the weight-only GEMV's SWIGLU epilogue)."""
    return _cast(tl.math.div_rn(g, 1.0 + tl.exp(-g)) * u, DT)


@triton.jit
def _pdl_wait(PDL: tl.constexpr, EARLY: tl.constexpr = True):
    """Programmatic dependent launch (Hopper+; launch option launch_pdl, _runtime.pdl_options). A kernel so
    launched may start while the one before it in the stream still runs: this waits until that one has completed
    and its writes are visible (every load of an activation and every store comes after it; only what no kernel of
    this library writes may be fetched before: weights, constant tables, a decode step's positions and lengths),
    then lets the next kernel start its programs. Here, not earlier: a kernel that let the next start before its own
    wait let the whole chain start at once, filling the GPU with programs waiting on their predecessors; nor at the
    end of the main loop, which hides less of the next kernel's start (docs/design/weight-only.md, "Where a kernel
    lets the next start"). Not EARLY: the next kernel starts as this one's programs exit. Decode attention's
    one-split grid (several waves) waits so: the weight-only GEMM after it, started once its last wave had, crowded
    onto the SMs that wave freed first (docs/design/runtime.md). Between the weight-only GEMMs the early start wins
    (docs/design/weight-only.md)."""
    if PDL:
        gdc_wait()
        if EARLY:
            gdc_launch_dependents()


@triton.jit
def _k_slice(K, pid_k, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """[k_lo, k_hi) of program pid_k: K in SPLIT_K BLOCK_K-aligned slices (all of K when SPLIT_K == 1)."""
    if SPLIT_K == 1:
        k_lo = 0
        k_hi = K
    else:
        k_per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = pid_k * k_per
        k_hi = tl.minimum(K, k_lo + k_per)
    return k_lo, k_hi


@triton.jit
def _splitk_fixup(acc, ws_ptr, cnt_ptr, tile, offs, mask, MN, pid_k, SPLIT_K: tl.constexpr):
    """Split-K inside the kernel (no second launch; Gluon twin: weight_only/gluon_shared.py):
    every program stores its partial tile (fp32, or int32 for exact integer GEMVs) to ws_ptr
    [SPLIT_K, M, N] at offs (m * N + n) of its slice pid_k; the last of a tile's SPLIT_K programs to finish
    (cnt_ptr: an int32 counter per tile, zero between launches, acq_rel) adds them in slice order
    (deterministic: the bits do not depend on which program finished last) and resets the counter for the next
    launch. Returns (the sum, whether this program is the tile's last: only then is the sum complete)."""
    # evict_last: the scratch stays in L2 while the weights stream past it (gluon_shared._splitk_fixup_at)
    tl.store(ws_ptr + pid_k.to(tl.int64) * MN + offs, acc, mask=mask, eviction_policy="evict_last")
    tl.debug_barrier()      # the whole tile is stored before the counter says so
    done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = done == SPLIT_K - 1
    if last:
        acc = tl.load(ws_ptr + offs, mask=mask, other=0, cache_modifier=".cg")
        for sk in tl.static_range(1, SPLIT_K):
            acc += tl.load(ws_ptr + sk * MN + offs, mask=mask, other=0, cache_modifier=".cg")
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
    return acc, last


@triton.jit
def _grouped_pid(pid, num_major, num_minor, GROUP: tl.constexpr):
    """Program id -> (major, minor) tile indices in grouped order: GROUP consecutive major tiles walk
    the minor tiles together, so the operand tiles they share stay in L2."""
    width = GROUP * num_minor
    first = (pid // width) * GROUP
    size = tl.minimum(num_major - first, GROUP)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _rint(y):
    return (y + 12582912.0) - 12582912.0


@triton.jit
def _finite_or_zero(x):
    return tl.where(tl.abs(x) < float("inf"), x, 0.0)


@triton.jit
def _f32_to_fp8_bits_emulated(y, MAN: tl.constexpr, BIAS: tl.constexpr):
    # y: fp32, |y| <= the format's max, or NaN.
    ay = tl.abs(y)
    ay = tl.where(ay != ay, 0.0, ay)
    e = ((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, 1 - BIAS)                       # subnormals share the smallest exponent
    inv_quantum = ((127 - (e - MAN)) << 23).to(tl.float32, bitcast=True)   # 2**-(e - MAN)
    r = _rint(ay * inv_quantum).to(tl.int32)          # exact scaling, then RNE to MAN bits
    # (e + BIAS - 1) << MAN plus r encodes normals, subnormals and a carry into the next binade.
    bits = ((e + BIAS - 1) << MAN) + r
    bits = tl.where((y.to(tl.uint32, bitcast=True) >> 31) != 0, bits | 0x80, bits)   # sign bit: -0.0 too
    bits = tl.where(y != y, 0x7F, bits)
    return bits.to(tl.uint8)


@triton.jit
def _f32_to_fp8_bits(y, MAN: tl.constexpr, BIAS: tl.constexpr, EMULATE: tl.constexpr):
    if EMULATE:
        return _f32_to_fp8_bits_emulated(y, MAN, BIAS)
    elif MAN == 3:
        return y.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    else:
        return y.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)


@triton.jit
def _fp8_bits_to_f32(b, MAN: tl.constexpr, BIAS: tl.constexpr, EMULATE: tl.constexpr):
    if EMULATE:
        bi = b.to(tl.int32) & 0xFF
        ef = (bi >> MAN) & ((1 << (7 - MAN)) - 1)
        m = bi & ((1 << MAN) - 1)
        mag = tl.where(ef == 0, m, m + (1 << MAN)).to(tl.float32)
        p = ((tl.maximum(ef, 1) - BIAS - MAN + 127) << 23).to(tl.float32, bitcast=True)
        v = mag * p
        EMAX: tl.constexpr = (1 << (7 - MAN)) - 1
        if MAN == 3:   # e4m3fn: no infinities, S.1111.111 is NaN
            v = tl.where((ef == EMAX) & (m == 7), float("nan"), v)
        else:          # e5m2: IEEE-like
            v = tl.where(ef == EMAX, tl.where(m == 0, float("inf"), float("nan")), v)
        return tl.where(bi >= 128, -v, v)
    elif MAN == 3:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return b.to(tl.float8e5, bitcast=True).to(tl.float32)


@triton.jit
def _pack_nibbles(q, ROWS: tl.constexpr, COLS: tl.constexpr):
    """int32 [ROWS, COLS] -> uint8 [ROWS, COLS // 2]; column 2i in the low nibble."""
    lo, hi = tl.split(tl.reshape(q, (ROWS, COLS // 2, 2)))
    return ((lo & 0xF) | ((hi & 0xF) << 4)).to(tl.uint8)


@triton.jit
def _unpack_nibbles(p, SIGNED: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """uint8 [ROWS, COLS // 2] -> int32 [ROWS, COLS]."""
    p = p.to(tl.int32)
    if SIGNED:
        lo = (p << 28) >> 28
        hi = (p << 24) >> 28
    else:
        lo = p & 0xF
        hi = (p >> 4) & 0xF
    return tl.reshape(tl.join(lo, hi), (ROWS, COLS))

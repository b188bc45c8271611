"""Private Triton kernel of the W4A8-FP8 linear: 4-bit weights in the PackedWeight layout, activations already
quantized per token to float8_e4m3fn, FP8 tensor cores. Launcher: ops/w4a8.py. Reference: reference.w4a8_linear.

A 4-bit code u in the low nibble of a byte whose high nibble is 0 is, read as an e4m3 bit pattern, exactly
u * 2**-9: codes 0-7 are the format's subnormals m * 2**-9, codes 8-15 have exponent field 1 and mantissa u - 8,
(1 + (u - 8) / 8) * 2**-6 = u * 2**-9. So the codes go to the tensor cores after one AND (low nibbles) or one
shift (high nibbles) per four weights, with no conversion. The zero point leaves the product instead: per
group, sum_k x_k (u_k - z) = sum_k x_k u_k - z sum_k x_k, the x sum over the group's k taken from the same fp8
codes the MMA reads. The group's product and that sum are exact in fp32 (e4m3 times a 4-bit integer, added up
within the group), and the group scale is applied once per group on the fp32 tile:

    acc += scale[n, g] * (512 * P_g[m, n] - zero[n, g] * S_g[m]),   out = acc * x_scale[m] (+ bias).

PackedWeight's 4-bit layout keeps k and k + 32 of each 64-k chunk in one byte, so a chunk is two MMAs of depth 32
(the low nibbles against x[k .. k + 31], the high against x[k + 32 .. k + 63]): no interleaving.
"""
import triton
import triton.language as tl

from ._common import INTERPRET, _fp8_bits_to_f32, _grouped_pid, _k_slice, _pdl_wait, _splitk_fixup


@triton.jit
def _as_fp8(b):
    """uint8 e4m3 bit patterns -> an MMA operand (the interpreter: their exact fp32 values)."""
    if INTERPRET:
        return _fp8_bits_to_f32(b, 3, 7, True)
    return b.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _group_scale_zero(sz_row, g0, GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr, st: tl.constexpr):
    """(scale, zero point) in fp32 of the group starting at k = g0, per row of sz_row."""
    if PER_CHANNEL:
        szw = tl.load(sz_row)
    else:
        szw = tl.load(sz_row + g0 // GROUP)
    s = (szw & 0xFFFF).to(tl.uint16).to(st, bitcast=True).to(tl.float32)
    z = ((szw >> 16) & 0xFFFF).to(tl.uint16).to(st, bitcast=True).to(tl.float32)
    return s, z


@triton.jit
def _w4a8_kernel(x_ptr, xs_ptr, w_ptr, sz_ptr, bias_ptr, out_ptr, ws_ptr, cnt_ptr, M, N, K,
                 stride_xm, stride_wn, stride_sn, stride_om,
                 GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr, PER_CHANNEL: tl.constexpr = False, SWAP: tl.constexpr = False,
                 SPLIT_K: tl.constexpr = 1, PDL: tl.constexpr = False):
    """out tile (pid_m, pid_n) of program_id(0); program_id(1): K slice (whole groups) under SPLIT_K > 1, the
    tile's last program adding the slices' fp32 partials in slice order. x_ptr: [M, K] e4m3 bits (uint8), xs_ptr:
    [M] fp32 per-token scales; w_ptr: [N, K / 2] PackedWeight codes; sz_ptr: [N, K / GROUP] (scale, zero) words
    of two fp16 / bf16 halves (PER_CHANNEL: one a row, the tile promoted every GROUP k all the same). K and GROUP
    multiples of 64 (the launcher's checks)."""
    pid = tl.program_id(0)
    pid_m, pid_n = _grouped_pid(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    k_lo, k_hi = _k_slice(K, tl.program_id(1), GROUP, SPLIT_K)
    st: tl.constexpr = sz_ptr.dtype.element_ty

    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M       # wrapped rows: no masks on the loads
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_m = tl.max_contiguous(tl.multiple_of(offs_m, BLOCK_M), BLOCK_M)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, BLOCK_N), BLOCK_N)
    h = tl.arange(0, 32)
    s32 = sz_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    sz_row = s32 + offs_n.to(tl.int64) * stride_sn
    _pdl_wait(PDL)
    if SWAP:     # out^T = W x^T: the weight tile is the MMA's M side (64 / 128 rows), x's rows its N side
        w_row = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + h[None, :]           # [BLOCK_N, 32]
        x_col = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + h[:, None]           # [32, BLOCK_M]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for g0 in range(k_lo, k_hi, GROUP):
            p = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            xsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for c in tl.static_range(GROUP // 64):
                k0 = g0 + 64 * c
                wb = tl.load(w_row + k0 // 2)
                fl = _as_fp8(tl.load(x_col + k0))
                fh = _as_fp8(tl.load(x_col + k0 + 32))
                p = tl.dot(_as_fp8(wb & 0xF), fl, p, out_dtype=tl.float32)
                p = tl.dot(_as_fp8(wb >> 4), fh, p, out_dtype=tl.float32)
                xsum += tl.sum(fl.to(tl.float32), axis=0) + tl.sum(fh.to(tl.float32), axis=0)
            s, z = _group_scale_zero(sz_row, g0, GROUP, PER_CHANNEL, st)
            acc += s[:, None] * (512.0 * p - z[:, None] * xsum[None, :])
        acc = tl.trans(acc)
    else:
        x_lo = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + h[None, :]            # [BLOCK_M, 32]
        w_col = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + h[:, None]           # [32, BLOCK_N]: B = W^T
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for g0 in range(k_lo, k_hi, GROUP):
            p = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            xsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for c in tl.static_range(GROUP // 64):
                k0 = g0 + 64 * c
                wb = tl.load(w_col + k0 // 2)
                fl = _as_fp8(tl.load(x_lo + k0))
                fh = _as_fp8(tl.load(x_lo + k0 + 32))
                p = tl.dot(fl, _as_fp8(wb & 0xF), p, out_dtype=tl.float32)
                p = tl.dot(fh, _as_fp8(wb >> 4), p, out_dtype=tl.float32)
                xsum += tl.sum(fl.to(tl.float32), axis=1) + tl.sum(fh.to(tl.float32), axis=1)
            s, z = _group_scale_zero(sz_row, g0, GROUP, PER_CHANNEL, st)
            acc += s[None, :] * (512.0 * p - z[None, :] * xsum[:, None])

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    last = True
    if SPLIT_K > 1:
        acc, last = _splitk_fixup(acc, ws_ptr, cnt_ptr, pid, rows[:, None].to(tl.int64) * N + cols[None, :], mask,
                                  M * N, tl.program_id(1), SPLIT_K)
    if last:
        out = acc * tl.load(xs_ptr + rows % M)[:, None]
        if HAS_BIAS:
            out += tl.load(bias_ptr + cols % N).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)

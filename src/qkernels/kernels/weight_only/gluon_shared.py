"""What the Gluon weight-only kernels (tc.py, wg.py, gv.py, gvt.py; and kernels/_gemv_mma.py) share: free views of
32-bit words as bytes or 16-bit halves (identity asm: no instructions), the split-K slices and fix-up (the Gluon twin
of _common._splitk_fixup) and programmatic dependent launch (the twin of _common._pdl_wait)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import schemes

PER_CHANNEL: gl.constexpr = gl.constexpr(schemes.PER_CHANNEL)   # GROUP of one group per row


@gluon.jit
def _bytes_of(w, layout: gl.constexpr, dt: gl.constexpr = None):
    """int32 words [R, C] -> their bytes [R, 4 C] (little endian) as uint8, or with dt float8e4nv as e4m3 values,
    in `layout`: each word joined with itself twice (the new axes become register bits 0, 1), then an identity asm
    whose 4 inputs are those 4 copies and whose packed output is the word itself: no instructions."""
    R: gl.constexpr = w.shape[0]
    C: gl.constexpr = w.shape[1]
    w4 = gl.reshape(gl.join(gl.join(w, w), gl.join(w, w)), [R, 4 * C])
    if dt == gl.float8e4nv:
        b = gl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r,r,r,r", args=[w4],
                                      dtype=gl.float8e4nv, is_pure=True, pack=4)
    else:
        b = gl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r,r,r,r", args=[w4], dtype=gl.uint8,
                                      is_pure=True, pack=4)
    return gl.convert_layout(b, layout, assert_trivial=True)


@gluon.jit
def _halves_of(w, dt: gl.constexpr, layout: gl.constexpr):
    """int32 words [R, C] -> the 16-bit values they hold [R, 2 C] as dt, in `layout` (no instructions)."""
    R: gl.constexpr = w.shape[0]
    C: gl.constexpr = w.shape[1]
    w2 = gl.reshape(gl.join(w, w), [R, 2 * C])
    if dt == gl.bfloat16:
        h = gl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r,r", args=[w2], dtype=gl.bfloat16,
                                      is_pure=True, pack=2)
    else:
        h = gl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r,r", args=[w2], dtype=gl.float16,
                                      is_pure=True, pack=2)
    return gl.convert_layout(h, layout, assert_trivial=True)


@gluon.jit
def _splitk_fixup(acc, ws_ptr, cnt_ptr, tile, on, om, mask, M, N, SPLIT_K: gl.constexpr):
    """Split-K fix-up inside the kernel (no second launch), shared by the tc and wg kernels, for a partial tile
    [BLOCK_N, BLOCK_M] (weight rows on, x rows om): see _splitk_fixup_at."""
    offs = om.to(gl.int64)[None, :] * N + on[:, None]
    return _splitk_fixup_at(acc, ws_ptr, cnt_ptr, tile, offs, mask, M * N, SPLIT_K)


@gluon.jit
def _splitk_fixup_at(acc, ws_ptr, cnt_ptr, tile, offs, mask, MN, SPLIT_K: gl.constexpr):
    """Split-K fix-up for a partial tile of any shape: offs (int64) = x row * N + weight row of each element of
    acc, mask its valid elements, MN = M * N. Every program stores its fp32 partial to slice program_id(1) of
    ws_ptr [SPLIT_K, M, N]; the last of a tile's SPLIT_K programs to finish (cnt_ptr: an int32 counter per tile,
    zero between launches, acq_rel) adds them in slice order (deterministic) and resets the counter for the next
    launch. Returns (the sum, whether this program is the tile's last: only then is the sum complete)."""
    # evict_last: the scratch stays in L2 while the weights stream past it, instead of going to DRAM and back each
    # call (measured on the H100; the log is in the repository history)
    gl.store(ws_ptr + gl.program_id(1).to(gl.int64) * MN + offs, acc, mask=mask, eviction_policy="evict_last")
    gl.thread_barrier()     # the whole tile is stored before the counter says so
    done = gl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = done == SPLIT_K - 1
    if last:
        acc = gl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
        for sk in range(1, SPLIT_K):
            acc += gl.load(ws_ptr + sk * MN + offs, mask=mask, other=0.0, cache_modifier=".cg")
        gl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
    return acc, last


@gluon.jit
def _splitk_fixup_tiles(out0, out1, ws_ptr, cnt_ptr, tile, tok, row, ok_row, M, N, MT: gl.constexpr,
                        SPLIT_K: gl.constexpr):
    """_splitk_fixup_at for the tensor-core GEMVs' (gvt.py, kernels/_gemv_mma.py) partial sums of one or two x tiles
    (out0: x rows tok, out1 with MT == 2: x rows tok + 8; weight rows row, ok_row: they exist), fixed up as one
    tensor. Returns (out0, out1, whether this program is the tile's last: only then are the sums complete)."""
    if MT == 2:
        acc = gl.join(out0, out1)
        toks = gl.join(tok, tok + 8)
        rows = gl.join(row, row)
        oks = gl.join(ok_row, ok_row)
    else:
        acc = out0
        toks = tok
        rows = row
        oks = ok_row
    acc, last = _splitk_fixup_at(acc, ws_ptr, cnt_ptr, tile, toks.to(gl.int64) * N + rows, (toks < M) & oks, M * N,
                                 SPLIT_K)
    if MT == 2:
        out0, out1 = gl.split(acc)
        out0 = gl.convert_layout(out0, row.type.layout, assert_trivial=True)
        out1 = gl.convert_layout(out1, row.type.layout, assert_trivial=True)
    else:
        out0 = acc
    return out0, out1, last


@gluon.jit
def _tile_sums(acc0, acc1, ws_ptr, cnt_ptr, pid_n, tok, row, ok_row, M, N, MT: gl.constexpr, SPLIT_K: gl.constexpr):
    """The tensor-core GEMVs' accumulators [TILES, 8, 4, 4, e] summed over their in-thread axis, then with SPLIT_K > 1
    fixed up across the K slices (_splitk_fixup_tiles; tile program_id(2) * num_programs(0) + pid_n). Returns
    (out0, out1, whether the sums are complete in this program); out1 is the second x tile's where MT == 2."""
    out0 = gl.sum(acc0, axis=3)
    out1 = out0
    if MT == 2:
        out1 = gl.sum(acc1, axis=3)
    last = True
    if SPLIT_K > 1:
        out0, out1, last = _splitk_fixup_tiles(out0, out1, ws_ptr, cnt_ptr,
                                               gl.program_id(2) * gl.num_programs(0) + pid_n, tok, row, ok_row, M, N,
                                               MT, SPLIT_K)
    return out0, out1, last


@gluon.jit
def _k_slice(K, STEP: gl.constexpr, SPLIT_K: gl.constexpr):
    """[k_lo, k_hi) of this program's K slice: all of K, or with SPLIT_K > 1 slice program_id(1) of equal runs of
    whole STEP-k steps (the last one cut at K)."""
    if SPLIT_K == 1:
        return 0, K
    k_per = gl.cdiv(gl.cdiv(K, STEP), SPLIT_K) * STEP
    k_lo = gl.program_id(1) * k_per
    return k_lo, gl.minimum(K, k_lo + k_per)


@gluon.jit
def _pdl_wait(PDL: gl.constexpr):
    """Wait until the kernel before in the stream has completed and its writes are visible (every load of an
    activation, every store and every touch of the split-K scratch comes after this), then let the next kernel
    start its programs (see _common._pdl_wait)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()

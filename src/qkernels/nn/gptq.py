"""GPTQ: weight-only quantization that compensates each column's rounding error in the columns not yet
quantized, weighted by the layer's input statistics (Frantar et al., 2022).

For a linear y = x W^T and calibration inputs X, the layer-output error of a quantized weight Q is
||X (W - Q)^T||^2 = sum_n (w_n - q_n) H (w_n - q_n)^T with H = X^T X. GPTQ quantizes the columns in
order; after column j it adds to the remaining columns the change that minimizes this error given q_j,
which needs only row j of the upper Cholesky factor U of H^-1:
    e = (w_j - q_j) / U[j, j];   W[:, j+1:] -= e U[j, j+1:].
Updates are applied lazily, a block of columns at a time (one matrix product per block). H is dampened
(+ damp * mean(diag H) on the diagonal) so the factorization exists; input channels that never fired
(H[j, j] = 0) carry no information and quantize to zero.

Quantization grid: min-max per group, the numerics of PackedWeight.from_float (scales rounded to the
stored dtype before the codes are chosen). A group's scale and zero point are taken from the weights
as they stand when its first column is reached (already error-updated), or, with static_groups, from
the original weights. act_order quantizes the columns in order of decreasing H[j, j] (the most active
inputs first); the groups then follow that order, which PackedWeight stores as its `perm` (the kernels
gather x), unless static_groups keeps the original groups (no permutation at inference).

`gptq_weight` does one matrix; `gptq_(model, calibration, ...)` walks a decoder model layer by layer
(nn.calibrate): within a decoder layer the linears are taken in the order of the computation (q/k/v,
o, gate/up, down), so each sees the outputs of those quantized before it; linears that share their input
share H and are quantized as one stacked matrix (with act_order: one permutation, so q|k|v and gate|up
still merge into single GEMMs in the runtime).
quantize_(model, "w4a16", method="gptq", calibration=...) is the usual entry point.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .. import reference as ref
from ..formats import get_format
from ..packed_weight import PackedWeight, _check_group, num_groups
from ..schemes import PER_CHANNEL


class Hessian:
    """Running H = 2 / n sum x x^T of a linear's inputs (fp32), fed by a forward hook."""

    def __init__(self, K: int, device):
        self.H = torch.zeros(K, K, dtype=torch.float32, device=device)
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        m = x.shape[0]
        if m == 0:
            return
        self.H.mul_(self.n / (self.n + m))
        self.n += m
        x = x * (2.0 / self.n) ** 0.5
        self.H.addmm_(x.t(), x)


SHRINK_STEPS, MAX_SHRINK, NORM = 20, 0.25, 2.4    # the grid search: ranges down to 75%, error |w - q|^2.4


def _grid(cols: torch.Tensor, bits: int, symmetric: bool, scale_dtype: torch.dtype, search: bool = False):
    """(scale [N], zero [N] or None) of the column block cols [N, L] (fp32): min-max as PackedWeight.from_float,
    the scale rounded to its stored dtype. search: the range shrunk by the factor in 1, 0.9875, ..., 0.75 that
    gives each row the least sum |w - q(w)|^2.4 (large errors weigh more than under the mean square)."""
    fmt = get_format("int4" if bits == 4 else "int8")
    s, zp = ref.compute_scale(cols, fmt, symmetric)
    s, z = s.to(scale_dtype).float(), (zp.float() if zp is not None else None)
    if not search:
        return s, z
    best = _round_err(cols, s, z, bits)
    lo = torch.clamp_max(cols.amin(1), 0.0)
    hi = torch.clamp_min(cols.amax(1), 0.0)
    for i in range(1, SHRINK_STEPS + 1):
        f = 1 - MAX_SHRINK * i / SHRINK_STEPS
        shrunk = torch.stack((lo * f, hi * f), 1)       # a block whose min-max is the shrunk range
        s2, zp2 = ref.compute_scale(shrunk, fmt, symmetric)
        s2, z2 = s2.to(scale_dtype).float(), (zp2.float() if zp2 is not None else None)
        err = _round_err(cols, s2, z2, bits)
        better = err < best
        best = torch.where(better, err, best)
        s = torch.where(better, s2, s)
        if z is not None:
            z = torch.where(better, z2, z)
    return s, z


def _round_err(cols, s, z, bits):
    _, d = _round(cols, s[:, None], z[:, None] if z is not None else None, bits)
    return (cols - d).abs().pow(NORM).sum(1)


def _round(w: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None, bits: int):
    """Codes and dequantized values of one column w [N] (the numerics of reference.quantize_values):
    unsigned codes u = round(clamp(w / s, -z, qmax - z)) + z, or signed q = round(clamp(w / s, qmin, qmax))."""
    inv = ref._div(torch.ones_like(s), s)
    if z is None:
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        q = torch.round(torch.clamp(w * inv, lo, hi))
        return q + 2 ** (bits - 1), q * s
    q = torch.round(torch.minimum(torch.maximum(w * inv, -z), (2 ** bits - 1) - z))
    return q + z, q * s


@torch.no_grad()
def gptq_weight(weight: torch.Tensor, H: torch.Tensor, bits: int = 4, group_size: int = 128, symmetric: bool = False,
                *, act_order: bool = False, static_groups: bool = False, search_grid: bool = True, damp: float = 0.01,
                block_size: int = 128, scale_dtype: torch.dtype | None = None,
                consume_h: bool = False) -> tuple[PackedWeight, torch.Tensor]:
    """GPTQ of one weight [N, K] given its input Hessian H [K, K] (Hessian.H). Returns (the PackedWeight,
    the dequantized weight [N, K] in weight's dtype and input order: what the quantized layer computes).
    scale_dtype: float16 / bfloat16, default the weight's (float16 for fp32 weights). consume_h: H may be
    overwritten (saves a copy of a K x K matrix)."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits!r}")
    if weight.dim() != 2 or not weight.dtype.is_floating_point:
        raise ValueError(f"weight must be a 2-D float tensor [N, K], got {weight.dtype} {tuple(weight.shape)}")
    N, K = weight.shape
    if tuple(H.shape) != (K, K):
        raise ValueError(f"H must be [K, K] = [{K}, {K}] (the input Hessian), got {tuple(H.shape)}")
    if not 0.0 < damp < 1.0:
        raise ValueError(f"damp must be in (0, 1), got {damp!r}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size!r}")
    G = _check_group(group_size, K, bits)
    sdt = scale_dtype or (weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.float16)
    W = weight.detach().float().clone()
    H = H.detach().to(W.device, torch.float32)
    if not consume_h:
        H = H.clone()
    dead = H.diagonal() == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    ng = num_groups(group_size, K)
    # per group g (rows of these [ng, N] tables): scale, 1 / scale (correctly rounded, as reference.quantize),
    # and the clamp bounds of the signed code q = u - zero
    S = torch.empty(ng, N, dtype=torch.float32, device=W.device)
    Z = None if symmetric else torch.empty(ng, N, dtype=torch.float32, device=W.device)
    INV, LO, HI = torch.empty_like(S), torch.empty_like(S), torch.empty_like(S)

    def set_group(g, cols):
        s, z = _grid(cols, bits, symmetric, sdt, search_grid)
        S[g], INV[g] = s, ref._div(torch.ones_like(s), s)
        if Z is None:
            LO[g], HI[g] = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        else:
            Z[g], LO[g], HI[g] = z, -z, (2 ** bits - 1) - z

    dynamic = not (static_groups or group_size == PER_CHANNEL)
    if not dynamic:       # every group's grid from the original weights, input order
        for g in range(ng):
            set_group(g, W[:, g * G:(g + 1) * G])
    perm = torch.argsort(H.diagonal(), descending=True, stable=True) if act_order else None
    if perm is not None:
        W = W[:, perm]
        H = H.index_select(0, perm)
        H = H.index_select(1, perm)
    U = _inverse_factor(H, damp)
    del H
    rdiag = 1.0 / U.diagonal()
    Q = torch.empty(N, K, dtype=torch.float32, device=W.device)         # signed codes q = u - zero
    col_group = (perm if perm is not None and not dynamic else torch.arange(K, device=W.device)) // G
    groups = col_group.tolist()
    B = block_size
    for i1 in range(0, K, B):
        i2 = min(i1 + B, K)
        W1 = W[:, i1:i2].clone()
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            if dynamic and j % G == 0:
                # the group's grid from its columns as they stand now (inside this block: W1 holds the updates)
                set_group(j // G, W1[:, i:i + G] if G <= B else W[:, j:j + G])
            g = groups[j]
            w = W1[:, i]
            q = torch.clamp(w * INV[g], LO[g], HI[g]).round_()
            Q[:, j] = q
            e = torch.addcmul(w, q, S[g], value=-1.0).mul_(rdiag[j])            # (w - q s) / U[j, j]
            W1[:, i + 1:].addr_(e, U1[i, i + 1:], alpha=-1.0)                   # compensate the columns after j
        # W1[:, i] kept each column's value when it was quantized: the block's errors in one product
        E = (W1 - Q[:, i1:i2] * S[col_group[i1:i2]].t()).mul_(rdiag[i1:i2])
        W[:, i2:].addmm_(E, U[i1:i2, i2:], alpha=-1.0)
    del W, U
    # codes and the dequantized weight, block by block (no second full fp32 copy)
    codes = torch.empty(N, K, dtype=torch.uint8, device=Q.device)
    dq = torch.empty(N, K, dtype=weight.dtype, device=Q.device)
    for i1 in range(0, K, B):
        cg = col_group[i1:i1 + B]
        q = Q[:, i1:i1 + B]
        dq[:, i1:i1 + B] = q * S[cg].t()
        codes[:, i1:i1 + B] = (q + (Z[cg].t() if Z is not None else 2 ** (bits - 1))).to(torch.uint8)
    del Q
    if perm is not None:
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(K, device=perm.device)
        dq = dq[:, inv]
        if not dynamic:        # groups in input order: store the codes in input order, no permutation
            codes, perm = codes[:, inv], None
    qweight = ref.pack_weight_codes(codes, bits).contiguous()
    zeros = None if Z is None else Z.t().to(sdt)
    pw = PackedWeight.from_parts(qweight, S.t().to(sdt), zeros, bits, group_size, (N, K), perm)
    return pw, dq


def _rows(pw: PackedWeight, start: int, n: int) -> PackedWeight:
    """Rows [start, start + n) of a packed weight (output channels are independent)."""
    if start == 0 and n == pw.shape[0]:
        return pw
    return PackedWeight(pw.qweight[start:start + n].contiguous(), pw.scale_zero[start:start + n].contiguous(),
                        pw.bits, pw.group_size, (n, pw.shape[1]), pw.perm, pw.symmetric, pw.int_zeros)


def _inverse_factor(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damping)^-1 (H's diagonal is changed); the damping grows tenfold (up to
    1.0 x mean(diag H)) while H is not numerically positive definite."""
    diag = H.diagonal().clone()
    mean = diag.mean()
    d = damp
    while True:
        H.diagonal().copy_(diag + d * mean)
        L, info = torch.linalg.cholesky_ex(H)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            del L
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0:
                return U
        if d >= 1.0:
            raise RuntimeError(f"GPTQ: the input Hessian stays singular with damping {d} x mean(diag H); the "
                               f"calibration inputs of this layer carry no usable signal")
        d = min(1.0, d * 10)


# the linears of a Llama / Qwen / Mistral-style decoder layer in the order of the computation; the names in
# one tuple share their input
SEQUENTIAL = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
              ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",))


def _stages(layer: nn.Module, wanted: Callable[[str, nn.Linear], bool], prefix: str) -> list[list[str]]:
    """The layer's linears to quantize, grouped by SEQUENTIAL where the names match; any other linears
    follow, one stage each."""
    lins = {n: m for n, m in layer.named_modules() if isinstance(m, nn.Linear) and wanted(f"{prefix}.{n}", m)}
    stages, seen = [], set()
    for names in SEQUENTIAL:
        st = [n for n in names if n in lins]
        if st:
            stages.append(st)
            seen.update(st)
    stages += [[n] for n in lins if n not in seen]
    return stages


@torch.no_grad()
def gptq_(model: nn.Module, calibration, bits: int = 4, group_size: int = 128, symmetric: bool = False, *,
          wanted: Callable[[str, nn.Linear], bool] = lambda name, mod: True, act_order: bool = False,
          static_groups: bool = False, search_grid: bool = True, damp: float = 0.01, block_size: int = 128, device=None,
          scale_dtype: torch.dtype | None = None, progress: bool = False) -> dict[str, PackedWeight]:
    """GPTQ every linear of the model's decoder layers for which wanted(qualified name, module) holds
    (walked with nn.calibrate.walk_layers; calibration: token ids [batch, seq] or an iterable of them).
    Each quantized linear's float weight is replaced by its dequantized value in place, so later layers
    calibrate on the quantized model's activations. Returns {qualified name: PackedWeight} (on the layer's
    device), which quantize_ turns into QuantizedLinear modules."""
    from .calibrate import walk_layers
    out: dict[str, PackedWeight] = {}
    home = next(model.parameters()).device       # results wait there, not on the calibration device

    def visit(prefix: str, layer: nn.Module, run):
        for stage in _stages(layer, wanted, prefix):
            mods = [layer.get_submodule(n) for n in stage]
            hess = Hessian(mods[0].in_features, mods[0].weight.device)
            hook = mods[0].register_forward_pre_hook(lambda m, args: hess.add(args[0]))
            try:
                run()
            finally:
                hook.remove()
            # the stage's linears share H (and so act-order's permutation): one GPTQ over their stacked rows
            w = torch.cat([m.weight for m in mods]) if len(mods) > 1 else mods[0].weight
            H, hess.H = hess.H, None            # gptq_weight consumes it: no second K x K copy
            pw, dq = gptq_weight(w, H, bits, group_size, symmetric, act_order=act_order,
                                 static_groups=static_groups, search_grid=search_grid, damp=damp,
                                 block_size=block_size, scale_dtype=scale_dtype, consume_h=True)
            del H
            rows = 0
            for n, m in zip(stage, mods):
                m.weight.copy_(dq[rows:rows + m.out_features])
                out[f"{prefix}.{n}"] = _rows(pw, rows, m.out_features).to(home)
                rows += m.out_features

    walk_layers(model, calibration, visit, device, progress="gptq" if progress else None)
    return out

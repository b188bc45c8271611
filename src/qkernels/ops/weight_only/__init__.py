"""Weight-only quantized linears: W4A16 and W8A16 (fp16 / bf16 activations, 4- or 8-bit weights).

One op (qkernels::weight_only_linear), five kernel paths picked by M from the per-GPU config table:
  dispatch.py  which path and config run a call (the rules; force_path / use_config for tests and tuners)
  launch.py    launch plans, split-K workspaces and counters, TMA descriptors
SPLIT_K > 1 in a config splits K over programs when the grid is small (up to SPLIT_K ways, only while the grid
has fewer than MIN_PROGRAMS programs); every kernel adds the partials up itself (the last program of an output
tile, in slice order). On Hopper the GEMV is launched with programmatic dependent launch
(_runtime.pdl_options): it fetches its first weight step while the kernel before it finishes. The tensor-core
kernels are not (docs/design/runtime.md: early-launched programs of a one-wave GEMM crowd onto the SMs the kernel
before leaves free). Kernels: kernels/weight_only/. Reference: reference.weight_only_linear.
"""
from __future__ import annotations

import functools
import math

import torch

from ... import autotune, configs
from ... import reference as ref
from ..._runtime import (call_op, check_kernel_device, check_same_device, check_tensor, device_name, gpu_slug,
                         is_interpreter, next_pow2, register_twin)
from ...packed_weight import PackedWeight
from .dispatch import (_FORCED_CONFIG, PATHS, SUPPORTED, TC_DEFAULT, TC_K, WG_DEFAULT, WG_K, config_for, force_path,
                       forced_path, gv_supported, gvt_supported, path_config, tc_supported, use_config,
                       wg_supported)
from .._eager import planned, plans_of
from .launch import run_config

__all__ = ["w4a16_linear", "w8a16_linear", "PATHS", "force_path", "use_config", "config_for", "tc_supported",
           "wg_supported", "gv_supported", "gvt_supported", "TC_DEFAULT", "WG_DEFAULT", "TC_K", "WG_K", "SUPPORTED"]

X_DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# custom op


def _weight_only_impl(x: torch.Tensor, qweight: torch.Tensor, scale_zero: torch.Tensor,
                      bias: torch.Tensor | None, bits: int, group_size: int, int_zeros: bool,
                      swiglu: bool = False) -> torch.Tensor:
    """x [M, K] with contiguous rows, qweight / scale_zero in the PackedWeight layout (contiguous), group_size:
    the PackedWeight's (PER_CHANNEL: one group per row); int_zeros: every zero point an integer in [0, 2**bits]
    (PackedWeight.int_zeros: lets the kernels fold their conversion constant into them). The config comes from
    the table by M (dispatch.config_for), or from force_path / use_config where a test or tuner pinned one.
    swiglu: the weight is a merged [gate; up] projection; the result is silu(gate) * up [M, N / 2] (run_config)."""
    M, K = x.shape
    N = qweight.shape[0]
    if x.stride(1) != 1:
        x = x.contiguous()     # the kernels read x rows as contiguous runs (vector loads, async copies)
    if scale_zero.data_ptr() % 4 or not scale_zero.is_contiguous():
        scale_zero = scale_zero.contiguous().clone()   # the kernels read each (scale, zero) as one 32-bit word
    if M == 0 or N == 0 or K == 0:    # empty product: zeros (+ bias)
        out = torch.zeros((M, N), dtype=torch.float32, device=x.device)
        out = (out + bias.float() if bias is not None else out).to(x.dtype)
        if swiglu:
            from ..fused import silu_and_mul
            out = silu_and_mul(out) if M and N else out[:, :N // 2]
        return out
    cfg = config_for(bits, M, N, K, x.device)
    path = forced_path()
    if path is not None:
        cfg = path_config(cfg, path, bits, N, K, x.device)
    elif cfg is None:    # a GPU without a shipped table: tune once per (M bucket, N, K, group_size), cached on disk
        bucket = next_pow2(M)
        cfg = autotune.tuned(gpu_slug(device_name(x.device)), f"w{bits}a16:M{bucket}:N{N}:K{K}:g{group_size}",
                             configs.candidates(f"w{bits}a16", bucket, configs.DEFAULT_WEIGHT_ONLY),
                             functools.partial(run_config, x, qweight, scale_zero, bias, bits, group_size, int_zeros))
    return run_config(x, qweight, scale_zero, bias, bits, group_size, int_zeros, cfg, swiglu)


_weight_only_op = torch.library.custom_op("qkernels::weight_only_linear", mutates_args=())(_weight_only_impl)


def _weight_only_twin(x, qweight, scale_zero, bias, bits, group_size, int_zeros, swiglu=False):
    y = ref.weight_only_linear(x, qweight, scale_zero[..., 0], scale_zero[..., 1], bits, group_size, None, bias)
    return ref.silu_and_mul(y)[0] if swiglu else y


register_twin(_weight_only_op, _weight_only_twin)


@_weight_only_op.register_fake
def _(x, qweight, scale_zero, bias, bits, group_size, int_zeros, swiglu=False):
    return x.new_empty((x.shape[0], qweight.shape[0] // 2 if swiglu else qweight.shape[0]))


# ---------------------------------------------------------------------------------------------
# public API


def _weight_only(x: torch.Tensor, w: PackedWeight, bias: torch.Tensor | None, bits: int, name: str,
                 swiglu: bool = False) -> torch.Tensor:
    qweight = getattr(w, "qweight", None)
    if (w.__class__ is PackedWeight and w.bits == bits and bias is None and w.perm is None
            and x.__class__ is torch.Tensor and x.dim() and x.dtype in X_DTYPES and x.shape[-1] == w.shape[1]
            and x.device == qweight.device and (x.is_cuda or is_interpreter()) and not (swiglu and w.shape[0] % 2)):
        # the common call (no bias, no act-order, where kernels run) validated in a few checks; anything else goes
        # through the full checks below, which name what is wrong
        return _call(x, w, bits, swiglu)
    if not isinstance(w, PackedWeight):
        raise TypeError(f"w_packed must be a qkernels.PackedWeight (see PackedWeight.from_float / from_gptq / "
                        f"from_awq), got {type(w).__name__}")
    if w.bits != bits:
        raise ValueError(f"{name} needs a {bits}-bit PackedWeight, got bits={w.bits} (use w{w.bits}a16_linear)")
    check_tensor("x", x, dtypes=X_DTYPES, ndim_min=1)
    check_kernel_device("x", x)
    N, K = w.shape
    check_same_device("x", x, w_packed=w.qweight, bias=bias)
    if x.shape[-1] != K:
        raise ValueError(f"x's last dim must be the weight's in_features K={K}, got x.shape={tuple(x.shape)}")
    if bias is not None:
        check_tensor("bias", bias, dtypes=X_DTYPES + (torch.float32,))
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    if swiglu and N % 2:
        raise ValueError(f"swiglu=True takes a merged [gate; up] weight with an even number of rows, got N={N}")
    M = math.prod(x.shape[:-1])
    x2 = x.reshape(M, K)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    out = call_op(_weight_only_op, _weight_only_impl, x2, w.qweight, w.scale_zero, bias, bits, w.group_size,
                  w.int_zeros, swiglu)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _call(x: torch.Tensor, w: PackedWeight, bits: int, swiglu: bool) -> torch.Tensor:
    """The op on x as [M, K] (no bias, no act-order), out shaped like x; an eager call replays the launch of the
    first call like it (ops/_eager.py; the plans kept on w)."""
    def run():
        x2 = x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])
        out = call_op(_weight_only_op, _weight_only_impl, x2, w.qweight, w.scale_zero, None, bits, w.group_size,
                      w.int_zeros, swiglu)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])
    if torch.compiler.is_compiling() or not x.is_cuda:
        return run()
    return planned(plans_of(w), (x.shape, x.dtype, x.device, bits, swiglu), x, run,
                   (w.qweight, w.scale_zero), (forced_path(), _FORCED_CONFIG[0]))


def w4a16_linear(x: torch.Tensor, w_packed: PackedWeight, bias: torch.Tensor | None = None, *,
                 swiglu: bool = False) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W a 4-bit PackedWeight (group-wise or per-channel, symmetric or with zero
    points, optionally act-ordered). x: float16 / bfloat16 [..., K]; output in x's dtype, fp32 accumulation.
    swiglu: W is an MLP's merged [gate; up] projection (2 I rows) and the result is silu(gate) * up [..., I]
    (the bits of y followed by silu_and_mul); at decode sizes the GEMV applies it in its epilogue."""
    return _weight_only(x, w_packed, bias, 4, "w4a16_linear", swiglu)


def w8a16_linear(x: torch.Tensor, w_packed: PackedWeight, bias: torch.Tensor | None = None, *,
                 swiglu: bool = False) -> torch.Tensor:
    """y = x @ W.T (+ bias) with W an 8-bit PackedWeight (typically per output channel, group_size=-1).
    x: float16 / bfloat16 [..., K]; output in x's dtype, fp32 accumulation. swiglu: as w4a16_linear."""
    return _weight_only(x, w_packed, bias, 8, "w8a16_linear", swiglu)

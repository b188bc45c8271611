"""The peers the benchmarks time our kernels against, built as their users build them: PyTorch's int4 kernel
(tinygemm: `aten._weight_int4pack_mm`, what torchao's int4 weight-only runs), gemlite (`A16W4_HQQ_INT().from_weights`
on our w4a16 codes, scales and zero points, and `A8W4_HQQ_INT_dynamic` (FP8 activations) on the same;
`A16W8_INT8`, `A8W8_int8_dynamic`, `A8W8_fp8_dynamic` `.from_linear`, gemlite's own autotune on first call),
bitsandbytes (`Linear4bit` nf4, fp16 compute) and Marlin (IST-DASLab/marlin's `marlin.Layer`, groups of 128,
symmetric: its only 4-bit format; built from its public source on the GPU machine by scripts/build_marlin.sh). A peer's weight bytes are its format's nominal size (4-bit g128: codes + fp16 scale and
zero per group, Marlin's a scale only; nf4: codes + an fp32 absmax per 64). Peers not installed on the machine are
reported as missing. Used by bench decode_gemv, weight_only, gemm, runtime.
"""
from __future__ import annotations

import copy

import torch


def tinygemm(w: torch.Tensor, group: int = 128, inner_k_tiles: int = 8):
    """PyTorch's int4 tinygemm weight (bf16 activations): asymmetric group-wise, packed by aten."""
    N, K = w.shape
    wg = w.float().reshape(N, K // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-6)
    q = torch.clamp(torch.round((wg - lo) / scale), 0, 15).to(torch.int32).reshape(N, K)
    zero = lo + 8 * scale                      # tinygemm: w = (q - 8) * scale + zero
    sz = torch.stack([scale.reshape(N, -1).t(), zero.reshape(N, -1).t()], dim=-1).to(torch.bfloat16).contiguous()
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    wp = torch.ops.aten._convert_weight_to_int4pack(packed_u8, inner_k_tiles)
    return wp, sz, N * K // 2 + sz.numel() * 2


def try_tinygemm(w):
    try:
        return tinygemm(w)
    except Exception as e:     # an aten build without tinygemm for this GPU
        print(f"tinygemm unavailable: {type(e).__name__}: {str(e)[:200]}")
        return None


def peers(lin, dev, kinds=None) -> tuple[dict, list]:
    """name -> (make a layer from `lin`, nominal weight bytes) for the peers installed here (with `kinds`, those
    whose names hold one of them: "w4a16", "nf4", "w8a8 fp8", ...), and the missing ones."""
    N, K = lin.weight.shape
    out, missing = {}, []
    try:
        from gemlite.helper import A8W8_fp8_dynamic, A8W8_int8_dynamic, A16W4_HQQ_INT, A16W8_INT8

        def g4(lin=lin):
            from ..packed_weight import PackedWeight
            pw = PackedWeight.from_float(lin.weight.detach(), 4, 128, symmetric=False)
            return A16W4_HQQ_INT(device=str(dev)).from_weights(pw.codes(), pw.scales.reshape(N, -1),
                                                               pw.zeros.reshape(N, -1))
        out["gemlite w4a16 g128"] = (g4, N * K // 2 + 4 * N * (K // 128))
        out["gemlite w8a16"] = (lambda: A16W8_INT8(device=str(dev)).from_linear(copy.deepcopy(lin)), N * K + 4 * N)
        out["gemlite w8a8 int8"] = (lambda: A8W8_int8_dynamic(device=str(dev)).from_linear(copy.deepcopy(lin)),
                                      N * K + 4 * N)
        if torch.cuda.get_device_capability(dev) >= (8, 9):
            out["gemlite w8a8 fp8"] = (lambda: A8W8_fp8_dynamic(device=str(dev)).from_linear(copy.deepcopy(lin)),
                                         N * K + 4 * N)
            try:        # 4-bit weights (the same codes as its W4A16's), activations to e4m3 per token in the call
                from gemlite.helper import A8W4_HQQ_INT_dynamic

                def g48(lin=lin):
                    from ..packed_weight import PackedWeight
                    pw = PackedWeight.from_float(lin.weight.detach(), 4, 128, symmetric=False)
                    return A8W4_HQQ_INT_dynamic(device=str(dev)).from_weights(pw.codes(), pw.scales.reshape(N, -1),
                                                                              pw.zeros.reshape(N, -1))
                out["gemlite w4a8 fp8 g128"] = (g48, N * K // 2 + 4 * N * (K // 128))
            except ImportError:
                missing.append("gemlite w4a8 fp8: this gemlite has no A8W4_HQQ_INT_dynamic")
    except ImportError:
        missing.append("gemlite: not installed")
    try:
        import bitsandbytes as bnb

        def nf4(lin=lin):
            layer = bnb.nn.Linear4bit(K, N, bias=False, compute_dtype=torch.float16, quant_type="nf4")
            layer.weight = bnb.nn.Params4bit(lin.weight.detach().cpu(), requires_grad=False, quant_type="nf4")
            return layer.to(dev)
        out["bitsandbytes nf4"] = (nf4, N * K // 2 + 4 * (N * K // 64))
    except ImportError:
        missing.append("bitsandbytes: not installed")
    try:
        import marlin
        out["marlin w4a16 g128 sym"] = (_marlin_maker(marlin, lin, dev), N * K // 2 + 2 * N * (K // 128))
    except ImportError:
        missing.append("marlin: not built (scripts/build_marlin.sh)")
    if kinds:
        out = {k: v for k, v in out.items() if any(kind in k for kind in kinds)}
    return out, missing


def _marlin_maker(marlin, lin, dev, group: int = 128):
    """Make Marlin layers of `lin` as its users do: the weight fake-quantized to 4-bit symmetric groups (scale =
    absmax / 7 per group of 128, codes -8..7, as GPTQ's quantizer without act-order), then `Layer.pack(linear,
    scales [N, K / 128])`. Packed once (Marlin packs through numpy on the host); each further layer a copy."""
    N, K = lin.weight.shape
    packed = []

    def make():
        if not packed:
            w = lin.weight.detach().to(dev, torch.float32).reshape(N, K // group, group)
            s = (w.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-6).half().float()
            fq = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.float16)
            fq.weight.data = (torch.clamp(torch.round(w / s), -8, 7) * s).reshape(N, K).half()
            layer = marlin.Layer(K, N, groupsize=group)
            layer.pack(fq, s.reshape(N, K // group).half())
            packed.append(layer.to(dev))
            return packed[0]
        return copy.deepcopy(packed[0])
    return make

"""The bad-input matrix: for every public op, wrong dtype, wrong device, shape mismatch, bad scale
shapes, K not divisible by the group size, unsupported GPU capability. Each raises TypeError /
ValueError / RuntimeError whose message names the argument and says what was expected and what
was got. RELIABILITY.md carries this matrix as a table (`python -m tests.reliability.test_bad_inputs`
prints it; a test keeps the two in step)."""
from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import qkernels as qk

from ..conftest import DEVICE, ON_GPU

D = DEVICE


def f16(*s):
    return torch.randn(*s, device=D).half()


def i8(*s):
    return torch.randint(-128, 128, s, dtype=torch.int8, device=D)


def meta(t):
    return t.to("meta")


def ql(scheme="w8a8", K=64, N=32):
    return qk.QuantizedLinear.from_linear(torch.nn.Linear(K, N, device=D, dtype=torch.float16), scheme)


def pw(bits=4, K=64, N=32, gs=32):
    return qk.PackedWeight.from_float(f16(N, K) * 0.1, bits, gs, bits == 8)


@dataclass(frozen=True)
class Bad:
    op: str
    what: str              # the kind of bad input
    call: Callable[[], object]
    exc: type
    match: str             # regex the message must match (argument name ... got ...)
    gpu_only: bool = False
    old_gpu: bool = False  # pretend the GPU lacks FP8 tensor cores


MATRIX = [
    Bad("quantize", "dtype", lambda: qk.quantize(torch.ones(4, 8, dtype=torch.int32, device=D), "int8"), TypeError,
        r"x must have dtype in \(float32, float16, bfloat16\), got int32"),
    Bad("quantize", "value", lambda: qk.quantize(f16(4, 8), "int8", "block"), ValueError,
        r"granularity must be one of .*got 'block'"),
    Bad("quantize", "group divisibility", lambda: qk.quantize(f16(4, 72), "int4", "group", group_size=64), ValueError,
        r"divisible by group_size=64, got K=72"),
    Bad("quantize", "scale shape", lambda: qk.quantize(f16(4, 8), "int8", "row", scale=torch.ones(3, device=D)),
        ValueError, r"scale for granularity='row' must have 4 element\(s\).*got shape \(3,\)"),
    Bad("quantize", "device", lambda: qk.quantize(f16(4, 8), "int8", scale=meta(torch.ones(()))), RuntimeError,
        r"scale must be on the same device as x"),
    Bad("quantize", "value", lambda: qk.quantize(f16(4, 8), "fp8_e4m3", symmetric=False), ValueError,
        r"supports symmetric quantization only, got symmetric=False"),
    Bad("dequantize", "type", lambda: qk.dequantize(f16(4, 8)), TypeError, r"qt must be a QuantizedTensor, got Tensor"),
    Bad("pack_int4", "shape", lambda: qk.pack_int4(i8(4, 7)), ValueError, r"q's last dim must be even.*got 7"),
    Bad("unpack_int4", "dtype", lambda: qk.unpack_int4(i8(4, 8)), TypeError, r"packed must have dtype in \(uint8\), got int8"),
    Bad("int8_matmul", "dtype", lambda: qk.int8_matmul(f16(4, 8), i8(8, 4)), TypeError,
        r"a must have dtype in \(int8\), got float16"),
    Bad("int8_matmul", "shape", lambda: qk.int8_matmul(i8(4, 8), i8(9, 4)), ValueError,
        r"b must have K=8 rows to match a's last dim, got b.shape=\(9, 4\)"),
    Bad("int8_matmul", "scale shape", lambda: qk.int8_matmul(i8(4, 8), i8(8, 4), torch.ones(3, device=D)), ValueError,
        r"scale_a must be a scalar or have 4 elements.*got shape \(3,\)"),
    Bad("int8_matmul", "scale shape", lambda: qk.int8_matmul(i8(4, 8), i8(8, 4), None, torch.ones(5, device=D)),
        ValueError, r"scale_b must be a scalar or have 4 elements.*got shape \(5,\)"),
    Bad("int8_matmul", "shape", lambda: qk.int8_matmul(i8(4, 8), i8(8, 4), 1.0, bias=torch.ones(5, device=D)),
        ValueError, r"bias must have shape \(4,\), got \(5,\)"),
    Bad("int8_matmul", "int32 limit", lambda: qk.int8_matmul(i8(1, 131072), i8(131072, 1)), ValueError,
        r"K=131072 is too deep for exact int32 accumulation"),
    Bad("int8_matmul", "device", lambda: qk.int8_matmul(i8(4, 8), meta(i8(8, 4))), RuntimeError,
        r"b must be on the same device as a"),
    Bad("fp8_matmul", "dtype", lambda: qk.fp8_matmul(i8(4, 8), i8(8, 4), 1.0, 1.0), TypeError,
        r"a must have dtype in \(float8_e4m3fn\), got int8"),
    Bad("int4_matmul", "shape", lambda: qk.int4_matmul(qk.pack_int4(i8(4, 8) % 8), qk.pack_int4(i8(4, 8) % 8), 6),
        ValueError, r"a_packed's last dim must be k/2=3, got 4"),
    Bad("w8a8_linear", "dtype", lambda: qk.w8a8_linear(f16(4, 64).float(), ql().weight, ql().weight_scale), TypeError,
        r"x must have dtype in \(float16, bfloat16\), got float32"),
    Bad("w8a8_linear", "shape", lambda: qk.w8a8_linear(f16(4, 48), ql().weight, ql().weight_scale), ValueError,
        r"w_q must be \[N, K=48\], got shape \(32, 64\)"),
    Bad("w8a8_linear", "scale shape", lambda: qk.w8a8_linear(i8(4, 64), ql().weight, ql().weight_scale,
                                                            x_scale=torch.ones(3, device=D)), ValueError,
        r"x_scale must hold one fp32 scale per row of x \(M=4\), got shape \(3,\)"),
    Bad("w4a16_linear", "type", lambda: qk.w4a16_linear(f16(4, 64), f16(32, 64)), TypeError,
        r"w_packed must be a qkernels.PackedWeight.*got Tensor"),
    Bad("w4a16_linear", "value", lambda: qk.w4a16_linear(f16(4, 64), pw(8, gs=-1)), ValueError,
        r"w4a16_linear needs a 4-bit PackedWeight, got bits=8"),
    Bad("w4a16_linear", "shape", lambda: qk.w4a16_linear(f16(4, 32), pw()), ValueError,
        r"x's last dim must be the weight's in_features K=64, got x.shape=\(4, 32\)"),
    Bad("w8a16_linear", "dtype", lambda: qk.w8a16_linear(f16(4, 64).float(), pw(8, gs=-1)), TypeError,
        r"x must have dtype in \(float16, bfloat16\), got float32"),
    Bad("w4a8_linear", "dtype", lambda: qk.w4a8_linear(f16(4, 64).float(), pw(4, gs=64)), TypeError,
        r"x must have dtype in \(float16, bfloat16\), got float32"),
    Bad("w4a8_linear", "value", lambda: qk.w4a8_linear(f16(4, 64), pw(8, gs=-1)), ValueError,
        r"w4a8_linear needs a 4-bit PackedWeight, got bits=8"),
    Bad("w4a8_linear", "group size", lambda: qk.w4a8_linear(f16(4, 64), pw(4, gs=32)), ValueError,
        r"w4a8_linear needs group_size a multiple of 64 or -1 \(per channel\), got 32"),
    Bad("w4a8_linear", "K", lambda: qk.w4a8_linear(f16(4, 96), pw(4, K=96, gs=-1)), ValueError,
        r"w4a8_linear needs in_features K a multiple of 64, got K=96"),
    Bad("QuantizedLinear.from_linear", "group size", lambda: ql("w4a8-fp8-g32"), ValueError,
        r"w4a8-fp8 needs group_size a multiple of 64 or -1 \(per channel\).*got 32"),
    Bad("PackedWeight.from_float", "group divisibility", lambda: pw(4, K=72, gs=32), ValueError,
        r"K=72 \(the input features\) must be a multiple of group_size=32"),
    Bad("rms_norm", "dtype", lambda: qk.rms_norm(torch.ones(4, 8, dtype=torch.int32, device=D), None), TypeError,
        r"x must have dtype in \(float32, float16, bfloat16\), got int32"),
    Bad("rms_norm", "shape", lambda: qk.rms_norm(f16(4, 8), f16(7)), ValueError,
        r"weight must have shape \(8,\) to match x's last dim, got \(7,\)"),
    Bad("rms_norm", "shape", lambda: qk.rms_norm(f16(4, 8), f16(8), residual=f16(2, 8)), ValueError,
        r"residual must have x's shape \(4, 8\), got \(2, 8\)"),
    Bad("rms_norm", "device", lambda: qk.rms_norm(f16(4, 8), meta(f16(8))), RuntimeError,
        r"weight must be on the same device as x"),
    Bad("rms_norm", "value", lambda: qk.rms_norm(f16(4, 8), None, quantize="int4"), ValueError,
        r"quantize must be None, 'int8' or 'fp8_e4m3', got 'int4'"),
    Bad("layer_norm", "shape", lambda: qk.layer_norm(f16(4, 8), f16(8), f16(3)), ValueError,
        r"bias must have shape \(8,\) to match x's last dim, got \(3,\)"),
    Bad("silu_and_mul", "shape", lambda: qk.silu_and_mul(f16(4, 7)), ValueError,
        r"gate_up's last dim must be even \(gate and up halves\), got 7"),
    Bad("softmax", "shape", lambda: qk.softmax(f16(8), causal=True), ValueError,
        r"causal=True needs x of at least 2 dims \[..., Lq, Lk\] and dim=-1, got shape \(8,\)"),
    Bad("softmax", "value", lambda: qk.softmax(f16(4, 8), dim=3), ValueError, r"dim must be an int in \[-2, 1\].*got 3"),
    Bad("QuantizedLinear.from_linear", "type", lambda: qk.QuantizedLinear.from_linear(torch.nn.Conv1d(4, 4, 1)),
        TypeError, r"linear must be an nn.Linear, got Conv1d"),
    Bad("QuantizedLinear.from_linear", "value", lambda: qk.QuantizedLinear.from_linear(torch.nn.Linear(4, 4), "w3a3"),
        ValueError, r"scheme must be w8a8, w8a8-fp8, .*got 'w3a3'"),
    Bad("quantize_", "dtype", lambda: qk.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64)), "w8a8", progress=False),
        TypeError, r"layer '0' has weight dtype float32: pass dtype=torch.float16"),
    Bad("quantize_", "GPU capability", lambda: qk.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64, device=D).half()),
                                                            "w8a8-fp8", progress=False), RuntimeError,
        r"scheme 'w8a8-fp8' needs FP8 tensor cores \(compute capability >= 8.9\), got 8.0", old_gpu=True,
        gpu_only=True),
    Bad("quantize_", "GPU capability",
        lambda: qk.quantize_(torch.nn.Sequential(torch.nn.Linear(64, 64, device=D).half()), "w4a8-fp8", progress=False),
        RuntimeError,
        r"scheme 'w4a8-fp8' needs FP8 tensor cores \(compute capability >= 8.9\), got 8.0: w4a16, w8a16 and w8a8 run",
        old_gpu=True, gpu_only=True),
    # a CPU tensor given to an op on a GPU machine (under the interpreter CPU tensors are accepted)
    Bad("int8_matmul", "device (CPU tensor)", lambda: qk.int8_matmul(i8(4, 8), i8(8, 4).cpu()), RuntimeError,
        r"b must be on the same device as a \(cuda:0\), got cpu", gpu_only=True),
    Bad("rms_norm", "device (CPU tensor)", lambda: qk.rms_norm(f16(4, 8).cpu(), None), RuntimeError,
        r"x must be on a CUDA device, got cpu", gpu_only=True),
    Bad("w4a16_linear", "device (CPU tensor)", lambda: qk.w4a16_linear(f16(4, 64).cpu(), pw()), RuntimeError,
        r"x must be on a CUDA device, got cpu", gpu_only=True),
    Bad("w4a8_linear", "device (CPU tensor)", lambda: qk.w4a8_linear(f16(4, 64).cpu(), pw(4, gs=64)), RuntimeError,
        r"x must be on a CUDA device, got cpu", gpu_only=True),
]


def _pretend_old_gpu(monkeypatch):
    import qkernels._runtime as rt
    import qkernels.ops.gemm as g
    monkeypatch.setattr(g, "is_interpreter", lambda: False)
    monkeypatch.setattr(g, "capability", lambda dev: (8, 0))
    monkeypatch.setattr(rt, "capability", lambda dev: (8, 0))


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: f"{c.op}-{c.what}")
def test_bad_input(case, monkeypatch):
    if case.gpu_only and not ON_GPU:
        pytest.skip("needs a GPU machine (under the interpreter CPU tensors are valid inputs)")
    if case.old_gpu:
        _pretend_old_gpu(monkeypatch)
    with pytest.raises(case.exc, match=case.match):
        case.call()


def markdown_table() -> str:
    lines = ["| op | bad input | raises | message (regex) |", "| --- | --- | --- | --- |"]
    for c in MATRIX:
        lines.append(f"| `{c.op}` | {c.what} | {c.exc.__name__} | `{c.match.replace('|', '/')}` |")
    return "\n".join(lines)


def test_reliability_doc_carries_the_matrix():
    doc = (pathlib.Path(__file__).resolve().parents[2] / "RELIABILITY.md").read_text()
    assert markdown_table() in doc, "RELIABILITY.md's error table is stale: python -m tests.reliability.test_bad_inputs"


if __name__ == "__main__":
    print(markdown_table())

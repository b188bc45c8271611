"""`qkernels bench runtime`: the decoder runtime (qkernels.models) per scheme, beside the Hugging Face
model through its fast path (static cache, torch.compile(mode="reduce-overhead")), in the same run.

Models: random weights from the real configs (Llama-3-8B, Qwen3-1.7B; no download). Per scheme the runtime
is built from the same fp16 Hugging Face model with from_pretrained(hf, scheme) (lm_head in fp16).

Method:
- decode: a [batch, 128]-token prompt prefilled into a static cache of 2112 positions (CACHE: the prefill rows'
  size; a served model's cache holds more than the context), then one decode step for the whole batch captured
  as a CUDA graph (models.generate.DecodeGraph) and replayed: median of triton.testing.do_bench (L2 flushed).
  tokens/s = batch / step time.
- share of the bandwidth floor: bytes one step must read (every weight but the embedding table, plus the
  KV cache up to the context) / the step time, over the device-to-device copy bandwidth measured in the
  same run (bench.harness.copy_bandwidth_gbps).
- prefill: one forward of [batch, 2048] tokens (logits of the last position), CUDA events, median of 5;
  TTFT = the batch-1 prefill time, as a CUDA graph where the runtime has one (models/llama.py: a prompt of up to
  4096 padded tokens; captured before the timing), beside ttft_eager_ms (every launch from the host). capture_s:
  the decode step's warm-up + graph capture.
- peak memory: torch.cuda.max_memory_allocated over the runtime's prefill and decode (weights, caches and
  activations; the source HF model's bytes subtracted).
- profile: one replayed decode step under torch.profiler, GPU time per kernel name (batch 1), the runtime's and
  the Hugging Face path's (W4A16 and tinygemm). On Hopper our decode kernels start early (programmatic dependent
  launch): a kernel's span then includes the time its programs wait for the kernel before, so spans overlap and
  add up to more than the step.
- image rows (Qwen3-VL, `--models qwen3-vl-2b`): one 448x448 image in a 64-token question; the vision encoder's time,
  TTFT of the prompt with its image (encoder included: one forward into the cache, median of 5), both as the
  runtime's CUDA graphs run them (captured before the timing) and eager (vision_eager_ms, ttft_eager_ms), and the
  batch-1 decode step after it; beside it transformers' eager fp16 model's forward of the same prompt (its compiled
  path does not take images).
- Hugging Face rows (batch 1): the source model's forward compiled with a static cache (torch.compile,
  mode="reduce-overhead", fullgraph: its documented fast path), fp16, and converted copies: w4a16 and w8a8 by
  quantize_ (lm_head fp16), and every linear but lm_head on PyTorch's int4 kernel (tinygemm, bf16 model, group
  128), as a torchao int4 weight-only user runs it.
The profiles are taken after every timing of their model (a profiler session may leave the profiling library
attached and slow what runs after it). With several models in one run a later model's rows follow an earlier
model's profiles: a run of one model (`--models NAME`) keeps every row clear of them.
On a machine without a GPU a tiny model runs through the Triton interpreter to show the path works.

`--models` naming some models (a run need not time them all) merges their rows into this GPU's runtime.json:
the named models' rows and profiles are replaced, the others kept. Every row carries the date and versions of
the run it comes from, so each model's figures stay those of one run. The file is written as each model ends, so a
run stopped inside a later model keeps the ones before it.
"""
from __future__ import annotations

import functools
import gc
import json
import time

import torch

from .harness import (Row, copy_bandwidth_gbps, merge_results, method_text, on_gpu, results_dir, results_doc,
                      write_json)
from .model import _median_ms, decode_step, decode_step_ms, hf_model, model_configs, vl_configs

# "+head": lm_head quantized with the same scheme (off by default in from_pretrained)
SCHEMES = ("fp16", "w4a16", "w4a16+head", "w8a16", "w8a8", "w8a8-fp8", "w4a8-fp8")
# the HF model's own decode step through its documented fast path (static cache, forward compiled with
# mode="reduce-overhead"): fp16, our schemes through quantize_, and PyTorch's int4 weight-only kernel (tinygemm,
# what torchao's int4 weight-only runs; bf16 model) swapped in for every linear but lm_head, as a torchao user's
# model runs it. Named with --hf only (not among the defaults: three compiled batches of its own): gemlite's A8W4
# FP8 layer (4-bit g128 codes, activations to e4m3 per token: W4A8's peer) the same way on the fp16 model, on an
# FP8 GPU, at the batches W4A8 is for as well
HF_PATH = "HF static cache + torch.compile"
HF_SCHEMES = ("fp16", "w4a16", "w8a8", "tinygemm-int4")
HF_BATCHES = {"gemlite-w4a8-fp8": (1, 16, 64)}      # the others: batch 1
PROFILED = ("fp16", "w4a16", "w8a8")          # the schemes whose batch-1 decode step is profiled per kernel
PROFILED_HF = ("w4a16", "tinygemm-int4")      # and those of the Hugging Face path
PROMPT, CTX = 2048, 128
CACHE = PROMPT + 64     # the decode rows' cache positions, as the prefill rows leave it
DECODE_BATCHES, PREFILL_BATCHES = (1, 8, 16, 32, 64), (1, 8)     # 16 / 64: batched decode's targets


class _TinygemmLinear(torch.nn.Module):
    """A linear on PyTorch's int4 tinygemm kernel (`aten._weight_int4pack_mm`, group 128, bf16 activations)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        from .peers import tinygemm
        self.wp, self.sz, _ = tinygemm(lin.weight.detach())
        self.bias = lin.bias
        self.n = lin.out_features

    def forward(self, x):
        y = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, x.shape[-1]), self.wp, 128, self.sz)
        y = y.reshape(*x.shape[:-1], self.n)
        return y + self.bias if self.bias is not None else y


def _gemlite_w4a8(lin: torch.nn.Linear):
    """gemlite's A8W4 FP8 layer (A8W4_HQQ_INT_dynamic) on `lin`'s weight as 4-bit g128 asymmetric codes."""
    from .peers import peers
    found, missing = peers(lin, lin.weight.device, ["w4a8 fp8"])
    if "gemlite w4a8 fp8 g128" not in found or lin.bias is not None:
        raise RuntimeError("gemlite-w4a8-fp8 needs gemlite's A8W4_HQQ_INT_dynamic, an FP8 GPU and linears without "
                           f"bias ({'; '.join(missing) or 'a linear has a bias'})")
    return found["gemlite w4a8 fp8 g128"][0]()


def _hf_converted(hf, scheme: str):
    """A converted copy of the fp16 HF model: quantize_ for our schemes (lm_head stays fp16); every linear but
    lm_head on tinygemm for "tinygemm-int4" (bf16 model), on gemlite's A8W4 FP8 layer for "gemlite-w4a8-fp8"."""
    import copy
    m = copy.deepcopy(hf)
    swap = {"tinygemm-int4": _TinygemmLinear, "gemlite-w4a8-fp8": _gemlite_w4a8}.get(scheme)
    if swap is None:
        from ..nn.convert import quantize_
        quantize_(m, scheme, progress=False)
        return m
    if scheme == "tinygemm-int4":
        m = m.to(torch.bfloat16)
    head = m.get_output_embeddings()
    for parent in list(m.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and child is not head:
                setattr(parent, name, swap(child))
    return m


def merge_by_model(old: dict | None, new: dict, models: list[str]) -> dict:
    """The runtime results document `new` (its rows from this run, of `models`) merged into `old` (the GPU's
    earlier document, or None, harness.merge_results): an old row goes where this run measured its model, provider and
    scheme again; the rest stay (other models; a model's schemes left out of this run). Profiles likewise, by key."""
    ran = {(r.get("model"), r.get("provider"), r.get("scheme")) for r in new["rows"]}
    out = merge_results(old, new, lambda r: r.get("model") in models and (r.get("model"), r.get("provider"),
                                                                          r.get("scheme")) in ran)
    if old and old.get("gpu") == new.get("gpu"):
        out["profiles"] = {**old.get("profiles", {}), **new.get("profiles", {})}
    return out


def step_bytes(model, batch: int, ctx: int) -> int:
    """Bytes one decode step reads: all weights but the embedding table (one row per token), and the KV cache
    up to ctx (of a tensor-parallel model: one rank's)."""
    emb = model.tok_embeddings.weight
    seen, total = set(), 0
    for t in list(model.parameters()) + [b for n, b in model.named_buffers() if not n.endswith((".k", ".v"))]:
        if t.data_ptr() in seen or (t is emb and not _tied(model)):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    a, att = model.args, model.layers[0].attention      # a tensor-parallel rank: its own KV heads
    return total + 2 * a.n_layers * batch * att.n_kv_heads * ctx * a.head_dim * att.cache.k.element_size()


def _tied(model) -> bool:
    return model.output.weight is model.tok_embeddings.weight if hasattr(model.output, "weight") else False


def runtime_decode(model, batch: int, ctx: int, gpu: bool, cache: int | None = None):
    """(median ms, the captured step) of one decode step for `batch` sequences at context `ctx`, in a cache of at
    least `cache` positions (CACHE on a GPU by default, as the bench's rows; ctx + 64 where that is more)."""
    from ..models.generate import DecodeGraph
    cache = (CACHE if gpu else 0) if cache is None else cache
    model.setup_caches(batch, max(ctx + 64, cache))
    ids = torch.randint(0, model.args.vocab_size, (batch, ctx), device=model.device)
    with torch.inference_mode():
        model(ids, 0, logits_at=torch.full((batch,), ctx - 1, device=model.device))
    step = DecodeGraph(model, batch, use_graph=gpu)
    tok = torch.randint(0, model.args.vocab_size, (batch,), device=model.device)
    pos = torch.full((batch,), ctx, device=model.device)
    if not gpu:
        return _median_ms(lambda: step(tok, pos), model.device, 2), step
    import triton.testing
    step(tok, pos)
    return triton.testing.do_bench(lambda: step(tok, pos), warmup=25, rep=200, return_mode="median"), step


IMAGE, QUESTION = (448, 448), 64        # a vision-language model's image rows: one image of these pixels and a
IMAGE_CPU, QUESTION_CPU = (32, 32), 8   # question of these text tokens around it (the interpreter's: tiny)


def image_prompt(cfg, dev, image: tuple, question: int) -> tuple:
    """(ids [1, L], pixel_values, image_grid_thw, mm_token_type_ids) of one prompt holding one image of `image`
    pixels between two halves of a `question`-token text, laid out as Qwen3-VL's processor lays them (random pixels
    and text ids: the speed does not depend on them)."""
    v = cfg.vision_config
    h, w = image[0] // v.patch_size, image[1] // v.patch_size
    grid = torch.tensor([[1, h, w]], device=dev)
    pv = torch.randn(h * w, 3 * v.temporal_patch_size * v.patch_size ** 2, device=dev)
    text = lambda n: torch.randint(0, min(cfg.image_token_id, cfg.vision_start_token_id) - 2, (n,)).tolist()  # noqa
    n_image = h * w // v.spatial_merge_size ** 2
    ids = (text(question // 2) + [cfg.vision_start_token_id] + [cfg.image_token_id] * n_image
           + [cfg.vision_end_token_id] + text(question - question // 2))
    ids = torch.tensor([ids], device=dev)
    return ids, pv, grid, (ids == cfg.image_token_id).int()


def image_rows(m, hf, cfg, sizes: dict, scheme: str, gpu: bool) -> list[Row]:
    """The image rows of a vision-language model in one scheme: the vision encoder's time, TTFT of the prompt with
    its image (the encoder included: one forward into the cache) beside the GPU time of its kernels (a profile of
    20 forwards), and the batch-1 decode step after it; beside fp16, transformers' eager model on the same prompt
    (its TTFT: one forward)."""
    from ..models.graphs import eager
    dev = m.device
    image, question = (IMAGE, QUESTION) if gpu else (IMAGE_CPU, QUESTION_CPU)
    ids, pv, grid, types = image_prompt(cfg, dev, image, question)
    L = ids.shape[1]
    m.setup_caches(1, L + 64)
    at = torch.full((1,), L - 1, device=dev)
    reps = 5 if gpu else 1
    forward = torch.inference_mode()(lambda: m(ids, 0, logits_at=at, pixel_values=pv, image_grid_thw=grid))
    with torch.inference_mode(), eager():      # no graphs: every launch from the host
        vision_eager_ms = _median_ms(lambda: m.visual(pv, grid), dev, reps)
        ttft_eager_ms = _median_ms(forward, dev, reps)
    forward(), forward()                       # the prompt's graphs (an image size, a padded length seen twice)
    with torch.inference_mode():
        vision_ms = _median_ms(lambda: m.visual(pv, grid), dev, reps)
    ttft_ms = _median_ms(forward, dev, reps)
    # the TTFT's kernels' GPU time (per forward): well short of the TTFT, the host sets the pace, not the kernels
    gpu_ms = sum(k["us_per_step"] for k in profile_step(forward, top=10 ** 6)) * 1e-3 if gpu else float("nan")
    dec_ms, step = runtime_decode(m, 1, L, gpu)
    del step
    label = dict(sizes, batch=1, image=f"{image[0]}x{image[1]}", prompt=L)
    rows = [Row("image", "qkernels runtime", ttft_ms * 1e3, "eager", dict(label, scheme=scheme),
                {"vision_ms": vision_ms, "ttft_ms": ttft_ms, "ttft_kernels_ms": gpu_ms,
                 "vision_eager_ms": vision_eager_ms, "ttft_eager_ms": ttft_eager_ms,
                 "tokens_per_s": 1 / (dec_ms * 1e-3)})]
    print(f"{sizes['model']} {scheme} image {image}: vision {vision_ms:.1f} ms (eager {vision_eager_ms:.1f}), TTFT "
          f"{ttft_ms:.1f} ms (eager {ttft_eager_ms:.1f}; its kernels {gpu_ms:.1f} ms), decode "
          f"{1 / (dec_ms * 1e-3):.1f} tok/s", flush=True)
    if scheme == "fp16":
        import inspect
        kw = dict(input_ids=ids, pixel_values=pv.to(torch.float16), image_grid_thw=grid)
        if "mm_token_type_ids" in inspect.signature(hf.forward).parameters:
            kw["mm_token_type_ids"] = types
        with torch.inference_mode():
            hf_ms = _median_ms(lambda: hf(**kw), dev, reps)
        rows.append(Row("image", "HF eager", hf_ms * 1e3, "eager", dict(label, scheme="fp16"), {"ttft_ms": hf_ms}))
        print(f"{sizes['model']} fp16 image HF eager: TTFT {hf_ms:.1f} ms", flush=True)
    return rows


def profile_into(profiles: dict, key: str, step) -> None:
    """profiles[key] = profile_step(step); a profile that fails (it is evidence beside the rows, not a row) is
    reported and left out instead of ending the run before its rows are written."""
    try:
        profiles[key] = profile_step(step)
    except Exception as e:          # noqa: BLE001 - whatever the profiled path raises, the timed rows stand
        print(f"profile of {key} failed, left out: {type(e).__name__}: {str(e)[:300]}", flush=True)


def critical_us(spans) -> dict:
    """{kernel name: µs} of how far each kernel moved the end of the GPU's work past where the kernels before it had
    left it: spans (name, start, end) in µs, of one stream. A kernel that starts early (programmatic dependent
    launch) and waits for the one before has a long span but adds only what it runs past that one's end; idle
    time between kernels (the host) is nobody's. The values add up to the time the GPU was busy."""
    out: dict = {}
    done = float("-inf")
    for name, start, end in sorted(spans, key=lambda e: (e[1], e[2])):
        if end > done:
            out[name] = out.get(name, 0.0) + end - max(done, start)
            done = end
        else:
            out.setdefault(name, 0.0)
    return out


def profile_step(step, top: int = 12) -> list[dict]:
    """GPU time per kernel name over 20 replays of a decode step (`step()` runs one), per step: us_per_step (the
    kernels' spans) and critical_us_per_step (critical_us: what the kernels added to the step's end; with PDL the
    spans overlap, these do not)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    spans = [(e.key[:90], e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == DeviceType.CUDA]
    crit = critical_us(spans)
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append({"kernel": e.key[:90], "us_per_step": t / 20, "calls_per_step": e.count / 20,
                         "critical_us_per_step": crit.get(e.key[:90], 0.0) / 20})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:top]


def run(root, models=None, schemes=SCHEMES, layers: int | None = None, hf_schemes=None) -> list[Row]:
    """`hf_schemes`: the Hugging Face path's (HF_SCHEMES; with `schemes` named, those of HF_SCHEMES among them)."""
    import transformers  # noqa: F401
    from ..models import from_pretrained
    from ..models.graphs import eager
    gpu = on_gpu()
    dev = torch.device("cuda" if gpu else "cpu")
    cfgs = model_configs(tiny=not gpu)
    if models:       # vision-language models (their language model) run when named
        cfgs = {k: v for k, v in {**cfgs, **vl_configs(tiny=not gpu)}.items() if k in models}
    if hf_schemes is None:
        hf_schemes = HF_SCHEMES if schemes == SCHEMES else tuple(s for s in HF_SCHEMES if s in schemes)
    prompt, ctx = (PROMPT, CTX) if gpu else (16, 8)
    dec_b, pre_b = (DECODE_BATCHES, PREFILL_BATCHES) if gpu else ((1, 2), (1,))
    bw = copy_bandwidth_gbps(dev) if gpu else float("nan")
    print(f"copy bandwidth {bw:.0f} GB/s")
    rows: list[Row] = []
    profiles = {}
    earlier = results_dir(root) / "runtime.json"
    prev = json.loads(earlier.read_text()) if earlier.exists() else None
    done: list[str] = []
    for mname, cfg in cfgs.items():
        text = cfg.get_text_config()            # a vision-language config: its language model's
        if layers:
            text.num_hidden_layers = layers
        sizes = {"model": mname, "layers": text.num_hidden_layers}
        dt = torch.float16
        with torch.device(dev):
            hf = hf_model(cfg, dt)
        hf_mb = sum(t.numel() * t.element_size() for t in hf.parameters()) / 2**20
        # HF's graph-captured decode first (its compiled models' state gone before ours run)
        for scheme in hf_schemes if gpu and cfg.model_type != "qwen3_vl" else ():
            try:
                hm = hf if scheme == "fp16" else _hf_converted(hf, scheme)
            except RuntimeError as e:
                if scheme != "gemlite-w4a8-fp8":        # ours and tinygemm: a failure is the run's
                    raise
                print(f"{mname} {scheme} HF: skipped: {e}", flush=True)     # a peer this machine lacks
                continue
            for b in HF_BATCHES.get(scheme, (1,)):
                t0 = time.perf_counter()
                ms = decode_step_ms(hm, b, ctx, dev, graph=True, compiled=True)
                rows.append(Row("decode", HF_PATH, ms * 1e3, "graph",
                                dict(sizes, scheme=scheme, batch=b, ctx=ctx), {"tokens_per_s": b / (ms * 1e-3)}))
                print(f"{mname} {scheme} HF b={b}: {ms * 1e3:.0f} us/step, {b / (ms * 1e-3):.1f} tok/s "
                      f"(compile and timing {time.perf_counter() - t0:.0f} s)", flush=True)
            del hm
            gc.collect()
            torch.cuda.empty_cache()
        if gpu:
            torch._dynamo.reset()        # the last compiled model's CUDA-graph pool
        for scheme in schemes:
            if "fp8" in scheme and gpu and torch.cuda.get_device_capability(dev) < (8, 9):
                continue
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
            t0 = time.perf_counter()
            base = scheme.removesuffix("+head")
            m = from_pretrained(hf, None if base == "fp16" else base, device=dev, dtype=dt,
                                quantize_lm_head=scheme.endswith("+head"))
            build_s = time.perf_counter() - t0
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            for b in pre_b:
                m.setup_caches(b, prompt + 64)
                ids = torch.randint(0, text.vocab_size, (b, prompt), device=dev)
                at = torch.full((b,), prompt - 1, device=dev)
                with torch.inference_mode():
                    with eager():
                        eager_ms = _median_ms(lambda: m(ids, 0, logits_at=at), dev, 5 if gpu else 1)
                    m(ids, 0, logits_at=at)          # its graph captured, where it has one (models/llama.py)
                    ms = _median_ms(lambda: m(ids, 0, logits_at=at), dev, 5 if gpu else 1)
                rows.append(Row("prefill", "qkernels runtime", ms * 1e3, "eager", dict(sizes, scheme=scheme, batch=b,
                                prompt=prompt), {"tokens_per_s": b * prompt / (ms * 1e-3),
                                                 "ttft_ms": ms if b == 1 else None,
                                                 "ttft_eager_ms": eager_ms if b == 1 else None}))
            for b in dec_b:
                ms, step = runtime_decode(m, b, ctx, gpu)
                nbytes = step_bytes(m, b, ctx)
                share = nbytes / (ms * 1e-3) / (bw * 1e9) if gpu else float("nan")
                rows.append(Row("decode", "qkernels runtime", ms * 1e3, "graph" if gpu else "eager",
                                dict(sizes, scheme=scheme, batch=b, ctx=ctx),
                                {"tokens_per_s": b / (ms * 1e-3), "step_bytes": nbytes, "bw_share": share,
                                 "capture_s": step.capture_s}))
                print(f"{mname} {scheme} runtime b={b}: {ms * 1e3:.0f} us/step, {b / (ms * 1e-3):.1f} tok/s, "
                      f"{100 * share:.0f}% of the floor, capture {step.capture_s:.1f} s", flush=True)
                del step
            if cfg.model_type == "qwen3_vl":
                rows += image_rows(m, hf, cfg, sizes, scheme, gpu)
            # the source HF model stays resident for the next scheme: it is not the runtime's memory
            peak = torch.cuda.max_memory_allocated() / 2**20 - hf_mb if gpu else float("nan")
            weight_mb = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                            list(m.parameters()) + [b for n, b in m.named_buffers() if not n.endswith((".k", ".v"))]
                            }.values()) / 2**20
            rows.append(Row("memory", "qkernels runtime", 0.0, sizes=dict(sizes, scheme=scheme),
                            extra={"peak_mb": peak, "weight_mb": weight_mb, "build_s": build_s}))
            del m
        # the batch-1 profiles after every timing of the model, each on a model built again: a profiler session
        # may leave the profiling library attached and slow what runs after it
        for scheme in [s for s in PROFILED if s in schemes] if gpu else ():
            gc.collect()
            torch.cuda.empty_cache()
            m = from_pretrained(hf, None if scheme == "fp16" else scheme, device=dev, dtype=dt)
            _, step = runtime_decode(m, 1, ctx, gpu)
            tok, pos = torch.zeros(1, dtype=torch.long, device=dev), torch.full((1,), ctx, device=dev)
            profile_into(profiles, f"{mname} {scheme}", functools.partial(step, tok, pos))
            del step, m
        for scheme in [s for s in PROFILED_HF if s in hf_schemes] if gpu and cfg.model_type != "qwen3_vl" else ():
            gc.collect()
            torch.cuda.empty_cache()
            hm = _hf_converted(hf, scheme)
            step = decode_step(hm, 1, ctx, dev, graph=True, compiled=True)
            profile_into(profiles, f"{mname} {scheme} ({HF_PATH})", step)
            del step, hm
            torch._dynamo.reset()
        del hf
        done.append(mname)
        if len(done) < len(cfgs):   # the models done so far written as they end: a run cut short keeps them
            _save(rows, profiles, bw, gpu, root, prev, done)
    # the named models' rows replace theirs in the GPU's earlier results, others kept; a run of every model replaces
    # the file
    _save(rows, profiles, bw, gpu, root, prev, list(cfgs) if models else None)
    return rows


def _save(rows, profiles, bw, gpu: bool, root, prev: dict | None, merged: list[str] | None):
    """Write the run's rows as runtime.json: merged into `prev` (the file before the run) for the models `merged`
    (merge_by_model), or as the whole file (merged None)."""
    meta = {"copy_bw_gbps": bw, "profiles": profiles, "method": method_text(__doc__, gpu, "tiny model")}
    doc = results_doc(rows, meta)
    if merged is not None:
        doc = merge_by_model(prev, doc, merged)
    print(f"wrote {write_json('runtime', doc, root)}", flush=True)

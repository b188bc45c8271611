"""`qkernels env`, `qkernels bench [quantize|gemm|weight-only|decode-gemv|host|fused|model|runtime|quantizers|all|
report]`, `qkernels eval ppl`, `qkernels quantize` and `qkernels generate`.

On a machine without a CUDA GPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1 is
set here, before any kernel module is imported) at small sizes, and the output says so.
"""
from __future__ import annotations

import argparse
import os
import sys

BENCHES = ("quantize", "gemm", "weight-only", "decode-gemv", "host", "fused", "model", "runtime", "quantizers")
# "all": the kernel benchmarks; the model ones run on their own
ALL = ("quantize", "gemm", "weight-only", "decode-gemv", "host", "fused")


def _ensure_backend() -> bool:
    import torch
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.cuda.is_available()


def cmd_env(_args) -> int:
    has_gpu = _ensure_backend()
    import torch
    import triton

    from qkernels import __version__
    from qkernels._runtime import is_interpreter
    print(f"qkernels     {__version__}")
    print(f"python       {sys.version.split()[0]}")
    print(f"torch        {torch.__version__} (cuda {torch.version.cuda})")
    print(f"triton       {triton.__version__}")
    try:
        import numpy
        print(f"numpy        {numpy.__version__}")
    except ImportError:
        pass
    print(f"interpreter  {'yes (TRITON_INTERPRET=1: kernels run on the CPU)' if is_interpreter() else 'no'}")
    if has_gpu:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"gpu {i}        {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                  f"{p.total_memory / 2**30:.0f} GiB")
        if not is_interpreter():
            target = triton.runtime.driver.active.get_current_target()
            print(f"backend      {target.backend} (arch {target.arch})")
    else:
        print("gpu          none")
        print("backend      Triton interpreter (CPU)")
    return 0


def _init_tp(tp: int, command: str) -> int:
    """--tp N: join the process group torchrun set up (NCCL on GPUs, gloo on CPUs; GPU = LOCAL_RANK); the rank,
    or 0 without tensor parallelism. Refuses a launch that did not start N processes."""
    if tp <= 1:
        return 0
    import torch
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != tp:
        raise SystemExit(f"error: --tp {tp} runs in {tp} processes, this launch has {world}: start it with "
                         f"torchrun --nproc-per-node {tp} -m qkernels.cli {command} ... --tp {tp}")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    import qkernels.models.parallel  # noqa: F401  (before the group exists: see its torch.distributed.nn import)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def _end_tp(tp: int) -> None:
    if tp > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


def cmd_bench(args) -> int:
    if args.name == "report":
        from qkernels.bench import report
        report.run(args.out)
        return 0
    if args.tp > 1 and args.name not in ("runtime", "model"):
        print(f"error: --tp applies to bench runtime (the decoder runtime split over GPUs), got bench {args.name}",
              file=sys.stderr)
        return 2
    has_gpu = _ensure_backend()
    if args.tp > 1:                 # the runtime over --tp GPUs beside one GPU (bench/tp.py)
        rank = _init_tp(args.tp, f"bench {args.name}")
        from qkernels.bench import tp
        if rank == 0 and not has_gpu:
            print("NOTE: no CUDA GPU in use: a tiny model over gloo in the Triton interpreter.")
        tp.run(args.out, models=args.models.split(",") if args.models else None, layers=args.layers,
               schemes=tuple(args.schemes.split(",")) if args.schemes else tp.SCHEMES, tp=args.tp)
        _end_tp(args.tp)
        return 0
    from qkernels._runtime import is_interpreter
    if not has_gpu or is_interpreter():
        print("NOTE: no CUDA GPU in use: running the kernels in the Triton interpreter on the CPU at small sizes. "
              "Times below are host wall-clock of the interpreter, not GPU performance.")
    names = ALL if args.name == "all" else (args.name,)
    for name in names:
        print(f"== qkernels bench {name}")
        import importlib
        kw = {}
        if name == "weight-only" and args.ms:
            kw = {"ms": args.ms.split(",")}
        if name in ("model", "runtime", "quantizers", "decode-gemv"):
            kw = {"models": args.models.split(",") if args.models else None, "layers": args.layers,
                  "schemes": tuple(args.schemes.split(",")) if args.schemes else None,
                  "shapes": args.shapes.split(",") if args.shapes else None}
            kw = {k: v for k, v in kw.items() if v and (k == "models" or (k == "shapes") == (name == "decode-gemv"))}
            if name == "decode-gemv" and args.ms:
                kw["ms"] = args.ms.split(",")
            if name == "decode-gemv" and args.providers:
                kw["providers"] = args.providers.split(",")
            if name == "runtime" and args.hf:
                kw["hf_schemes"] = () if args.hf == "none" else tuple(args.hf.split(","))
        importlib.import_module(f"qkernels.bench.{name.replace('-', '_')}").run(args.out, **kw)
    return 0


def cmd_eval(args) -> int:
    import torch

    from qkernels.eval import ppl
    schemes = tuple(s for s in args.schemes.split(",") if s) or ppl.DEFAULT_SCHEMES
    for s in schemes:
        ppl.parse_spec(s)              # fail before loading anything
    dtype = {"auto": None, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    ppl.run(args.model, schemes, tokens=args.tokens, ctx=args.ctx, stride=args.stride, dtype=dtype, out=args.out,
            text=args.text)
    return 0


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "tokenizer.model", "vocab.json", "merges.txt")


def cmd_quantize(args) -> int:
    """Quantize a Hugging Face model directory (optionally calibrated: GPTQ / AWQ) and write it out."""
    import shutil
    import time
    from pathlib import Path

    has_gpu = _ensure_backend()
    import torch

    src, out = Path(args.model), Path(args.out_dir)
    if not (src / "config.json").exists():
        print(f"error: MODEL_DIR {src} has no config.json (a Hugging Face model directory)", file=sys.stderr)
        return 2
    if out.resolve() == src.resolve():
        print("error: OUT_DIR must differ from MODEL_DIR", file=sys.stderr)
        return 2
    from .schemes import parse_scheme
    try:                 # before the model is read: a scheme its options do not fit fails in a second, not minutes
        scheme = parse_scheme(args.scheme, group_size=args.group_size, symmetric=args.symmetric)
    except (ValueError, TypeError) as e:
        print(f"error: --scheme {args.scheme}: {e}", file=sys.stderr)
        return 2
    if args.format == "gptq" and not scheme.weight_only:
        print(f"error: --format gptq holds weight-only schemes (w4a16 / w8a16), got --scheme {args.scheme}",
              file=sys.stderr)
        return 2
    calib = None
    if args.method != "rtn":
        if not args.calib_text:
            print(f"error: --method {args.method} needs --calib-text FILE (plain text to calibrate on)",
                  file=sys.stderr)
            return 2
        if not (src / "tokenizer.json").exists():
            print(f"error: {src} has no tokenizer.json to tokenize --calib-text with", file=sys.stderr)
            return 2
        from tokenizers import Tokenizer
        ids = Tokenizer.from_file(str(src / "tokenizer.json")).encode(Path(args.calib_text).read_text()).ids
        n = min(args.calib_tokens, len(ids)) // args.calib_len
        if n == 0:
            print(f"error: --calib-text gives {len(ids)} tokens, fewer than one sequence of --calib-len "
                  f"{args.calib_len}", file=sys.stderr)
            return 2
        calib = [torch.tensor(ids[i * args.calib_len:(i + 1) * args.calib_len]).reshape(1, -1) for i in range(n)]
        print(f"[calibration: {n} sequences of {args.calib_len} tokens from {args.calib_text}]", file=sys.stderr)
    from transformers import AutoModelForCausalLM

    import qkernels as qk
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype).eval()
    device = "cuda" if has_gpu else None
    qk.quantize_(model, args.scheme, group_size=args.group_size, symmetric=args.symmetric, method=args.method,
                 calibration=calib, act_order=args.act_order, device=device, fuse=args.format == "qkernels")
    print(f"[quantized ({args.scheme}, {args.method}) in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    qk.save_quantized(model, out, format=args.format)
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy2(src / f, out / f)
    print(f"[wrote {out} ({args.format})]", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    """Stream a completion of --prompt from a model directory through the decoder runtime."""
    import time

    has_gpu = _ensure_backend()
    import torch

    from qkernels.models import Stats, from_pretrained
    from pathlib import Path
    tok_file = Path(args.model) / "tokenizer.json"
    if not tok_file.exists():
        print(f"error: {args.model} has no tokenizer.json (the tokenizers package reads it)", file=sys.stderr)
        return 2
    rank = _init_tp(args.tp, "generate")
    say = (lambda *a, **k: print(*a, **k)) if rank == 0 else (lambda *a, **k: None)   # rank 0 speaks
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(tok_file))
    dtype = {"auto": None, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    if dtype is None and not has_gpu:
        dtype = torch.float32 if args.scheme is None else torch.bfloat16
    t0 = time.perf_counter()
    model = from_pretrained(args.model, args.scheme, dtype=dtype, progress=rank == 0,
                            quantize_vision=args.quantize_vision)
    say(f"[loaded {args.model} ({args.scheme or 'float'}, {model.dtype}, {model.device}"
        + (f", tensor parallel over {args.tp}" if args.tp > 1 else "") + f") in {time.perf_counter() - t0:.1f} s]",
        file=sys.stderr)
    images = {}
    if args.image:         # a vision-language prompt: the directory's chat template and image processor
        from qkernels.models.processing import image_prompt, load_images
        if model.visual is None:
            print(f"error: --image: {args.model} is not a vision-language model", file=sys.stderr)
            return 2
        try:
            ids, pixel_values, grid = image_prompt(args.model, tokenizer, args.prompt, load_images(args.image))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        images = dict(pixel_values=pixel_values.to(model.device), image_grid_thw=grid.to(model.device))
        limit = model.args.max_position_embeddings
        if len(ids) + args.max_new_tokens > limit:
            print(f"error: the prompt with its image tokens ({len(ids)} tokens, {', '.join(args.image)}) + "
                  f"--max-new-tokens {args.max_new_tokens} exceeds the model's context of {limit} positions",
                  file=sys.stderr)
            return 2
    else:
        ids = tokenizer.encode(args.prompt).ids
        if model.visual is not None and model.visual.args.image_token_id in ids:
            tok = model.visual.args.image_token_id
            print(f"error: --prompt holds {ids.count(tok)} image placeholder token(s) "
                  f"({tokenizer.id_to_token(tok)}, id {tok}) but no image was given: pass --image FILE",
                  file=sys.stderr)
            return 2
    stop = _stop_ids(Path(args.model), tokenizer)
    shown = []
    say(args.prompt, end="", flush=True)

    def stream(new):
        if new[0] is None:
            return
        before = tokenizer.decode(shown)
        shown.append(new[0])
        say(tokenizer.decode(shown)[len(before):], end="", flush=True)

    stats = Stats()
    model.generate(ids, args.max_new_tokens, args.temperature, args.top_k, args.top_p, stop, seed=args.seed,
                   on_tokens=stream, stats=stats, **images)
    say()
    mem = f", peak memory {stats.peak_memory_bytes / 2**30:.2f} GiB" if stats.peak_memory_bytes else ""
    say(f"[{stats.prompt_tokens} prompt tokens, {stats.new_tokens} new; TTFT {stats.ttft_s * 1e3:.0f} ms, "
        f"decode {stats.tokens_per_s:.1f} tok/s, graph capture {stats.capture_s:.1f} s{mem}"
        + (" per GPU" if mem and args.tp > 1 else "") + "]", file=sys.stderr)
    _end_tp(args.tp)
    return 0


def _stop_ids(path, tokenizer) -> list[int]:
    """eos_token_id from generation_config.json / config.json (an int or a list)."""
    import json
    ids = []
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.exists():
            e = json.loads(f.read_text()).get("eos_token_id")
            ids += e if isinstance(e, list) else [e] if isinstance(e, int) else []
    return sorted(set(ids))


def cmd_export_c(args) -> int:
    """Write AOT-compiled kernels and their C API (qkernels.export_c) to OUT_DIR."""
    from qkernels.export_c import export_c
    files = export_c(args.out_dir, tuple(o.strip() for o in args.ops.split(",") if o.strip()), args.gpu)
    print(f"wrote {len(files)} files to {args.out_dir}: build the example with `make -C {args.out_dir}`")
    return 0


def _scheme_arg(text: str) -> str:
    """--scheme: any string qkernels.schemes.parse_scheme reads (checked here, parsed again where it is used)."""
    from qkernels.schemes import parse_scheme
    try:
        parse_scheme(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="qkernels", description="qkernels: quantized Triton kernels")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env", help="versions, GPU, Triton backend, interpreter or not").set_defaults(fn=cmd_env)
    b = sub.add_parser("bench", help="run benchmarks against the peers and write results JSON + PNG")
    b.add_argument("name", nargs="?", default="quantize", choices=BENCHES + ("all", "report"),
                   help="a benchmark, 'all' (the kernel ones) or 'report' (regenerate RESULTS.md from --out's JSON)")
    b.add_argument("--out", default="benchmarks/results", help="results root (default: benchmarks/results)")
    b.add_argument("--models", default="", help="model / runtime bench: comma-separated (llama3-8b, qwen3-1.7b: "
                                                 "the default; qwen3-vl-2b when named); bench runtime merges the "
                                                 "named models' rows into the GPU's runtime.json (with --tp: "
                                                 "llama3-8b, llama3-70b, into tp.json)")
    b.add_argument("--schemes", default="", help="model bench: comma-separated (default fp32,fp16,bf16,w8a8,"
                                                  "w8a8-unfused,w8a8-fp8,w8a8-fp8-unfused,w4a16,w8a16)")
    b.add_argument("--hf", default="", help="runtime: the Hugging Face fast path's schemes (comma-separated; 'none': "
                                             "no Hugging Face rows; default: those of the named schemes it runs; "
                                             "gemlite-w4a8-fp8, gemlite's A8W4 FP8 layers, only when named)")
    b.add_argument("--layers", type=int, default=0, help="model bench: override the number of decoder layers")
    b.add_argument("--shapes", default="", help="decode-gemv: only these layer shapes (comma-separated NxK); with "
                                                "--models or --shapes its rows merge into the GPU's decode_gemv.json")
    b.add_argument("--providers", default="", help="decode-gemv: only the providers whose names hold one of these "
                                                   "(comma-separated, e.g. 'w4a8,w8a8-fp8'; fp16 always); rows merge")
    b.add_argument("--ms", default="", help="weight-only / decode-gemv: only these M (comma-separated); their rows "
                                            "merge into the GPU's weight_only.json / decode_gemv.json")
    b.add_argument("--tp", type=int, default=1, help="bench runtime (or model): tensor parallel over N GPUs, beside "
                                                     "one (launch: torchrun --nproc-per-node N -m qkernels.cli ...)")
    b.set_defaults(fn=cmd_bench)
    e = sub.add_parser("eval", help="accuracy of quantized models")
    e.add_argument("what", choices=("ppl",))
    e.add_argument("--model", default="smollm2", choices=("smollm2",))
    e.add_argument("--schemes", default="",
                   help="comma-separated (default: eval.ppl.DEFAULT_SCHEMES): a scheme (w8a8, w8a8-fp8, "
                        "w4a16[-g<group>][-sym|-asym], w8a16[...]), then -sq (w8a8: SmoothQuant calibration) or "
                        "-rtn / -gptq[-act] / -awq / -awq+gptq[-act] (weight-only)")
    e.add_argument("--tokens", type=int, default=4096)
    e.add_argument("--text", default=None, help="UTF-8 text file to evaluate on (default: gensim 4.4.0's "
                   "lee_background.cor, from the eval extra)")
    e.add_argument("--ctx", type=int, default=1024)
    e.add_argument("--stride", type=int, default=512)
    e.add_argument("--dtype", default="auto", choices=("auto", "float16", "bfloat16"),
                   help="activation dtype (auto: float16 on a GPU, bfloat16 on the CPU)")
    e.add_argument("--out", default="benchmarks/results", help="results root; JSON at <out>/<gpu|cpu>/ppl_smollm2.json")
    e.set_defaults(fn=cmd_eval)
    q = sub.add_parser("quantize", help="quantize a Hugging Face model directory and write it out")
    q.add_argument("model", metavar="MODEL_DIR")
    q.add_argument("out_dir", metavar="OUT_DIR")
    q.add_argument("--scheme", default="w4a16", type=_scheme_arg,
                   help="w4a16 (default), w8a16, w8a8, w8a8-fp8; group and symmetry may be written in: w4a16-g64-sym")
    q.add_argument("--method", default="rtn", choices=("rtn", "gptq", "awq", "awq+gptq"),
                   help="weight-only schemes: rtn (no calibration), gptq, awq or awq+gptq (need --calib-text)")
    q.add_argument("--group-size", type=int, default=None, help="weight-only schemes (default 128 for w4a16)")
    q.add_argument("--symmetric", action="store_true", default=None)
    q.add_argument("--act-order", action="store_true", help="gptq: quantize the most active input channels first")
    q.add_argument("--calib-text", default=None, help="plain-text file to calibrate on (tokenized with tokenizer.json)")
    q.add_argument("--calib-tokens", type=int, default=128 * 2048, help="calibration tokens (at most)")
    q.add_argument("--calib-len", type=int, default=2048, help="tokens per calibration sequence")
    q.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"), help="activation dtype")
    q.add_argument("--format", default="qkernels", choices=("qkernels", "gptq", "compressed-tensors"),
                   help="qkernels: save_quantized; gptq: a GPTQ directory (weight-only schemes); compressed-tensors: "
                        "llm-compressor's format (vLLM, transformers)")
    q.set_defaults(fn=cmd_quantize)
    g = sub.add_parser("generate", help="stream a completion from a Hugging Face model directory (decoder runtime)")
    g.add_argument("model", help="model directory: config.json, *.safetensors, tokenizer.json")
    g.add_argument("--prompt", required=True)
    g.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="a vision-language model (Qwen3-VL): an image for the prompt (repeat for several); the "
                        "directory's chat template and image processor build the prompt")
    g.add_argument("--scheme", default=None, type=_scheme_arg,
                   help="quantize while loading: w4a16, w8a16, w8a8, w8a8-fp8 (or e.g. w4a16-g64-sym)")
    g.add_argument("--quantize-vision", action="store_true", default=None,
                   help="a vision-language model: quantize the vision tower's linears with the scheme too (by "
                        "default the W8A8 schemes do, the weight-only ones leave it in float)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--dtype", default="auto", choices=("auto", "float16", "bfloat16", "float32"),
                   help="auto: the checkpoint's dtype on a GPU; float32 (bfloat16 with a scheme) on the CPU")
    g.add_argument("--tp", type=int, default=1, help="tensor parallel over N GPUs (launch: torchrun "
                                                     "--nproc-per-node N -m qkernels.cli generate ... --tp N)")
    g.set_defaults(fn=cmd_generate)
    x = sub.add_parser("export-c", help="ahead-of-time compiled kernels with a C API (CUstream), an example and a "
                                        "Makefile")
    x.add_argument("out_dir", metavar="OUT_DIR")
    x.add_argument("--ops", default="quantize,int8_matmul,w4a16",
                   help="comma-separated: quantize (row-wise int8), int8_matmul (exact), w4a16 (GEMV); default all")
    x.add_argument("--gpu", default="sm_90", help="architecture to compile for: sm_80, sm_86, sm_89, sm_90 ...")
    x.set_defaults(fn=cmd_export_c)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())

"""`qkernels bench quantizers`: time and GPU memory of the calibrated quantizers (GPTQ, AWQ) on a model of
real shapes, as a user runs them: the float model on the CPU, `quantize_(model, "w4a16", method=...,
calibration=..., device="cuda")`, which moves one decoder layer at a time to the GPU.

Model: random weights from the Llama-3-8B config (bench.model.model_configs; no download), fp16, built on
the CPU. Calibration: 128 random sequences of 2048 tokens (the GPTQ paper's amount). Reported per method:
wall time of quantize_ (calibration walk, quantization, conversion), peak GPU memory
(torch.cuda.max_memory_allocated), and beside it the two budgets it is judged against: one fp16 decoder
layer's bytes and the calibration activations (a layer's inputs and outputs over all sequences, fp16).
`--layers N` quantizes a model cut to its first N decoder layers (time scales with the layer count).
On a machine without a GPU a tiny model runs on the CPU to show the path works.
"""
from __future__ import annotations

import time

import torch

from .harness import Row, on_gpu, write_json
from .model import model_configs

METHODS = ("gptq", "awq")
CALIB_SEQS, CALIB_LEN = 128, 2048


def _random_model(cfg, layers: int | None):
    import transformers
    if layers:
        cfg.num_hidden_layers = layers
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
    model.to_empty(device="cpu")
    gen_dev = "cuda" if torch.cuda.is_available() else "cpu"       # the GPU draws the numbers much faster
    g = torch.Generator(gen_dev).manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=gen_dev, dtype=p.dtype).mul_(0.02))
        with torch.device("cpu"):
            model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    return model.eval()


def run(root, models=None, schemes=METHODS, layers: int | None = None) -> list[Row]:
    from ..nn.convert import quantize_
    gpu = on_gpu()
    cfg = next(iter(model_configs(tiny=not gpu).items()))
    name, cfg = cfg
    seqs, length = (CALIB_SEQS, CALIB_LEN) if gpu else (4, 64)
    rows = []
    for method in schemes:
        t0 = time.perf_counter()
        model = _random_model(cfg, layers)
        print(f"{name}: random fp16 model built on the CPU in {time.perf_counter() - t0:.0f} s", flush=True)
        n_layers = model.config.num_hidden_layers
        layer_bytes = sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())
        act_bytes = 2 * seqs * length * model.config.hidden_size * 2
        calib = [torch.randint(0, model.config.vocab_size, (1, length)) for _ in range(seqs)]
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        quantize_(model, "w4a16", group_size=128, method=method, calibration=calib, act_order=method == "gptq",
                  device="cuda" if gpu else None, progress=gpu)
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - base) if gpu else 0
        rows.append(Row(op=f"quantize_ {method}", provider="qkernels", median_us=seconds * 1e6, mode="eager",
                        sizes={"model": name, "layers": n_layers, "calib_seqs": seqs, "calib_len": length},
                        extra={"seconds": seconds, "peak_gpu_mb": peak / 2 ** 20, "layer_mb": layer_bytes / 2 ** 20,
                               "activations_mb": act_bytes / 2 ** 20,
                               "peak_over_budget": peak / (1.3 * layer_bytes + act_bytes) if gpu else None,
                               "act_order": method == "gptq", "group_size": 128}))
        print(f"{name} x{n_layers} {method}: {seconds:.1f} s, peak GPU {peak / 2 ** 20:.0f} MB "
              f"(one layer {layer_bytes / 2 ** 20:.0f} MB, activations {act_bytes / 2 ** 20:.0f} MB)", flush=True)
        del model
    path = write_json("quantizers", rows, root)
    print(f"wrote {path}")
    return rows

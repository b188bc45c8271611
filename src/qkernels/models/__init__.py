"""The decoder runtime: a compact Llama-family decoder on qkernels' kernels.

    m = qkernels.models.from_pretrained("path/to/hf_dir", scheme="w4a16")
    logits = m(input_ids)                        # plain forward, no cache
    ids = m.generate(input_ids, max_new_tokens=64, temperature=0.0)

config.py (ModelArgs from config.json), llama.py (the decoder), loading.py (from_pretrained: merge and
quantize projections while loading), generate.py (prefill, CUDA-graph decode, sampling).
"""
from .config import ModelArgs
from .generate import Stats, generate, sample
from .llama import Transformer
from .loading import from_pretrained

__all__ = ["ModelArgs", "Stats", "Transformer", "from_pretrained", "generate", "sample"]

"""Accuracy evaluation of quantized models (perplexity)."""

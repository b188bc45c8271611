"""ModelArgs: the few numbers a Llama-family decoder needs, read from a Hugging Face config.json."""
from __future__ import annotations

from dataclasses import dataclass

# model_type -> (q/k/v bias default, per-head q/k RMSNorm)
ARCHITECTURES = {"llama": (False, False), "mistral": (False, False), "qwen2": (True, False), "qwen3": (False, True),
                 "qwen3_vl": (False, True)}
# vision-language models whose language model the decoder runs (text prompts: for text, Qwen3-VL's multimodal
# rotary positions are the same in all three sections, which is plain RoPE): where its weights live
MULTIMODAL_PREFIX = {"qwen3_vl": "model.language_model."}


@dataclass(frozen=True)
class ModelArgs:
    model_type: str
    vocab_size: int
    dim: int                     # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    prefix: str = "model."       # the decoder's tensor names: <prefix>layers.<i>..., <prefix>embed_tokens.weight

    @classmethod
    def from_hf(cls, cfg: dict) -> "ModelArgs":
        """From a config.json dict (or a transformers config's to_dict()). Unsupported architectures and
        features the decoder does not implement are refused with the reason."""
        mt = cfg.get("model_type")
        if mt not in ARCHITECTURES:
            raise ValueError(f"model_type must be one of {sorted(ARCHITECTURES)} (Llama-family decoders), got {mt!r}")
        prefix = MULTIMODAL_PREFIX.get(mt, "model.")
        if mt in MULTIMODAL_PREFIX:          # the language model's numbers; tied embeddings are set at the top
            top = cfg
            cfg = dict(cfg.get("text_config") or {})
            cfg["tie_word_embeddings"] = top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        elif "text_config" in cfg and "hidden_size" not in cfg:
            raise ValueError("a multimodal config: pass its text_config")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if k not in cfg]
        if missing:
            raise ValueError(f"config.json lacks {missing} for model_type {mt!r}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu' (SwiGLU), got {cfg.get('hidden_act')!r}")
        if mt == "mistral" and cfg.get("sliding_window") and cfg["sliding_window"] < cfg.get(
                "max_position_embeddings", 0):
            raise ValueError(f"sliding-window attention (sliding_window={cfg['sliding_window']}) is not implemented")
        if mt in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            raise ValueError("use_sliding_window=True is not implemented")
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not implemented")
        bias_default, qk_norm = ARCHITECTURES[mt]
        n_heads = cfg["num_attention_heads"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
        if rope is not None and rope.get("rope_type", rope.get("type", "default")) == "default":
            rope = None
        return cls(
            model_type=mt, vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
            n_heads=n_heads, n_kv_heads=cfg.get("num_key_value_heads") or n_heads, head_dim=hd,
            intermediate_size=cfg["intermediate_size"], norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta), rope_scaling=rope,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", bias_default)),
            o_bias=bool(cfg.get("attention_bias", False)) and mt != "qwen2", qk_norm=qk_norm, prefix=prefix)

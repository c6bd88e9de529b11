"""Llama, Qwen2, Qwen3 and Mistral <-> transformers' `LlamaForCausalLM`,
`Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM`: the same names, no renames (zoo's
Llama mirrors them); a tied model's head is its embedding (no `lm_head.weight` either way).
What differs between them is read into the shape (`arch`, `attention_bias`, `qk_norm`,
`head_size`, `sliding_window`) and written back by the export under the same model type."""
from __future__ import annotations

from typing import List

from zoo.run.errors import ConfigError

CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig"}
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "mistral": "MistralForCausalLM"}


def _rope_theta(cfg: dict) -> float:
    """The rotary base, from `rope_theta` (config.json files written by transformers 4) or
    `rope_parameters` (transformers 5); a scaled rotary embedding (Llama 3.1's `llama3`, YaRN,
    linear, dynamic) is refused, never read as the plain one."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or ({} if params.get("rope_type", "default") == "default" else params)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise ConfigError(f"model.init_from: rotary scaling {scaling} is not supported (zoo's rotary embeddings are "
                          f"the plain ones); use a model without rope_scaling")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _window(cfg: dict, kind: str):
    """The sliding window a config applies, None where it applies none (Qwen2 has a window in its
    config that only `use_sliding_window` turns on)."""
    if kind == "qwen2" or kind == "qwen3":
        return cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    return cfg.get("sliding_window")


def meta_from_config(cfg: dict) -> dict:
    kind = cfg.get("model_type", "llama")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    if kind == "llama" and cfg.get("mlp_bias"):
        raise ConfigError("model.init_from: mlp_bias=true is not supported (zoo's SwiGLU has no biases); use a model "
                          "without MLP biases")
    if kind in ("llama", "qwen3") and cfg.get("attention_bias"):
        raise ConfigError(f"model.init_from: attention_bias=true on a {kind} model biases the output projection too, "
                          f"which zoo does not build; use a model without attention biases")
    return {"n_layer": cfg["num_hidden_layers"], "n_head": heads, "n_kv_head": cfg.get("num_key_value_heads") or heads,
            "n_embd": hidden, "intermediate_size": cfg["intermediate_size"],
            "block_size": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "rope_theta": _rope_theta(cfg), "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)), "arch": kind,
            "head_size": head_dim if head_dim * heads != hidden else None,
            "attention_bias": kind == "qwen2", "qk_norm": kind == "qwen3",  # Qwen2's q/k/v always carry biases
            "sliding_window": _window(cfg, kind)}


def hf_keys(name: str) -> List[str]:
    return [name]


def export_keys(name: str) -> List[str]:
    return [name]  # a tied model has no lm_head.weight of its own (its parameters appear once)


def transposed(name: str) -> bool:
    return False


def config(meta: dict, eos_token_id=None, pad_token_id=None, **_):
    import transformers

    kind = meta.get("arch", "llama")
    fields = dict(vocab_size=meta["vocab_size"], hidden_size=meta["n_embd"],
                  intermediate_size=meta["intermediate_size"], num_hidden_layers=meta["n_layer"],
                  num_attention_heads=meta["n_head"], num_key_value_heads=meta["n_kv_head"],
                  max_position_embeddings=meta.get("max_positions") or meta["block_size"], rope_theta=meta["rope_theta"],
                  rms_norm_eps=meta["rms_norm_eps"], tie_word_embeddings=bool(meta.get("tie_embeddings", False)),
                  head_dim=meta.get("head_size") or meta["n_embd"] // meta["n_head"],
                  bos_token_id=eos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                  architectures=[CLASSES[kind]])
    if kind == "llama":
        fields.update(attention_bias=False, mlp_bias=False)
    elif kind == "qwen3":
        fields.update(attention_bias=False)
    if kind == "mistral":
        fields.update(sliding_window=meta.get("sliding_window"))
    elif kind in ("qwen2", "qwen3"):
        fields.update(use_sliding_window=meta.get("sliding_window") is not None,
                      sliding_window=meta.get("sliding_window"))
    return getattr(transformers, CONFIGS[kind])(**fields)

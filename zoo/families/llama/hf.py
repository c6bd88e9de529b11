"""Llama <-> transformers' `LlamaForCausalLM`: the same names, no renames (zoo's Llama mirrors
them); a tied model's head is its embedding (no `lm_head.weight` either way)."""
from __future__ import annotations

from typing import List

from zoo.run.errors import ConfigError


def meta_from_config(cfg: dict) -> dict:
    if cfg.get("rope_scaling"):
        raise ConfigError(f"model.init_from: rope_scaling={cfg['rope_scaling']} is not supported; use a model without it")
    heads = cfg["num_attention_heads"]
    return {"n_layer": cfg["num_hidden_layers"], "n_head": heads, "n_kv_head": cfg.get("num_key_value_heads") or heads,
            "n_embd": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
            "block_size": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "rope_theta": float(cfg.get("rope_theta", 10000.0)), "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "tie_embeddings": bool(cfg.get("tie_word_embeddings", False))}


def hf_keys(name: str) -> List[str]:
    return [name]


def export_keys(name: str) -> List[str]:
    return [name]  # a tied model has no lm_head.weight of its own (its parameters appear once)


def transposed(name: str) -> bool:
    return False


def config(meta: dict, eos_token_id=None, pad_token_id=None, **_):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=meta["vocab_size"], hidden_size=meta["n_embd"],
                       intermediate_size=meta["intermediate_size"], num_hidden_layers=meta["n_layer"],
                       num_attention_heads=meta["n_head"], num_key_value_heads=meta["n_kv_head"],
                       max_position_embeddings=meta["block_size"], rope_theta=meta["rope_theta"],
                       rms_norm_eps=meta["rms_norm_eps"], tie_word_embeddings=bool(meta.get("tie_embeddings", False)),
                       attention_bias=False, mlp_bias=False, bos_token_id=eos_token_id, eos_token_id=eos_token_id,
                       pad_token_id=pad_token_id)

"""BERT <-> transformers' `BertForMaskedLM`: the same names (zoo's BERT mirrors them)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Tuple

import torch

from zoo.errors import ConfigError

State = Dict[str, torch.Tensor]


def to_hf(state: State, meta: dict, pad_token_id=None, **_):
    """BERT's names are already `BertForMaskedLM`'s; HF keeps the decoder bias under a
    second name too (`cls.predictions.bias`), and ties the decoder weight to the word embeddings."""
    from transformers import BertConfig

    config = BertConfig(vocab_size=meta["vocab_size"], hidden_size=meta["n_embd"], num_hidden_layers=meta["n_layer"],
                        num_attention_heads=meta["n_head"], intermediate_size=meta["ffn_mult"] * meta["n_embd"],
                        max_position_embeddings=meta["block_size"], hidden_act="gelu", layer_norm_eps=1e-12,
                        type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        pad_token_id=pad_token_id or 0, tie_word_embeddings=True)
    hf = {k: v for k, v in state.items() if k != "cls.predictions.decoder.weight"}
    hf["cls.predictions.bias"] = hf["cls.predictions.decoder.bias"].clone()
    return config, hf


def meta_from_config(cfg: dict) -> dict:
    return {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"], "n_embd": cfg["hidden_size"],
            "block_size": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": cfg["intermediate_size"] // cfg["hidden_size"]}


def from_hf(directory: Path) -> Tuple[dict, State]:
    from safetensors.torch import load_file

    meta = meta_from_config(json.loads((directory / "config.json").read_text()))
    state: State = {}
    for f in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(f)))
    if "cls.predictions.decoder.bias" not in state and "cls.predictions.bias" in state:
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    state.pop("cls.predictions.bias", None)
    state.pop("cls.predictions.decoder.weight", None)  # tied to the word embeddings
    state.pop("bert.embeddings.position_ids", None)
    if not state:
        raise ConfigError(f"model.init_from={directory} holds no *.safetensors weights (a pytorch_model.bin is not "
                          f"read: it would need unpickling); save the model with save_pretrained(safe_serialization=True)")
    return meta, state

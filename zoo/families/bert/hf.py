"""BERT <-> transformers' `BertForMaskedLM`: the same names (zoo's BERT mirrors them);
transformers keeps the decoder bias under a second name too (`cls.predictions.bias`) and
ties the decoder weight to the word embeddings."""
from __future__ import annotations

from typing import List

DECODER_BIAS = "cls.predictions.decoder.bias"


def hf_keys(name: str) -> List[str]:
    return [name, "cls.predictions.bias"] if name == DECODER_BIAS else [name]


def export_keys(name: str) -> List[str]:
    if name == "cls.predictions.decoder.weight":
        return []  # tied to the word embeddings
    return [name, "cls.predictions.bias"] if name == DECODER_BIAS else [name]


def transposed(name: str) -> bool:
    return False


def config(meta: dict, pad_token_id=None, **_):
    from transformers import BertConfig

    return BertConfig(vocab_size=meta["vocab_size"], hidden_size=meta["n_embd"], num_hidden_layers=meta["n_layer"],
                      num_attention_heads=meta["n_head"], intermediate_size=meta["ffn_mult"] * meta["n_embd"],
                      max_position_embeddings=meta["block_size"], hidden_act="gelu", layer_norm_eps=1e-12,
                      type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      pad_token_id=pad_token_id or 0, tie_word_embeddings=True)


def meta_from_config(cfg: dict) -> dict:
    return {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"], "n_embd": cfg["hidden_size"],
            "block_size": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": cfg["intermediate_size"] // cfg["hidden_size"]}

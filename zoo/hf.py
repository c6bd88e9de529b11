"""Conversion between the zoo's plain models and Hugging Face transformers, per family.

GPT <-> `GPT2LMHeadModel`: the same tensors under other names, the four projection
matrices transposed (GPT-2 stores them as Conv1D, (in, out)). BERT <-> `BertForMaskedLM`:
the same names. A family registers a
converter with `to_hf(state, meta) -> (config, hf_state)` and `from_hf(dir) -> (meta, state)`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch

State = Dict[str, torch.Tensor]
_GPT_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def _gpt_hf_name(name: str) -> str:
    return "transformer." + (name[len("embed."):] if name.startswith("embed.") else name)


def gpt_to_hf(state: State, meta: dict, eos_token_id=None, **_):
    from transformers import GPT2Config

    config = GPT2Config(bos_token_id=eos_token_id, eos_token_id=eos_token_id,vocab_size=meta["vocab_size"], n_positions=meta["block_size"], n_embd=meta["n_embd"],
                        n_layer=meta["n_layer"], n_head=meta["n_head"], n_inner=meta["ffn_mult"] * meta["n_embd"],
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    hf = {_gpt_hf_name(k): (v.t().contiguous() if _GPT_CONV1D.search(k) else v) for k, v in state.items()
          if k != "lm_head.weight"}
    return config, hf


def gpt_meta_from_hf(cfg: dict) -> dict:
    return {"n_layer": cfg["n_layer"], "n_head": cfg["n_head"], "n_embd": cfg["n_embd"],
            "block_size": cfg["n_positions"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": (cfg.get("n_inner") or 4 * cfg["n_embd"]) // cfg["n_embd"]}


def gpt_from_hf(directory: Path) -> Tuple[dict, State]:
    from safetensors.torch import load_file

    meta = gpt_meta_from_hf(json.loads((directory / "config.json").read_text()))
    state: State = {}
    for f in sorted(directory.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            k = k[len("transformer."):] if k.startswith("transformer.") else k
            if k.startswith(("wte.", "wpe.")):
                k = "embed." + k
            if k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias")):
                continue  # tied to wte / causal-mask buffers of old checkpoints
            state[k] = v.t().contiguous() if _GPT_CONV1D.search(k) else v
    if not state:
        raise ValueError(f"{directory} holds no *.safetensors weights; save the model with safe_serialization=True")
    return meta, state


def bert_to_hf(state: State, meta: dict, pad_token_id=None, **_):
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


def bert_meta_from_hf(cfg: dict) -> dict:
    return {"n_layer": cfg["num_hidden_layers"], "n_head": cfg["num_attention_heads"], "n_embd": cfg["hidden_size"],
            "block_size": cfg["max_position_embeddings"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": cfg["intermediate_size"] // cfg["hidden_size"]}


def bert_from_hf(directory: Path) -> Tuple[dict, State]:
    from safetensors.torch import load_file

    meta = bert_meta_from_hf(json.loads((directory / "config.json").read_text()))
    state: State = {}
    for f in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(f)))
    if "cls.predictions.decoder.bias" not in state and "cls.predictions.bias" in state:
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    state.pop("cls.predictions.bias", None)
    state.pop("cls.predictions.decoder.weight", None)  # tied to the word embeddings
    state.pop("bert.embeddings.position_ids", None)
    if not state:
        raise ValueError(f"{directory} holds no *.safetensors weights; save the model with safe_serialization=True")
    return meta, state


CONVERTERS: Dict[str, Tuple[Callable, Callable]] = {"gpt": (gpt_to_hf, gpt_from_hf), "bert": (bert_to_hf, bert_from_hf)}
META_FROM_HF: Dict[str, Callable] = {"gpt": gpt_meta_from_hf, "bert": bert_meta_from_hf}
HF_MODEL_TYPES = {"gpt2": "gpt", "bert": "bert"}


def family_of_hf(directory: Path) -> str:
    model_type = json.loads((Path(directory) / "config.json").read_text()).get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"{directory}: model_type {model_type!r} is not supported; the zoo imports "
                         f"{sorted(HF_MODEL_TYPES)}")
    return HF_MODEL_TYPES[model_type]


def hf_meta(directory: str | Path) -> Tuple[str, dict]:
    """(family, model meta) from a transformers directory's config.json alone."""
    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise ValueError(f"model.init_from={directory}: no config.json there; give a local transformers directory")
    family = family_of_hf(directory)
    return family, META_FROM_HF[family](json.loads((directory / "config.json").read_text()))


def read_hf(directory: str | Path, family: str) -> Tuple[dict, State]:
    """(model meta, plain state) of a local transformers directory that holds a `family` model."""
    found, _ = hf_meta(directory)
    if found != family:
        raise ValueError(f"model.init_from={directory} holds a {found} model, not a {family}")
    return CONVERTERS[family][1](Path(directory))

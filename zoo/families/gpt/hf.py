"""GPT <-> transformers' `GPT2LMHeadModel`: the same tensors under other names, the four
projection matrices transposed (GPT-2 stores them as Conv1D, (in, out)); tensor by tensor,
so an import reads and an export writes one slice or one tensor at a time."""
from __future__ import annotations

import re
from typing import List

_GPT_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def _bare(name: str) -> str:
    return name[len("embed."):] if name.startswith("embed.") else name


def hf_keys(name: str) -> List[str]:
    """Where an import finds zoo's `name`: under `transformer.`, or bare (older checkpoints)."""
    return [f"transformer.{_bare(name)}", _bare(name)]


def export_keys(name: str) -> List[str]:
    return [] if name == "lm_head.weight" else [f"transformer.{_bare(name)}"]  # the head is tied to wte


def transposed(name: str) -> bool:
    return bool(_GPT_CONV1D.search(name))


def config(meta: dict, eos_token_id=None, **_):
    from transformers import GPT2Config

    return GPT2Config(bos_token_id=eos_token_id, eos_token_id=eos_token_id, vocab_size=meta["vocab_size"],
                      n_positions=meta["block_size"], n_embd=meta["n_embd"],
                      n_layer=meta["n_layer"], n_head=meta["n_head"], n_inner=meta["ffn_mult"] * meta["n_embd"],
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      layer_norm_epsilon=1e-5, tie_word_embeddings=True)


def meta_from_config(cfg: dict) -> dict:
    return {"n_layer": cfg["n_layer"], "n_head": cfg["n_head"], "n_embd": cfg["n_embd"],
            "block_size": cfg["n_positions"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": (cfg.get("n_inner") or 4 * cfg["n_embd"]) // cfg["n_embd"]}

"""GPT <-> transformers' `GPT2LMHeadModel`: the same tensors under other names, the four
projection matrices transposed (GPT-2 stores them as Conv1D, (in, out))."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Tuple

import torch

from zoo.errors import ConfigError

State = Dict[str, torch.Tensor]
_GPT_CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


def _gpt_hf_name(name: str) -> str:
    return "transformer." + (name[len("embed."):] if name.startswith("embed.") else name)


def to_hf(state: State, meta: dict, eos_token_id=None, **_):
    from transformers import GPT2Config

    config = GPT2Config(bos_token_id=eos_token_id, eos_token_id=eos_token_id, vocab_size=meta["vocab_size"],
                        n_positions=meta["block_size"], n_embd=meta["n_embd"],
                        n_layer=meta["n_layer"], n_head=meta["n_head"], n_inner=meta["ffn_mult"] * meta["n_embd"],
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    hf = {_gpt_hf_name(k): (v.t().contiguous() if _GPT_CONV1D.search(k) else v) for k, v in state.items()
          if k != "lm_head.weight"}
    return config, hf


def meta_from_config(cfg: dict) -> dict:
    return {"n_layer": cfg["n_layer"], "n_head": cfg["n_head"], "n_embd": cfg["n_embd"],
            "block_size": cfg["n_positions"], "vocab_size": cfg["vocab_size"],
            "ffn_mult": (cfg.get("n_inner") or 4 * cfg["n_embd"]) // cfg["n_embd"]}


def from_hf(directory: Path) -> Tuple[dict, State]:
    from safetensors.torch import load_file

    meta = meta_from_config(json.loads((directory / "config.json").read_text()))
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
        raise ConfigError(f"model.init_from={directory} holds no *.safetensors weights (a pytorch_model.bin is not "
                          f"read: it would need unpickling); save the model with save_pretrained(safe_serialization=True)")
    return meta, state

"""Reading a local Hugging Face transformers directory: which family its config.json names,
the model's shape fields, and its weights as the family's plain state dict. Each family's
converter (`FamilySpec.hf`, e.g. `zoo/families/gpt/hf.py`) knows the renames."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Tuple

import torch

from zoo.errors import ConfigError

State = Dict[str, torch.Tensor]


def family_of_hf(directory: str | Path):
    """The spec of the family whose converter imports this directory's `model_type`."""
    from zoo.families import FAMILIES

    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise ConfigError(f"model.init_from={directory}: no config.json there; give a local transformers directory")
    model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    for spec in FAMILIES.values():
        if spec.hf is not None and model_type in spec.hf.model_types:
            return spec
    known = sorted(t for spec in FAMILIES.values() if spec.hf for t in spec.hf.model_types)
    raise ConfigError(f"model.init_from={directory}: model_type {model_type!r} is not supported; the zoo imports {known}")


def padded_meta(spec, meta: dict, multiple: int | None) -> dict:
    """The shape fields with the vocabulary padded up to `multiple` (model.vocab_pad_multiple,
    which every tensor-parallel size divides), `vocab_real` keeping the model's own count; the
    fields as they are where no multiple is given, the family pads nothing or the vocabulary
    is a multiple already."""
    vocab = meta["vocab_size"]
    if not multiple or not spec.hf.vocab_rows or vocab % multiple == 0:
        return meta
    return {**meta, "vocab_size": -(-vocab // multiple) * multiple, "vocab_real": vocab}


def hf_meta(directory: str | Path, pad_multiple: int | None = None):
    """(family spec, model shape fields) from a transformers directory's config.json alone;
    with `pad_multiple`, the vocabulary as the import pads it."""
    spec = family_of_hf(directory)
    meta = spec.hf.meta_from_config(json.loads((Path(directory) / "config.json").read_text()))
    return spec, padded_meta(spec, meta, pad_multiple)


def read_hf(directory: str | Path, family: str, pad_multiple: int | None = None) -> Tuple[dict, State]:
    """(model shape fields, plain state) of a local transformers directory holding a `family`
    model; with `pad_multiple`, its per-token tensors padded with zero rows (padded_meta)."""
    spec, _ = hf_meta(directory)
    if spec.name != family:
        raise ConfigError(f"model.init_from={directory} holds a {spec.name} model, not a {family}")
    meta, state = spec.hf.from_hf(Path(directory))
    padded = padded_meta(spec, meta, pad_multiple)
    extra = padded["vocab_size"] - meta["vocab_size"]
    if extra:
        state = {k: (torch.cat([v, v.new_zeros(extra, *v.shape[1:])]) if k in spec.hf.vocab_rows else v)
                 for k, v in state.items()}
    return padded, state


def strip_vocab_padding(spec, meta: dict, state: State) -> Tuple[dict, State]:
    """What an export writes: the imported model's own vocabulary, the pad rows of its
    per-token tensors dropped (the inverse of read_hf's padding)."""
    real = meta.get("vocab_real")
    meta = {k: v for k, v in meta.items() if k != "vocab_real"}
    if real is None or spec.hf is None:
        return meta, state
    return {**meta, "vocab_size": real}, {k: (v[:real] if k in spec.hf.vocab_rows else v) for k, v in state.items()}

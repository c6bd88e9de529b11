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


def hf_meta(directory: str | Path):
    """(family spec, model shape fields) from a transformers directory's config.json alone."""
    spec = family_of_hf(directory)
    return spec, spec.hf.meta_from_config(json.loads((Path(directory) / "config.json").read_text()))


def read_hf(directory: str | Path, family: str) -> Tuple[dict, State]:
    """(model shape fields, plain state) of a local transformers directory holding a `family` model."""
    spec, _ = hf_meta(directory)
    if spec.name != family:
        raise ConfigError(f"model.init_from={directory} holds a {spec.name} model, not a {family}")
    return spec.hf.from_hf(Path(directory))

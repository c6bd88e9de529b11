"""The model families, one folder each, and the registry that maps `model.family` to its
`FamilySpec` (zoo/families/spec.py says what a spec provides). Adding a family: a folder
with its spec (and a plain model under zoo/models/), plus one line in FAMILIES."""
from __future__ import annotations

from typing import Dict

from zoo.errors import ConfigError
from zoo.families import bert, cnn, gpt, llama
from zoo.families.spec import FamilySpec

FAMILIES: Dict[str, FamilySpec] = {spec.name: spec for spec in (gpt.SPEC, llama.SPEC, bert.SPEC, cnn.SPEC)}


def family(name: str) -> FamilySpec:
    """The spec of `model.family=name`."""
    if name not in FAMILIES:
        raise ConfigError(f"model.family={name!r} is unknown; choose one of {list(FAMILIES)}")
    return FAMILIES[name]


def family_of_shape(shape) -> FamilySpec:
    """The spec whose model is built from this kind of shape."""
    for spec in FAMILIES.values():
        if isinstance(shape, spec.shape_type):
            return spec
    raise TypeError(f"no model family builds from a {type(shape).__name__}")


def model_dims(cfg, vocab_size=None, *, pad_token_id: int = 0):
    """The shape of `cfg`'s model from the config alone (families whose shape needs no data)."""
    spec = family(cfg.family)
    if spec.shape is None:
        raise ConfigError(f"model.family={cfg.family} has no dimensions without its data (its shape comes "
                          f"from model.size and the data)")
    return spec.shape(cfg, vocab_size, pad_token_id=pad_token_id)

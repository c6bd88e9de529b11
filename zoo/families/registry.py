"""The registry that maps `model.family` to its `FamilySpec` (zoo/families/spec.py says what a
spec provides; each family's is its folder's family.py). Adding a family: a folder with its
family.py (and a plain model under zoo/models/), plus one line in FAMILIES."""
from __future__ import annotations

from typing import Dict

from zoo.families.bert.family import SPEC as BERT
from zoo.families.cnn.family import SPEC as CNN
from zoo.families.gpt.family import SPEC as GPT
from zoo.families.llama.family import SPEC as LLAMA
from zoo.families.spec import FamilySpec
from zoo.run.errors import ConfigError

FAMILIES: Dict[str, FamilySpec] = {spec.name: spec for spec in (GPT, LLAMA, BERT, CNN)}


def family(name: str) -> FamilySpec:
    """The spec of `model.family=name`."""
    if name not in FAMILIES:
        raise ConfigError(f"model.family={name!r} is unknown; choose one of {list(FAMILIES)}")
    return FAMILIES[name]


def check_size(family_name: str, size: str) -> None:
    """A model.size that is another family's preset (`model.size=llama3-8b` without
    `model=llama`) is refused naming that family; an unknown one is left to the family."""
    if size in family(family_name).sizes or size is None:
        return
    owners = [name for name, spec in FAMILIES.items() if size in spec.sizes]
    if owners:
        raise ConfigError(f"model.size={size!r} is a size of model.family={owners[0]}, not of model.family="
                          f"{family_name}; add model={owners[0]} (the family's config group), or choose one of "
                          f"{sorted(family(family_name).sizes)}")


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

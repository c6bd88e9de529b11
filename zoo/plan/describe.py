"""The model as the planner sees it: a family's `FamilySpec.planner` looked up by
`model.family` (the family layer's planner descriptions, in each family's plan.py, build on
zoo.plan.model_desc' types and never look a family up)."""
from __future__ import annotations

from zoo.config.schema import ModelConfig
from zoo.plan.model_desc import ModelDesc


def describe_model(cfg: ModelConfig, vocab_size: int) -> ModelDesc:
    """The planner's description of `cfg` (its family's `FamilySpec.planner`); `vocab_size`
    is the tokenizer's, for families that have one."""
    from zoo.families.registry import FAMILIES, family
    from zoo.run.errors import ConfigError

    spec = family(cfg.family)
    if spec.planner is None:
        planned = sorted(name for name, s in FAMILIES.items() if s.planner is not None)
        raise ConfigError(f"model.family={cfg.family!r} has no planner description; the planner knows {planned} "
                          f"(a family plugs in with FamilySpec.planner)")
    return spec.planner(cfg, vocab_size)

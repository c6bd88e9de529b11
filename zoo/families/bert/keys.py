"""The `data.*` keys only BERT reads (its masking); `zoo.config.schema.DataConfig` composes
them, and `zoo.families.data_keys.MASKED_TEXT` says which of its sources read each."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MaskingDataKeys:
    mlm_probability: float = 0.15
    """BERT: share of the tokens selected for the masked-LM objective (80% [MASK], 10% random,
    10% kept)."""

"""The `model.*` keys only the Llama family reads; `zoo.config.schema.ModelConfig` composes
them, and validation refuses them for the other families (zoo.families.transformer)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class LlamaModelKeys:
    n_kv_head: Optional[int] = None
    """Llama: key/value heads (grouped-query attention; 1: multi-query), dividing n_head.
    None: the preset's."""
    intermediate_size: Optional[int] = None
    """Llama: the SwiGLU MLP's width. None: the preset's."""
    rope_theta: Optional[float] = None
    """Llama: the rotary embeddings' base. None: the preset's."""
    tie_embeddings: Optional[bool] = None
    """Llama: the LM head shares the token embedding's weight (as SmolLM). None: the preset's
    (untied but for smollm-135m). GPT and BERT always tie theirs."""

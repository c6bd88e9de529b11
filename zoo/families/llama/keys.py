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
    head_dim: Optional[int] = None
    """Llama: each attention head's width where it is not n_embd / n_head (Qwen3's 128). None:
    the preset's (n_embd / n_head for all but the qwen3 sizes)."""
    attention_bias: Optional[bool] = None
    """Llama: biases on the query, key and value projections (Qwen2). None: the preset's."""
    qk_norm: Optional[bool] = None
    """Llama: an RMSNorm over each query and key head before the rotary embeddings (Qwen3).
    None: the preset's."""
    sliding_window: Optional[int] = None
    """Llama: Mistral's attention window (the tokens a token sees, itself included), in every
    layer (under parallel.cp too; Qwen's per-layer windows are refused). None: the preset's."""

"""The Llama shape a model config names: its size preset with every dimension the config
overrides (training builds it, the planner describes it: one reading of the keys)."""
from __future__ import annotations

from zoo.families.transformer import PLACEHOLDER_VOCAB
from zoo.models.llama import LlamaShape, llama_shape


def llama_dims(cfg, vocab_size=None, pad_token_id=0) -> LlamaShape:
    """`cfg`'s (a ModelConfig) Llama shape; a placeholder vocabulary where the tokenizer is not known yet."""
    return llama_shape(cfg.size, vocab_size or PLACEHOLDER_VOCAB, n_layer=cfg.n_layer, n_head=cfg.n_head,
                       n_kv_head=cfg.n_kv_head, n_embd=cfg.n_embd, intermediate_size=cfg.intermediate_size,
                       block_size=cfg.block_size, rope_theta=cfg.rope_theta, tie_embeddings=cfg.tie_embeddings,
                       head_size=cfg.head_dim, attention_bias=cfg.attention_bias, qk_norm=cfg.qk_norm,
                       sliding_window=cfg.sliding_window)

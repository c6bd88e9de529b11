"""Model families as plain single-device modules (one file per family)."""
from __future__ import annotations

from typing import Optional

from zoo.config.schema import ModelConfig
from zoo.models.gpt import GPTShape, gpt_shape

# Used for checks before the tokenizer is known; any multiple of the pad size.
_PLACEHOLDER_VOCAB = 128


def padded_vocab(tokenizer_len: int, cfg: ModelConfig) -> int:
    """The model's vocabulary: model.vocab_size, or the tokenizer's padded to vocab_pad_multiple."""
    if cfg.vocab_size is not None:
        if cfg.vocab_size < tokenizer_len:
            raise ValueError(f"model.vocab_size={cfg.vocab_size} is smaller than the tokenizer's {tokenizer_len} "
                             f"tokens; raise it or leave it null")
        return cfg.vocab_size
    m = cfg.vocab_pad_multiple
    return -(-tokenizer_len // m) * m


def model_dims(cfg: ModelConfig, vocab_size: Optional[int]) -> GPTShape:
    return gpt_shape(cfg.size, vocab_size or _PLACEHOLDER_VOCAB, n_layer=cfg.n_layer, n_head=cfg.n_head,
                     n_embd=cfg.n_embd, block_size=cfg.block_size, ffn_mult=cfg.ffn_mult, dropout=cfg.dropout)

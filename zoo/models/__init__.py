"""Model families as plain single-device modules (one file per family)."""
from __future__ import annotations

from typing import Optional, Union

from zoo.config.schema import ModelConfig
from zoo.models.bert import BertShape, bert_shape
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


def model_dims(cfg: ModelConfig, vocab_size: Optional[int], *, pad_token_id: int = 0) -> Union[GPTShape, BertShape]:
    """The shape of a transformer family (gpt, bert) from the config; the CNN's depends on
    the images and comes from `zoo.models.cnn.cnn_shape`."""
    if cfg.family == "cnn":
        raise ValueError("model.family=cnn has no transformer dimensions; see zoo.models.cnn.cnn_shape")
    dims = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                ffn_mult=cfg.ffn_mult, dropout=cfg.dropout)
    if cfg.family == "bert":
        return bert_shape(cfg.size, vocab_size or _PLACEHOLDER_VOCAB, pad_token_id=pad_token_id, **dims)
    return gpt_shape(cfg.size, vocab_size or _PLACEHOLDER_VOCAB, **dims)

"""Tokenizers: trained here with `tokenizers` and cached, or loaded from a directory or the Hub.

A trained tokenizer is saved as a transformers `PreTrainedTokenizerFast` directory, so
the run directory's `tokenizer/` loads with `AutoTokenizer.from_pretrained`.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from data_pipelines.cache import cache_key, cache_root, cached_dir

EOS = "<|endoftext|>"


def _train_byte_level_bpe(docs: List[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def train_gpt_tokenizer(docs: List[str], vocab_size: int, source_key: str, cache_dir: Optional[str] = None) -> Path:
    """A byte-level BPE tokenizer (GPT-2's kind) trained on `docs`, cached by source and size."""
    from transformers import PreTrainedTokenizerFast

    entry = cache_root(cache_dir) / "tokenizers" / f"bpe-{cache_key(source=source_key, vocab=vocab_size)}"

    def build(tmp: Path) -> None:
        tok = _train_byte_level_bpe(docs, vocab_size)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS)
        fast.save_pretrained(str(tmp))

    return cached_dir(entry, build)


def load_tokenizer(path_or_name: str):
    """A transformers fast tokenizer from a local directory or a Hub name."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path_or_name, use_fast=True)

"""Which `data.*` keys each data source reads, per kind of data (a family's spec names its
table): validation refuses a key set for a source that would ignore it, naming the sources
that read it, so `data.path=corpus.jsonl` without `data=files` never trains on the built-in
corpus in silence. Keys every source reads (name, eval_fraction, num_workers, cache_dir) are
not listed."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

TOKENIZING = ("pydoc", "files", "hub")  # the sources a tokenizer is trained on or applied to
"""A prepared directory holds its tokens and its tokenizer."""

CAUSAL_TEXT: Dict[str, Tuple[str, ...]] = {
    "path": ("files", "hub", "prepared", "chat"),
    "text_column": ("files", "hub"),
    "tokenizer": (*TOKENIZING, "chat"),
    "vocab_size": TOKENIZING,
    "num_proc": (*TOKENIZING, "chat"),
    "document_mask": (*TOKENIZING, "prepared", "chat"),
    "eod_mask_loss": (*TOKENIZING, "prepared"),
    "train_on": ("chat",),
    "chat_template": ("chat",),
    "packing": ("chat",),
    "truncate": ("chat",),
}
"""GPT and Llama: packed blocks of tokens."""

MASKED_TEXT: Dict[str, Tuple[str, ...]] = {
    # Its sentence pairs are built in one process; its attention is bidirectional within a pair.
    **{k: tuple(s for s in v if s != "chat") for k, v in CAUSAL_TEXT.items()
       if k not in ("num_proc", "document_mask", "eod_mask_loss", "train_on", "chat_template", "packing", "truncate")},
    "mlm_probability": ("pydoc", "files", "hub", "prepared"),
}
"""BERT: sentence-pair samples, masked."""

IMAGES: Dict[str, Tuple[str, ...]] = {
    "path": ("files", "hub"),
    "image_size": ("files", "hub"),
    "image_column": ("hub",),
    "label_column": ("hub",),
}
"""The CNN: labelled images."""

ONLY_FOR: Dict[str, str] = {
    "document_mask": "attention within each document is for the causal language models (model=gpt, model=llama); "
                     "BERT attends both ways within its sentence pairs",
    **{k: "conversations for fine-tuning are for the causal language models (model=gpt, model=llama, model=qwen2, "
          "...)" for k in ("train_on", "chat_template", "packing", "truncate")},
    "eod_mask_loss": "masking the target after each end-of-document token is for the causal language models "
                     "(model=gpt, model=llama); BERT predicts only its masked tokens",
}
"""Why a key belongs to some families only, for the refusal in the others."""

CHECKED = tuple(dict.fromkeys([*CAUSAL_TEXT, *MASKED_TEXT, *IMAGES]))
"""Every key some source ignores."""


def own_tokenizer(data, init_from) -> Optional[str]:
    """The directory of a tokenizer that comes with its own vocabulary: data.tokenizer, else
    model.init_from where it holds a tokenizer.json; None where one is trained on the data."""
    from pathlib import Path

    if data.tokenizer:
        return data.tokenizer
    if init_from and (Path(init_from).expanduser() / "tokenizer.json").exists():
        return init_from
    return None


def tokenizer_brought(data, init_from) -> str:
    """What supplies the tokenizer with its own vocabulary (own_tokenizer, named), or ""."""
    if own_tokenizer(data, init_from) is None:
        return ""
    return f"data.tokenizer={data.tokenizer}" if data.tokenizer else f"model.init_from={init_from}'s tokenizer"


def unread(data, keys: Dict[str, Tuple[str, ...]], init_from=None) -> Tuple[str, ...]:
    """The `data.*` keys a run with this data section does not read (its family's table `keys`):
    those no chosen source reads, `path` beside data.mix (each entry names its own), and
    `vocab_size` where the tokenizer comes with its own vocabulary. The run's recorded config
    (config.yaml, wandb) leaves them out, so it shows what the run used."""
    sources = {m["name"] for m in data.mix if isinstance(m, dict)} if data.mix else {data.name}
    out = [key for key in CHECKED if not sources & set(keys.get(key, ()))]
    if data.mix and "path" not in out:
        out.append("path")
    if "vocab_size" not in out and tokenizer_brought(data, init_from):
        out.append("vocab_size")
    return tuple(out)

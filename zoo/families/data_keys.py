"""Which `data.*` keys each data source reads, per kind of data (a family's spec names its
table): validation refuses a key set for a source that would ignore it, naming the sources
that read it, so `data.path=corpus.jsonl` without `data=files` never trains on the built-in
corpus in silence. Keys every source reads (name, eval_fraction, num_workers, cache_dir) are
not listed."""
from __future__ import annotations

from typing import Dict, Tuple

TOKENIZING = ("pydoc", "files", "hub")  # the sources a tokenizer is trained on or applied to
"""A prepared directory holds its tokens and its tokenizer."""

CAUSAL_TEXT: Dict[str, Tuple[str, ...]] = {
    "path": ("files", "hub", "prepared"),
    "text_column": ("files", "hub"),
    "tokenizer": TOKENIZING,
    "vocab_size": TOKENIZING,
    "num_proc": TOKENIZING,
}
"""GPT and Llama: packed blocks of tokens."""

MASKED_TEXT: Dict[str, Tuple[str, ...]] = {
    **{k: v for k, v in CAUSAL_TEXT.items() if k != "num_proc"},  # its sentence pairs are built in one process
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

CHECKED = tuple(dict.fromkeys([*CAUSAL_TEXT, *MASKED_TEXT, *IMAGES]))
"""Every key some source ignores."""

"""Tokenizers: trained here with `tokenizers` and cached, or loaded from a directory or the Hub.

GPT gets a byte-level BPE (GPT-2's kind), BERT a lower-cased WordPiece with BERT's special
tokens and its [CLS] A [SEP] B [SEP] template (segment ids 0 then 1). A trained tokenizer
is saved as a transformers fast-tokenizer directory, so the run directory's `tokenizer/`
loads with `AutoTokenizer.from_pretrained`.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from data_pipelines.cache import cache_key, cache_root, cached_dir

EOS = "<|endoftext|>"
BERT_SPECIAL = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                "mask_token": "[MASK]"}


def _train_byte_level_bpe(docs: Iterable[str], vocab_size: int):
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
    entry = cache_root(cache_dir) / "tokenizers" / f"bpe-{cache_key(source=source_key, vocab=vocab_size)}"

    return cached_dir(entry, lambda tmp: write_gpt_tokenizer(docs, vocab_size, tmp))


def write_gpt_tokenizer(docs: Iterable[str], vocab_size: int, dest: Path) -> None:
    """Train a byte-level BPE on `docs` (streamed: any iterable) and save it into `dest` as a
    transformers fast-tokenizer directory, <|endoftext|> its end, start and unknown token."""
    from transformers import PreTrainedTokenizerFast

    tok = _train_byte_level_bpe(docs, vocab_size)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS)
    fast.save_pretrained(str(dest))


def _bert_pieces(model):
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers

    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def _train_wordpiece(docs: List[str], vocab_size: int):
    """BERT's WordPiece vocabulary, the same on every machine and every call.

    `tokenizers`' WordPiece trainer gives the `##` continuation pieces their ids in the order a
    randomly seeded hash map yields the words (huggingface/tokenizers #1794), and merges of equal
    count are ordered by those ids: trained twice on the same text it gave four different
    vocabularies in four calls, so a run's data, and every number after it, changed with the
    machine that prepared it (and two nodes preparing their own caches would disagree on token
    ids). Here a first pass with no merges lists the continuation pieces; the real pass gets
    them, sorted, beside the special tokens, so no id is left to the hash order. They are then
    ordinary vocabulary entries of the saved tokenizer, not special tokens."""
    from tokenizers import models, processors, trainers

    special = list(BERT_SPECIAL.values())
    unk = BERT_SPECIAL["unk_token"]
    probe = _bert_pieces(models.WordPiece(unk_token=unk))
    probe.train_from_iterator(docs, trainer=trainers.WordPieceTrainer(vocab_size=1, special_tokens=special,
                                                                      show_progress=False))
    pieces = sorted(t for t in probe.get_vocab(with_added_tokens=False) if t.startswith("##") and len(t) > 2)
    trained = _bert_pieces(models.WordPiece(unk_token=unk))
    trained.train_from_iterator(docs, trainer=trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=special + pieces, show_progress=False))
    tok = _bert_pieces(models.WordPiece(vocab=trained.get_vocab(with_added_tokens=False), unk_token=unk))
    tok.add_special_tokens(special)
    cls, sep = BERT_SPECIAL["cls_token"], BERT_SPECIAL["sep_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))])
    return tok


def train_bert_tokenizer(docs: List[str], vocab_size: int, source_key: str, cache_dir: Optional[str] = None) -> Path:
    """A lower-cased WordPiece tokenizer (BERT's kind) trained on `docs`, cached by source and size."""
    from transformers import BertTokenizerFast

    key = cache_key(source=source_key, vocab=vocab_size, pieces="sorted")  # sorted: the pieces' ids, _train_wordpiece
    entry = cache_root(cache_dir) / "tokenizers" / f"wordpiece-{key}"

    def build(tmp: Path) -> None:
        BertTokenizerFast(tokenizer_object=_train_wordpiece(docs, vocab_size), **BERT_SPECIAL).save_pretrained(str(tmp))

    return cached_dir(entry, build)


def load_tokenizer(path_or_name: str):
    """A transformers fast tokenizer from a local directory or a Hub name."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path_or_name, use_fast=True)


class LazyTokenizer:
    """A local directory's transformers tokenizer, loaded on first use. Its length, all that a
    run's start asks of it, is read with `tokenizers` from `tokenizer.json` (milliseconds),
    so a GPT or Llama run imports transformers (1.3-1.9 s on 2 cores) only to encode or decode
    a sample. Where the directory's configs name a special token that `tokenizer.json` lacks
    (transformers would add it: one more token), the length comes from transformers itself."""

    def __init__(self, directory: str):
        self.directory = directory
        self._loaded = None
        self._length: Optional[int] = None

    @property
    def loaded(self):
        if self._loaded is None:
            self._loaded = load_tokenizer(self.directory)
        return self._loaded

    def __len__(self) -> int:
        if self._loaded is None and self._length is None:
            self._length = _length_without_transformers(Path(self.directory))
        return len(self.loaded) if self._length is None else self._length

    def __call__(self, *args, **kwargs):
        return self.loaded(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loaded, name)


def _length_without_transformers(directory: Path) -> Optional[int]:
    """The vocabulary with its added tokens, from tokenizer.json; None where transformers must say."""
    import json

    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    named = []
    for config in ("tokenizer_config.json", "special_tokens_map.json"):
        if (directory / config).is_file():
            data = json.loads((directory / config).read_text())
            for key, value in data.items():
                if key.endswith("_token") or key == "additional_special_tokens":
                    named.extend(value if isinstance(value, list) else [value])
            named.extend((data.get("added_tokens_decoder") or {}).values())
    contents = [v.get("content") if isinstance(v, dict) else v for v in named]
    if any(isinstance(c, str) and tok.token_to_id(c) is None for c in contents):
        return None
    return tok.get_vocab_size(with_added_tokens=True)


def backend_without_transformers(directory: Path) -> Optional[Tuple[str, Optional[int], int]]:
    """A local fast tokenizer read with `tokenizers` alone (no transformers: 260 MB in every
    process that imports it): its backend (tokenizer.json's text), the id that ends a document
    (its eos token, else its sep token, as transformers gives them) and its length. None where
    transformers must say: no tokenizer.json, files that do not name their class, a special
    token tokenizer.json lacks, or the two config files naming different end tokens."""
    import json

    from tokenizers import Tokenizer

    length = _length_without_transformers(directory)
    if length is None or not _names_its_class(directory):
        return None
    named: dict = {}
    for config in ("tokenizer_config.json", "special_tokens_map.json"):
        if (directory / config).is_file():
            data = json.loads((directory / config).read_text())
            for key in ("eos_token", "sep_token"):
                value = data.get(key)
                value = value.get("content") if isinstance(value, dict) else value
                if value is not None and named.setdefault(key, value) != value:
                    return None
    backend = (directory / "tokenizer.json").read_text()
    tok = Tokenizer.from_str(backend)
    ends = [tok.token_to_id(named[k]) for k in ("eos_token", "sep_token") if k in named]
    return backend, (ends[0] if ends else None), length


# The files a transformers tokenizer consists of, whatever its kind (save_pretrained writes a
# subset). A model's directory holds them beside config.json and the weights, which are not the
# tokenizer's: a run copies, and an export ships, only these.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json")


def tokenizer_files(directory: Path) -> List[Path]:
    """The tokenizer's own files in `directory` (a tokenizer's or a whole model's directory)."""
    return [directory / name for name in TOKENIZER_FILES if (directory / name).is_file()]


def _names_its_class(directory: Path) -> bool:
    """Whether the tokenizer files say which tokenizer they are (else transformers reads the
    model's config.json to find out, and a copy of the files alone would not load)."""
    import json

    config = directory / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text()).get("tokenizer_class"))
    except (OSError, ValueError):
        return False


def save_tokenizer(path_or_name: str, dest: Path) -> None:
    """Put the tokenizer into `dest` (a run directory's `tokenizer/`), once: its own files only,
    never the weights or the config.json of a model directory it may sit in."""
    if dest.exists():
        return
    src = Path(path_or_name)
    if src.is_dir() and _names_its_class(src):
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in tokenizer_files(src):
            shutil.copy2(f, tmp / f.name)
        os.replace(tmp, dest)
    else:  # a Hub name, or files that need the model's config to load: transformers writes its own
        load_tokenizer(path_or_name).save_pretrained(str(dest))

"""The tokenizers trained here are the same on every call and every machine. `tokenizers`'
WordPiece trainer alone was not (huggingface/tokenizers #1794: the `##` pieces took their ids
in a randomly seeded hash order, and merges of equal count followed them): four trainings on
the same text gave four vocabularies, so BERT's data, and the tests comparing two BERT layouts,
changed from one clean checkout to the next."""
from __future__ import annotations

import subprocess
import sys

from data_pipelines.tokenizer import BERT_SPECIAL, _train_byte_level_bpe, _train_wordpiece

_DOCS = None


def _docs() -> list:
    global _DOCS
    if _DOCS is None:
        from pydoc_data.topics import topics

        _DOCS = [topics[k] for k in sorted(topics)[:60]]
    return _DOCS


def test_wordpiece_is_the_same_on_every_call_and_in_another_process():
    first = _train_wordpiece(_docs(), 1500).to_str()
    assert all(_train_wordpiece(_docs(), 1500).to_str() == first for _ in range(3))
    code = ("import sys; from tests.unit.data.test_tokenizer_determinism import _docs, _train_wordpiece; "
            "sys.stdout.write(_train_wordpiece(_docs(), 1500).to_str())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other == first


def test_wordpiece_keeps_bert_s_specials_and_continuation_pieces_as_vocabulary():
    tok = _train_wordpiece(_docs(), 1500)
    vocab = tok.get_vocab()
    assert tok.get_vocab_size() == 1500
    assert [vocab[t] for t in BERT_SPECIAL.values()] == [0, 1, 2, 3, 4]
    specials = [t for t, added in tok.get_added_tokens_decoder().items() if added.special]
    assert sorted(specials) == [0, 1, 2, 3, 4]  # the ## pieces are not special tokens
    enc = tok.encode("Lambda expressions yield generators", "raise")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2 and "[UNK]" not in enc.tokens
    assert any(t.startswith("##") for t in tok.encode("zyxwvut qzqz").tokens)
    assert tok.decode(tok.encode("lambda expressions").ids) == "lambda expressions"


def test_byte_level_bpe_is_the_same_on_every_call():
    first = _train_byte_level_bpe(_docs(), 800).to_str()
    assert _train_byte_level_bpe(_docs(), 800).to_str() == first

"""#38 items 3 and 4: data=files and data=hub stream their documents into the data cache
through the sharded preparation (never a list of all texts, for the tokenizer's training as for
the tokens), and data.mix mixes prepared corpora by tokens."""
from __future__ import annotations

import json
import weakref

import numpy as np
import pytest

from data_pipelines import text_sources
from data_pipelines.mixture import MixedBlocks
from data_pipelines.prepare import PreparedBlocks, TokenShards, prepare
from data_pipelines.text_sources import open_source
from data_pipelines.token_cache import prepare_cached
from data_pipelines.tokenizer import train_gpt_tokenizer
from tests.conftest import REPO
from zoo.run.errors import DataError


class _Doc(str):
    """A document's text that can be counted while alive (a plain str takes no weak reference)."""


@pytest.fixture
def live_documents(monkeypatch):
    """Every .txt document read from now on is a _Doc; returns (alive now, most alive at once)."""
    alive: weakref.WeakSet = weakref.WeakSet()
    peak = [0]
    real = text_sources._text_file

    def counted(f, counts):
        doc = _Doc(real(f, counts))
        alive.add(doc)
        peak[0] = max(peak[0], len(alive))
        return doc

    monkeypatch.setattr(text_sources, "_text_file", counted)
    return alive, peak


def _many_files(root, n):
    root.mkdir()
    for i in range(n):
        (root / f"doc{i:05d}.txt").write_text(f"document {i}: " + "def f(x): return x * %d\n" % i * (3 + i % 5))
    return root


def test_a_corpus_of_many_files_is_streamed_not_held(tmp_path, live_documents):
    """5,000 files through the tokenizer's training and the preparation into the cache: at most
    two batches of documents (--batch-docs 1,000: the one written and the next one read) are
    alive at once, never the corpus."""
    alive, peak = live_documents
    source = open_source("files", str(_many_files(tmp_path / "corpus", 5000)))
    tok = train_gpt_tokenizer((t for t in source.texts({})), 300, source.key, cache_dir=str(tmp_path / "cache"))
    trained_peak = peak[0]
    peak[0] = 0
    entry = prepare_cached(source, str(tok), cache_dir=str(tmp_path / "cache"), workers=1, in_process=True)
    assert TokenShards(entry).meta["documents"] == 5000
    assert trained_peak <= 2001 and peak[0] <= 2001, (trained_peak, peak[0])
    # The same tokens as one in-memory pass of the tokenizer over the documents, each ended by its eos.
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(tok))
    texts = [(tmp_path / "corpus" / f"doc{i:05d}.txt").read_text() for i in range(5000)]
    want = np.concatenate([np.asarray([*ids, t.eos_token_id]) for ids in t(texts, add_special_tokens=False)["input_ids"]])
    got = TokenShards(entry)
    assert np.array_equal(got.read(0, len(got)), want)
    # A second use finds the entry (keyed by the files' paths, sizes and mtimes, and the tokenizer).
    assert prepare_cached(open_source("files", str(tmp_path / "corpus")), str(tok), cache_dir=str(tmp_path / "cache"),
                          workers=2) == entry


def test_the_cache_is_prepared_in_a_fresh_interpreter_with_the_same_bytes(tmp_path):
    """A training rank's cache entry comes from `python -m data_pipelines.token_cache` (the
    same tokens as preparing in-process, with its default workers); its DataError reaches the
    rank as the same one line; a source changed since it was opened is refused."""
    import os

    source = open_source("files", str(_many_files(tmp_path / "corpus", 300)))
    tok = train_gpt_tokenizer(source.texts({}), 300, source.key, cache_dir=str(tmp_path / "cache"))
    child = prepare_cached(source, str(tok), cache_dir=str(tmp_path / "child"))
    here = prepare_cached(source, str(tok), cache_dir=str(tmp_path / "here"), workers=1, in_process=True)
    assert child.name == here.name
    assert TokenShards(child).meta["documents"] == 300
    for f in sorted(here.glob("tokens-*.bin")):
        assert (child / f.name).read_bytes() == f.read_bytes()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(DataError, match=r"^data.path=.*empty holds no text \(1 empty records"):
        prepare_cached(open_source("files", str(tmp_path / "empty")), str(tok), cache_dir=str(tmp_path / "child"))
    stale = open_source("files", str(tmp_path / "corpus"))
    os.utime(tmp_path / "corpus" / "doc00000.txt", (1, 1))
    with pytest.raises(DataError, match=r"changed while the run started"):
        prepare_cached(stale, str(tok), cache_dir=str(tmp_path / "stale"))


def test_a_hub_dataset_streams_row_by_row_and_is_keyed_without_reading(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(50)] + [""]}).save_to_disk(str(tmp_path / "ds"))
    source = open_source("hub", str(tmp_path / "ds"))
    texts = source.texts(counts := {})
    assert not isinstance(texts, list) and next(texts) == "row 0"
    assert len(list(texts)) == 49 and counts == {"empty_skipped": 1}
    assert open_source("hub", str(tmp_path / "ds")).key == source.key
    with pytest.raises(DataError, match=r"has no column 'body'"):
        open_source("hub", str(tmp_path / "ds"), "body")


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """Two prepared directories of one tokenizer: a large and a small corpus."""
    root = tmp_path_factory.mktemp("mix")
    big, small = root / "big.jsonl", root / "small.jsonl"
    rng = np.random.default_rng(0)  # varied text: no two blocks alike

    def docs(n):
        return "".join(json.dumps({"text": " ".join(f"w{w}" for w in rng.integers(0, 900, 60))}) + "\n"
                       for _ in range(n))

    big.write_text(docs(200))
    small.write_text(docs(20))
    tok = str(train_gpt_tokenizer([big.read_text(), small.read_text()], 300, "test-mix", cache_dir=str(root / "c")))
    dirs = []
    for f in (big, small):
        prepare("files", str(f), tok, root / f.stem, workers=1)
        dirs.append(root / f.stem)
    return dirs


def test_a_mixture_takes_tokens_by_weight_and_never_trains_on_held_out_blocks(two_corpora):
    parts = [PreparedBlocks(d, 31, 0.1) for d in two_corpora]
    n_big, n_small = (len(p.train) for p in parts)
    mixed = MixedBlocks(parts, [1.0, 1.0], ["big", "small"])
    counts = [s["mixed_blocks"] for s in mixed.meta["mix"]]
    assert counts == [n_big, n_big] and len(mixed.train) == 2 * n_big  # the small corpus repeated to half the tokens
    assert len(mixed.eval) == len(parts[0].eval) + len(parts[1].eval)
    train_rows = {mixed.train[k].tobytes() for k in range(len(mixed.train))}
    assert not train_rows & {mixed.eval[k].tobytes() for k in range(len(mixed.eval))}
    assert train_rows == {p.train[k].tobytes() for p in parts for k in range(len(p.train))}
    batch = mixed.train[np.array([0, n_big, len(mixed.train) - 1])]
    assert batch.shape == (3, 32) and np.array_equal(batch[1], parts[1].train[0])
    skewed = MixedBlocks(parts, [1.0, 3.0], ["big", "small"])  # 3:1 by tokens: the big one is cut to a third
    assert [s["mixed_blocks"] for s in skewed.meta["mix"]] == [round(n_big / 3 * 1), n_big] or \
        abs(skewed.meta["mix"][0]["share_of_tokens"] - 0.25) < 0.01
    assert abs(skewed.meta["mix"][1]["share_of_tokens"] - 0.75) < 0.01
    with pytest.raises(DataError, match=r"weights \[1.0, 0.0\] must be positive"):
        MixedBlocks(parts, [1.0, 0.0], ["big", "small"])


def test_prepared_directories_of_different_tokenizers_are_refused_before_launch(two_corpora, tmp_path):
    from tests.unit.config.test_config import composed
    from zoo.config.paths import check_paths
    from zoo.families.registry import family
    from zoo.run.errors import ConfigError

    other_tok = train_gpt_tokenizer(["other words entirely " * 50], 280, "test-mix-other", str(tmp_path / "c"))
    prepare("files", str(two_corpora[0].parent / "small.jsonl"), str(other_tok), tmp_path / "other", workers=1)
    cfg = composed()
    cfg.data.mix = [{"name": "prepared", "path": str(two_corpora[0])}, {"name": "prepared", "path": str(tmp_path / "other")}]
    with pytest.raises(ConfigError, match=r"data.mix\[1\].path=.*other was prepared with another tokenizer "
                                          r"\(\d+ tokens\) than data.mix\[0\].path=.*big \(\d+ tokens\): a mixture "
                                          r"is one token stream; prepare both with one --tokenizer"):
        check_paths(cfg, family("gpt"))
    cfg.data.mix = [{"name": "prepared", "path": str(two_corpora[0])}, {"name": "prepared", "path": str(two_corpora[1])}]
    check_paths(cfg, family("gpt"))  # one tokenizer: fine
    cfg.data.tokenizer = str(other_tok)
    with pytest.raises(ConfigError, match=r"data.tokenizer=.* is not the tokenizer data.mix\[0\].path="):
        check_paths(cfg, family("gpt"))
    cfg.data.tokenizer = None
    cfg.data.mix = [{"name": "prepared", "path": str(tmp_path / "nothing")}]
    with pytest.raises(ConfigError, match=r"data.mix\[0\].path=.*nothing: no such directory"):
        check_paths(cfg, family("gpt"))


def test_a_long_document_is_encoded_in_pieces_to_the_same_ids(tmp_path):
    """GPT-2's byte-level pre-tokenizer: a document of megabytes goes to the tokenizer in pieces
    cut after lone newlines, and gives the ids of the whole (whitespace runs, blank lines, code)."""
    import glob

    from tokenizers import Tokenizer

    from data_pipelines.prepare import _Tokenize, items, pieces, splits_exactly

    texts = [open(f, errors="replace").read() for f in sorted(glob.glob(str(REPO / "zoo" / "**" / "*.py"),
                                                                        recursive=True))]
    long = "\n\n".join(texts) + "  \n  trailing   \n\n"
    assert len(list(pieces(long))) > 10 and "".join(pieces(long)) == long
    tok = train_gpt_tokenizer(texts[:40], 1000, "test-pieces", cache_dir=str(tmp_path))
    backend = (tok / "tokenizer.json").read_text()
    assert splits_exactly(json.loads(backend))
    whole = Tokenizer.from_str(backend).encode_batch([long, *texts[:5]], add_special_tokens=False)
    want = np.concatenate([np.asarray([*e.ids, 7], dtype=np.uint16) for e in whole])
    assert np.array_equal(_Tokenize(backend, 7, "uint16", threads=True)(list(items([long, *texts[:5]], True))), want)
    spm = {"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}}
    assert not splits_exactly(spm)
    assert not splits_exactly({"normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}})

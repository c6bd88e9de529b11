"""Text sources: files of every supported kind, Hugging Face datasets from local
directories, weighted mixtures, and bad data (clear errors or counted skips)."""
from __future__ import annotations

import json

import pytest

from data_pipelines.lm import pack
from data_pipelines.text_sources import DataError, mix, read_source


def test_every_file_kind_reads_its_text_column(tmp_path):
    import pandas as pd

    (tmp_path / "a.txt").write_text("plain text document")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": f"json {i}", "id": i}) for i in range(3)))
    pd.DataFrame({"text": ["parquet one", "parquet two"]}).to_parquet(tmp_path / "c.parquet")
    pd.DataFrame({"body": ["csv one"]}).to_csv(tmp_path / "d.csv", index=False)
    docs = read_source("files", str(tmp_path / "*.[tjp]*"))
    assert sorted(docs.texts) == sorted(["plain text document", "json 0", "json 1", "json 2", "parquet one",
                                         "parquet two"])
    assert read_source("files", str(tmp_path / "d.csv"), text_column="body").texts == ["csv one"]
    with pytest.raises(DataError, match=r"has no column 'text' \(columns: \['body'\]\); set data.text_column"):
        read_source("files", str(tmp_path / "d.csv"))


def test_a_local_hub_dataset_directory(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["from disk", ""]}).save_to_disk(str(tmp_path / "saved"))
    docs = read_source("hub", str(tmp_path / "saved"))
    assert docs.texts == ["from disk"] and docs.counts == {"empty_skipped": 1}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.jsonl").write_text(json.dumps({"text": "load_dataset on a local directory"}))
    assert read_source("hub", str(tmp_path / "raw")).texts == ["load_dataset on a local directory"]


def test_bad_data_is_an_error_or_a_counted_skip(tmp_path):
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 \xff\xfe not utf-8")
    (tmp_path / "empty.txt").write_text("   \n")
    docs = read_source("files", str(tmp_path))
    assert docs.counts == {"invalid_utf8_replaced": 1, "empty_skipped": 1} and len(docs.texts) == 2
    with pytest.raises(DataError, match="no such file or directory"):
        read_source("files", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="holds no text"):
        read_source("files", str(tmp_path / "empty.txt"))
    with pytest.raises(DataError, match="needs data.path"):
        read_source("files", None)
    (tmp_path / "x.docx").write_text("?")
    with pytest.raises(DataError, match=r"cannot read \['x.docx'\]; use files ending in"):
        read_source("files", str(tmp_path / "*.docx"))


def test_a_mixture_follows_its_weights(tmp_path):
    (tmp_path / "small.txt").write_text("x" * 1000)
    small, pydoc = read_source("files", str(tmp_path / "small.txt")), read_source("pydoc")
    mixed = mix([small, pydoc], [1, 3])
    share = sum(len(t) for t in mixed.texts if t == "x" * 1000) / sum(map(len, mixed.texts))
    assert share == pytest.approx(0.25, abs=0.01)
    with pytest.raises(DataError, match="must be positive"):
        mix([small], [0])


def test_packing_keeps_every_token_once():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11, 12]]  # a document longer than a block is split
    blocks, tail = pack(docs, eos_id=0, block_size=4)  # blocks of 5 tokens
    stream = [t for d in docs for t in (*d, 0)]
    assert blocks.ravel().tolist() + stream[len(blocks.ravel()):] == stream
    assert tail == len(stream) - blocks.size and tail < 5


def test_tokenizing_with_several_processes_gives_the_same_ids(tmp_path):
    from data_pipelines.corpus import pydoc_documents
    from data_pipelines.lm import tokenize_documents
    from data_pipelines.tokenizer import train_gpt_tokenizer

    docs = pydoc_documents()[:20]
    tok = str(train_gpt_tokenizer(docs, 512, "multi-proc-test", str(tmp_path)))
    assert tokenize_documents(docs, tok, num_proc=2) == tokenize_documents(docs, tok, num_proc=1)

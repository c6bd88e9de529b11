"""`python -m data_pipelines.prepare --train-tokenizer VOCAB_SIZE` (#49 item 4): a byte-level
BPE trained on the corpus it prepares, saved beside the shards; the same bytes for 1 and 2
workers; run again, it reuses its tokenizer; bad input is one line naming this command's flags."""
from __future__ import annotations

import json

import pytest

from data_pipelines.prepare import main
from tests.unit.data.test_prepare_shards import _files, _same


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    src = tmp_path_factory.mktemp("tok-corpus")
    for i in range(2):
        rows = [f"def f{i}_{j}(x):\n    return x * {j} + {i}  # the {j}th function" * (3 + j % 5) for j in range(120)]
        (src / f"part{i}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in rows))
    return src


def _prepare(*argv: str):
    try:
        main(list(argv))
    except SystemExit as stop:
        return stop.code
    return 0


def test_a_trained_tokenizer_gives_the_same_shards_for_any_workers_and_is_reused(corpus, tmp_path, capsys):
    outs = {w: tmp_path / f"w{w}" for w in (1, 2)}
    for workers, out in outs.items():
        assert _prepare("--path", str(corpus), "--train-tokenizer", "600", "--out", str(out), "--workers",
                        str(workers), "--shard-tokens", "4000", "--batch-docs", "20") == 0
    assert _same(outs[1], outs[2]) and "tokenizer/tokenizer.json" in _files(outs[1])
    meta = json.loads((outs[1] / "meta.json").read_text())
    assert 257 < meta["vocab"] <= 600 and len(meta["shards"]) >= 2 and meta["documents"] == 240  # merges run out

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(outs[1] / "tokenizer"))  # a transformers directory, as training reads it
    assert len(tok) == meta["vocab"] and tok.eos_token == "<|endoftext|>"
    text = "def f0_1(x):\n    return x * 1 + 0  # the 1th function"
    assert tok.decode(tok(text)["input_ids"]) == text
    # run again (a preparation resumed): its own tokenizer is taken, not trained anew, and nothing changes
    before = {f: (outs[1] / f).read_bytes() for f in _files(outs[1])}
    assert _prepare("--path", str(corpus), "--train-tokenizer", "600", "--out", str(outs[1]), "--workers", "1",
                    "--shard-tokens", "4000", "--batch-docs", "20") == 0
    assert {f: (outs[1] / f).read_bytes() for f in _files(outs[1])} == before
    capsys.readouterr()
    assert _prepare("--path", str(corpus), "--train-tokenizer", "700", "--out", str(outs[1]), "--workers", "1",
                    "--shard-tokens", "4000", "--batch-docs", "20") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"data_pipelines.prepare: error: --out {outs[1]} already holds a tokenizer") and \
        "'vocab_size': 600" in err and "'vocab_size': 700" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv, says", [
    (["--train-tokenizer", "100"], "--train-tokenizer 100 is below the 257 tokens a byte-level BPE starts with"),
    (["--train-tokenizer", "600", "--tokenizer", "gpt2"], "--tokenizer gpt2 and --train-tokenizer 600 both give"),
    (["--train-tokenizer", "600", "--part", "0/2"], "--train-tokenizer with --part 0/2: each part would train"),
    ([], "--tokenizer is required (a local tokenizer directory or a Hub name), or --train-tokenizer VOCAB_SIZE"),
    (["--train-tokenizer", "600", "--text-column", "body"], "has no column 'body' (columns: ['text']); set --text-column"),
])
def test_bad_input_is_one_line_naming_the_flags(corpus, tmp_path, capsys, argv, says):
    assert _prepare("--path", str(corpus), "--out", str(tmp_path / "out"), *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("data_pipelines.prepare: error: ") and says in err[0], err
    assert "data." not in err[0]  # this command's flags, not training's keys


def test_a_missing_path_names_the_flag(tmp_path, capsys):
    assert _prepare("--path", str(tmp_path / "nope"), "--train-tokenizer", "600", "--out", str(tmp_path / "o")) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"data_pipelines.prepare: error: --path {tmp_path / 'nope'}: no such file or directory", err


def test_a_source_without_text_is_refused_before_anything_is_trained_or_written(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    out = tmp_path / "out"
    assert _prepare("--path", str(tmp_path / "empty.jsonl"), "--train-tokenizer", "600", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no text" in err[0] and "point --path at files with text" in err[0], err
    assert not out.exists()

"""Pre-tokenized, memory-mapped data: prepare streams a corpus into a token file; training
reads blocks from it without loading it whole; GPT trains on files and mixtures too."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from data_pipelines.prepare import PreparedBlocks, prepare
from tests.conftest import REPO


def _corpus(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(3):
        (src / f"part{i}.jsonl").write_text("\n".join(json.dumps({"text": f"document {i}-{j}: for x in range({j}): "
                                                                            f"print(x) " * 20}) for j in range(40)))
    (src / "notes.txt").write_bytes(b"latin-1 \xe9 bytes in a text file " * 50)
    (src / "blank.jsonl").write_text(json.dumps({"text": ""}))
    return src


def test_prepare_streams_every_token_into_a_memory_map(tmp_path, run_zoo):
    src = _corpus(tmp_path)
    first = run_zoo("debug=fast", "data=files", f"data.path={src}", "trainer.max_steps=2", "trainer.sample_tokens=0")
    tok = first.run_dir / "tokenizer"
    meta = prepare("files", str(src), str(tok), tmp_path / "prepared", batch_docs=7)
    assert meta["skipped"] == {"invalid_utf8_replaced": 1, "empty_skipped": 1} and meta["documents"] == 121
    tokens = np.concatenate([np.memmap(tmp_path / "prepared" / s["file"], dtype=meta["dtype"], mode="r")
                             for s in meta["shards"]])
    assert len(tokens) == meta["tokens"] and int((tokens == meta["eos_id"]).sum()) == 121
    blocks = PreparedBlocks(tmp_path / "prepared", block_size=63, eval_fraction=0.1)
    assert isinstance(blocks.train.rows.tokens.maps[0], np.memmap)  # rows are read on indexing only
    n = len(blocks.train) + len(blocks.eval)
    assert n == len(tokens) // 64 and blocks.meta["tail_tokens_dropped"] == len(tokens) - n * 64
    assert np.array_equal(blocks.train[np.array([0])][0], np.asarray(tokens[:64]))


def test_training_on_prepared_data_and_on_a_mixture(tmp_path, run_zoo):
    src = _corpus(tmp_path)
    first = run_zoo("debug=fast", "data=files", f"data.path={src}", "trainer.max_steps=2", "trainer.sample_tokens=0")
    assert first.summary["data"]["invalid_utf8_replaced"] == 1
    proc = subprocess.run([sys.executable, "-m", "data_pipelines.prepare", "--name", "files", "--path", str(src),
                           "--tokenizer", str(first.run_dir / "tokenizer"), "--out", str(tmp_path / "prep")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    final = proc.stderr.strip().splitlines()[-1]  # the progress, its last line at the end (#33 item 10)
    assert final.startswith("prepare: 121 documents, ") and " MB of text in " in final and " tokens/s)" in final
    run = run_zoo("debug=fast", "data=prepared", f"data.path={tmp_path / 'prep'}", "trainer.max_steps=3",
                  "model.block_size=64")
    assert run.summary["steps"] == 3 and np.isfinite(run.summary["eval_loss"])
    # data.eval_path: another prepared file, the same tokenizer; all of data.path is trained on
    from data_pipelines.prepare import prepare

    held = prepare("files", str(src), str(first.run_dir / "tokenizer"), tmp_path / "held")
    own = run_zoo("debug=fast", "data=prepared", f"data.path={tmp_path / 'prep'}", "trainer.max_steps=2",
                  "model.block_size=64", f"data.eval_path={tmp_path / 'held'}", "trainer.sample_tokens=0")
    blocks = own.summary["data"]
    assert blocks["eval_blocks"] == held["tokens"] // 65 and blocks["train_blocks"] == blocks["tokens"] // 65
    mixed = run_zoo("debug=fast", "trainer.max_steps=2", "trainer.sample_tokens=0",
                    f"data.mix=[{{name: files, path: '{src}', weight: 1}}, {{name: pydoc, weight: 2}}]")
    assert mixed.summary["data"]["documents"] > 79
    # A prepared directory in a mixture, by tokens: pydoc is tokenized with its tokenizer, three times its share.
    both = run_zoo("debug=fast", "trainer.max_steps=2", "trainer.sample_tokens=0", "model.block_size=64",
                   f"data.mix=[{{name: prepared, path: '{tmp_path / 'prep'}', weight: 1}}, {{name: pydoc, weight: 3}}]")
    shares = [s["share_of_tokens"] for s in both.summary["data"]["mix"]]
    assert abs(shares[0] - 0.25) < 0.01 and abs(shares[1] - 0.75) < 0.01, both.summary["data"]["mix"]
    assert (both.run_dir / "tokenizer" / "tokenizer.json").read_bytes() == \
        (tmp_path / "prep" / "tokenizer" / "tokenizer.json").read_bytes()

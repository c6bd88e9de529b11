"""python -m data_pipelines.prepare in shards (#38 item 1): the same bytes for any number of
workers; a preparation stopped part-way continues from its intact shards (a half-written or
changed shard is written again); --out holding another preparation, --workers 0 and a shard
changed after preparation are one line each; training reads the shards as one sequence."""
from __future__ import annotations

import filecmp
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from data_pipelines.prepare import PreparedBlocks, TokenShards, check_shards, prepare
from tests.conftest import REPO
from zoo.run.errors import DataError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A few hundred jsonl documents (one empty) and a byte-level BPE tokenizer trained on them."""
    from data_pipelines.tokenizer import train_gpt_tokenizer

    root = tmp_path_factory.mktemp("corpus")
    src = root / "src"
    src.mkdir()
    texts = []
    for i in range(3):
        rows = [f"document {i}-{j}: for x in range({j}): print(x * {i}) " * (5 + j % 7) for j in range(150)]
        texts += rows
        (src / f"part{i}.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in [*rows, ""]))
    tok = train_gpt_tokenizer(texts, 512, source_key="test-prepare-shards", cache_dir=str(root / "cache"))
    return src, str(tok)


def _files(d):
    return sorted(str(f.relative_to(d)) for f in d.rglob("*") if f.is_file())


def _same(a, b) -> bool:
    return _files(a) == _files(b) and all(filecmp.cmp(a / f, b / f, shallow=False) for f in _files(a))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    src, tok = corpus
    out = tmp_path_factory.mktemp("ref") / "prep"
    meta = prepare("files", str(src), tok, out, workers=1, batch_docs=20, shard_tokens=6000)
    return out, meta


def test_any_number_of_workers_writes_the_same_bytes(corpus, reference, tmp_path):
    src, tok = corpus
    ref, meta = reference
    assert len(meta["shards"]) >= 4 and meta["documents"] == 450 and meta["skipped"] == {"empty_skipped": 3}
    for workers in (2, 3):
        out = tmp_path / f"w{workers}"
        prepare("files", str(src), tok, out, workers=workers, batch_docs=20, shard_tokens=6000)
        assert _same(ref, out), workers


def test_the_shards_read_as_one_sequence_of_blocks(corpus, reference):
    from transformers import AutoTokenizer

    src, tok = corpus
    ref, meta = reference
    shards = TokenShards(ref)
    whole = np.concatenate([np.fromfile(ref / s["file"], dtype=meta["dtype"]) for s in meta["shards"]])
    assert len(shards) == meta["tokens"] == len(whole) and int((whole == meta["eos_id"]).sum()) == 450
    texts = [json.loads(line)["text"] for f in sorted(src.glob("*.jsonl")) for line in f.read_text().splitlines()]
    ids = AutoTokenizer.from_pretrained(tok)([t for t in texts if t], add_special_tokens=False)["input_ids"]
    assert np.array_equal(whole, [t for d in ids for t in (*d, meta["eos_id"])])  # transformers' own tokens
    width = 64
    boundary = meta["shards"][0]["tokens"] // width  # a block across the first shard's end
    assert np.array_equal(shards.block(boundary, width), whole[boundary * width:(boundary + 1) * width])
    blocks = PreparedBlocks(ref, block_size=width - 1, eval_fraction=0.1)
    n = len(blocks.train) + len(blocks.eval)
    assert n == len(whole) // width and blocks.meta["shards"] == len(meta["shards"])
    assert isinstance(blocks.train.rows.tokens.maps[0], np.memmap)  # read on indexing only
    i = int(blocks.train.index[3])
    assert np.array_equal(blocks.train[3], whole[i * width:(i + 1) * width])
    assert blocks.train[np.array([3, 4])].shape == (2, width)


def test_a_stopped_preparation_continues_from_its_intact_shards(corpus, reference, tmp_path):
    src, tok = corpus
    ref, meta = reference
    out = tmp_path / "prep"
    prepare("files", str(src), tok, out, workers=2, batch_docs=20, shard_tokens=6000)
    # As a stop leaves it: no meta.json, the last shards unfinished, one of them half-written.
    (out / "meta.json").unlink()
    (out / "unigram_counts.npy").unlink()
    n = len(meta["shards"])
    for i in (n - 2, n - 1):
        (out / f"tokens-{i:05d}.done").unlink()
    half = out / f"tokens-{n - 2:05d}.bin"
    half.write_bytes(half.read_bytes()[:100])
    kept = {i: (out / f"tokens-{i:05d}.bin").stat().st_mtime_ns for i in range(n - 2)}
    time.sleep(0.01)
    prepare("files", str(src), tok, out, workers=1, batch_docs=20, shard_tokens=6000)
    assert _same(ref, out)
    assert {i: (out / f"tokens-{i:05d}.bin").stat().st_mtime_ns for i in range(n - 2)} == kept  # not written again
    # A finished shard whose bytes changed is written again, and every one after it.
    bad = out / "tokens-00001.bin"
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF
    bad.write_bytes(bytes(data))
    prepare("files", str(src), tok, out, workers=1, batch_docs=20, shard_tokens=6000)
    assert _same(ref, out)


def test_a_killed_preparation_resumes_to_the_same_bytes(corpus, reference, tmp_path):
    src, tok = corpus
    ref, _ = reference
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "data_pipelines.prepare", "--path", str(src), "--tokenizer", tok, "--out", str(out),
           "--batch-docs", "20", "--shard-tokens", "6000", "--workers", "2"]
    env = {**os.environ, "ZOO_TEST_PREPARE_BATCH_DELAY_S": "0.2"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "tokens-00001.done").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "meta.json").exists()
    done = subprocess.run(cmd[:-2] + ["--workers", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _same(ref, out)


def test_bad_input_is_one_line(corpus, reference, tmp_path):
    src, tok = corpus
    ref, meta = reference
    run = subprocess.run([sys.executable, "-m", "data_pipelines.prepare", "--path", str(src), "--tokenizer", tok,
                          "--out", str(tmp_path / "x"), "--workers", "0"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.strip() == ("data_pipelines.prepare: error: --workers 0 must be at "
                                                          "least 1 (omit it for one process per core)"), run.stderr
    with pytest.raises(DataError, match=r"holds a preparation made otherwise \(shard_tokens 6000 -> 9000\)"):
        prepare("files", str(src), tok, ref, workers=1, batch_docs=20, shard_tokens=9000)
    changed = tmp_path / "changed"
    prepare("files", str(src), tok, changed, workers=1, batch_docs=20, shard_tokens=6000)
    check_shards(changed, tmp_path / "verified")  # intact: passes, and remembers each file's digest
    shard = changed / meta["shards"][2]["file"]
    data = bytearray(shard.read_bytes())
    data[0] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"tokens-00002.bin fails its checksum .* rebuild it: remove .*tokens-00002.bin "
                                        r"and its .done marker, and run python -m data_pipelines.prepare again"):
        check_shards(changed, tmp_path / "verified")
    shard.write_bytes(bytes(data[:50]))
    with pytest.raises(DataError, match=r"tokens-00002.bin holds 50 bytes, meta.json says [\d,]+: it is cut short"):
        check_shards(changed, tmp_path / "verified")


def test_a_directory_of_the_first_format_still_reads(tmp_path):
    """Prepared before shards (format zoo-tokens-1): one tokens.bin, read as before."""
    tokens = np.arange(1000, dtype=np.uint16) % 97
    tokens.tofile(tmp_path / "tokens.bin")
    np.save(tmp_path / "unigram_counts.npy", np.bincount(tokens, minlength=97))
    (tmp_path / "meta.json").write_text(json.dumps({"format": "zoo-tokens-1", "dtype": "uint16", "tokens": 1000,
                                                    "documents": 3, "eos_id": 0, "vocab": 97, "skipped": {}}))
    check_shards(tmp_path, tmp_path / "verified")
    blocks = PreparedBlocks(tmp_path, block_size=9, eval_fraction=0.1)
    assert len(blocks.train) + len(blocks.eval) == 100 and blocks.meta["tail_tokens_dropped"] == 0
    i = int(blocks.eval.index[0])
    assert np.array_equal(blocks.eval[0], tokens[i * 10:(i + 1) * 10])


def test_training_refuses_a_changed_shard_before_any_rank_starts(corpus, tmp_path, monkeypatch):
    from tests.unit.config.test_config import composed
    from zoo.config.paths import check_paths
    from zoo.families.registry import family
    from zoo.run.errors import ConfigError

    src, tok = corpus
    out = tmp_path / "prep"
    meta = prepare("files", str(src), tok, out, workers=1, batch_docs=20, shard_tokens=6000)
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    cfg = composed("data=prepared", f"data.path={out}")
    check_paths(cfg, family("gpt"))
    shard = out / meta["shards"][-1]["file"]
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ConfigError, match=r"^data.path=.*prep: .*tokens-\d{5}.bin holds [\d,]+ bytes, meta.json says "
                                          r"[\d,]+: it is cut short or was changed; rebuild it"):
        check_paths(cfg, family("gpt"))


def test_parts_prepared_apart_and_merged_equal_one_preparation(corpus, reference, tmp_path):
    """#38 item 2: --part I/N of the files each, then --merge: the same tokens, counts and
    documents as one preparation, the parts' shards indexed where they are (no copy)."""
    src, tok = corpus
    ref, meta = reference
    parts = []
    for i in range(3):
        parts.append(tmp_path / f"part{i}")
        prepare("files", str(src), tok, parts[-1], workers=1, batch_docs=20, shard_tokens=6000, part=(i, 3))
    out = tmp_path / "merged"
    cmd = [sys.executable, "-m", "data_pipelines.prepare", "--merge", *map(str, reversed(parts)), "--out", str(out)]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("merged 450 documents"), run.stderr
    merged = json.loads((out / "meta.json").read_text())
    assert (merged["tokens"], merged["documents"], merged["skipped"]) == (meta["tokens"], 450, meta["skipped"])
    assert all(s["file"].startswith("../part") for s in merged["shards"]) and not list(out.glob("*.bin"))
    one, both = TokenShards(ref), TokenShards(out)
    assert np.array_equal(one.read(0, len(one)), both.read(0, len(both)))
    assert np.array_equal(np.load(ref / "unigram_counts.npy"), np.load(out / "unigram_counts.npy"))
    check_shards(out, tmp_path / "verified")
    # What merge and --part refuse, in one line each.
    bad = subprocess.run([*cmd[:4], str(parts[0]), str(parts[2]), "--out", str(tmp_path / "m2")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == ("data_pipelines.prepare: error: --merge: parts [0, 2] of 3 "
                                                          "given; part(s) [1] missing"), bad.stderr
    wrong = subprocess.run([sys.executable, "-m", "data_pipelines.prepare", "--path", str(src), "--tokenizer", tok,
                            "--out", str(tmp_path / "p"), "--part", "3/2"], cwd=REPO, capture_output=True, text=True)
    assert wrong.returncode == 2 and wrong.stderr.strip() == (
        "data_pipelines.prepare: error: --part 3/2: part 3 of 2 does not exist: I runs from 0 to 1 (a Slurm array's "
        "--part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"), wrong.stderr


def test_an_index_that_does_not_parse_is_one_line(tmp_path):
    (tmp_path / "meta.json").write_text("")
    with pytest.raises(DataError, match=r"meta.json does not parse \(.*\): it is written last by python -m "
                                        r"data_pipelines.prepare"):
        check_shards(tmp_path, tmp_path / "verified")
    (tmp_path / "meta.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"meta.json is not a prepared directory's index \(no list of shards\)"):
        check_shards(tmp_path, tmp_path / "verified")


def test_workers_started_fresh_write_the_same_bytes(corpus, reference, tmp_path, monkeypatch):
    """In a process that runs a process group (a training rank) the workers are spawned, not
    forked (a forked worker hung there on a lock another thread held): the same bytes."""
    from data_pipelines import prepare as module

    assert module.pool_start_method() == "fork"  # no process group here
    monkeypatch.setattr(module, "pool_start_method", lambda: "spawn")
    src, tok = corpus
    prepare("files", str(src), tok, tmp_path / "spawned", workers=2, batch_docs=20, shard_tokens=6000)
    assert _same(reference[0], tmp_path / "spawned")

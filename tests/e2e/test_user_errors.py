"""Every user-facing error (a `ZooError`) found on the ranks, under one or two local ranks,
ends the run with one `zoo: error:` line, exit 2 and no traceback."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.max_steps=1", "logger=none"]


def _empty_jsonl(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return ["data=files", f"data.path={tmp_path / 'empty.jsonl'}"]


def _no_text_column(tmp_path):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": f"document {i} " * 50}) + "\n" for i in range(20)))
    return ["data=files", f"data.path={tmp_path / 'docs.jsonl'}"]


def _missing_resume(tmp_path):
    return [f"resume={tmp_path / 'no-such-checkpoint'}"]


def _init_from_without_safetensors(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64,
                                               "n_positions": 64, "vocab_size": 4096}))
    (d / "pytorch_model.bin").write_bytes(b"not read")
    return [f"model.init_from={d}"]


def _bert_with_a_gpt_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), eos_token="<|endoftext|>")
    tok.add_tokens([f"t{i}" for i in range(50)])
    tok.save_pretrained(str(tmp_path / "tok"))
    return ["model=bert", f"data.tokenizer={tmp_path / 'tok'}"]


def _tiny_bert_corpus(tmp_path):
    """Three documents of three sentences (#33 item 6: a traceback naming BucketedBatchSampler)."""
    (tmp_path / "docs.jsonl").write_text("".join(
        json.dumps({"text": f"Sentence one of note {i}. Another sentence here. And a third one."}) + "\n"
        for i in range(3)))
    return ["model=bert", "data=files", f"data.path={tmp_path / 'docs.jsonl'}", "trainer.global_batch_size=32",
            "trainer.micro_batch_size=8"]


CASES = {
    "empty data file": (_empty_jsonl, "data.path"),
    "no text column": (_no_text_column, "text"),
    "missing resume path": (_missing_resume, "resume="),
    "init_from without safetensors": (_init_from_without_safetensors, "safetensors"),
    "bert tokenizer without special tokens": (_bert_with_a_gpt_tokenizer, "mask_token"),
    "bert corpus under one global batch": (_tiny_bert_corpus, "training samples of up to 128 tokens, fewer than one "
                                                              "global batch (trainer.global_batch_size=32)"),
}


# Every case on one rank; one data and one checkpoint case on two (where only rank 0 reports).
@pytest.mark.parametrize("case, ranks", [*((c, 1) for c in CASES), ("empty data file", 2), ("missing resume path", 2)])
def test_one_line_exit_2_no_traceback(run_zoo, tmp_path, case, ranks):
    make, needle = CASES[case]
    run = run_zoo(*FAST, *make(tmp_path), *(["parallel=zero1"] if ranks == 2 else []), check=False)
    errors = [line for line in run.stderr.splitlines() if line.startswith("zoo: error:")]
    assert run.returncode == 2, run.stderr[-3000:]
    assert len(errors) == 1 and needle in errors[0], run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout
    assert not run.run_dir.exists(), sorted(p.name for p in run.run_dir.iterdir())  # nothing left behind


def test_a_refused_start_leaves_a_directory_as_it_found_it(run_zoo, tmp_path):
    """The ranks refuse (after writing config.yaml, topology.txt, tokenizer/): what was there
    stays byte for byte, what the start wrote is gone."""
    run_dir = tmp_path / "kept"
    (run_dir / "notes").mkdir(parents=True)
    (run_dir / "notes" / "plan.txt").write_text("mine")
    (run_dir / "config.yaml").write_text("an older config")
    for ranks in ([], ["parallel=zero1"]):
        run = run_zoo(*FAST, *_empty_jsonl(tmp_path), *ranks, run_dir=run_dir, check=False)
        assert run.returncode == 2 and "holds no text" in run.stderr, run.stderr[-3000:]
        assert sorted(p.name for p in run_dir.rglob("*")) == ["config.yaml", "notes", "plan.txt"]
        assert (run_dir / "config.yaml").read_text() == "an older config"

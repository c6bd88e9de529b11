"""BERT on the user's own text (data=files, data=hub, data.mix): one run over a mix of a
local jsonl and a `save_to_disk` dataset trains masked-LM from both, beats the majority
baseline, and counts what it read; a file it cannot parse is refused in one line."""
from __future__ import annotations

import json


def _sources(tmp_path):
    import datasets

    from data_pipelines.corpus import pydoc_documents

    docs = pydoc_documents()[:60]
    with open(tmp_path / "docs.jsonl", "w") as f:
        for d in docs[:30]:
            f.write(json.dumps({"text": d}) + "\n")
    datasets.Dataset.from_dict({"body": docs[30:]}).save_to_disk(str(tmp_path / "hub"))
    return tmp_path / "docs.jsonl", tmp_path / "hub"


def test_bert_trains_on_a_mix_of_a_jsonl_file_and_a_saved_dataset(run_zoo, tmp_path):
    jsonl, hub = _sources(tmp_path)
    mix = (f"data.mix=[{{name:files,path:'{jsonl}'}},{{name:hub,path:'{hub}',text_column:body}}]")
    run = run_zoo("model=bert", mix, "trainer.max_steps=30", "trainer.global_batch_size=16", "optim.lr=2e-3",
                  "optim.warmup_steps=3", "logger=none", "trainer.eval_batches=7")
    s = run.summary
    assert s["eval_accuracy"] > s["baseline_accuracy"] > 0, s
    assert s["data"]["documents"] >= 60 and s["data"]["samples"] > 100, s["data"]  # the mix weighs by tokens
    assert 0.9 < s["padding_efficiency"] <= 1.0  # length-bucketed batches of the user's text too


def test_a_file_bert_cannot_parse_is_refused_naming_the_row(run_zoo, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "one. two."}) + "\n{broken\n")
    run = run_zoo("model=bert", "data=files", f"data.path={tmp_path / 'bad.jsonl'}", "debug=fast", "logger=none",
                  check=False)
    lines = [line for line in run.stderr.splitlines() if line.strip() and not line.startswith("zoo: warning:")]
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert "cannot read" in lines[0] and "JSON parse error" in lines[0] and "in row 1" in lines[0], lines[0]
    assert "Traceback" not in run.stderr and not run.run_dir.exists()

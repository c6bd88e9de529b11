"""Periodic evaluation (trainer.eval_every), early stopping and the best checkpoint, end to
end. Across layouts the evaluations are compared where the layout runs already are
(tests/e2e/test_families.py: BERT tp/pp and the CNN pp; parallel/test_tp_runs.py: GPT tp);
here: evaluation leaves the training alone (dropout on), early stopping stops after exactly
`patience` evaluations, the best checkpoint holds the best step and resumes with its state."""
from __future__ import annotations

import json

import pytest

FAST = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.max_steps=8", "trainer.log_every=2",
        "optim.warmup_steps=1", "model.dropout=0.1", "trainer.eval_batches=2"]


def test_evaluating_every_n_steps_changes_no_training_loss(run_zoo):
    """With dropout on: evaluation restores the RNG, the loader waits, nothing else moves."""
    plain = run_zoo(*FAST)
    evaluated = run_zoo(*FAST, "trainer.eval_every=3")
    assert evaluated.losses() == plain.losses() and len(plain.losses()) == 4
    evals = evaluated.evals()
    assert list(evals) == [3, 6, 8]  # the last step's evaluation is a record too: the final one
    eval_only = [m for m in evaluated.metrics if "loss" not in m]
    assert [m["step"] for m in eval_only] == [3]  # steps 6 and 8 are logging steps: one record holds both
    assert all(m["eval_perplexity"] == pytest.approx(2.718281828 ** m["eval_loss"]) for m in evaluated.metrics
               if "eval_loss" in m)
    s = evaluated.summary
    assert s["eval_loss"] == evals[8] and s["eval_samples"] == 16  # trainer.eval_batches=2 of 8 samples
    assert s["best_eval_loss"] == min(evals.values()) and s["best_eval_step"] == min(evals, key=evals.get)
    assert "step      3 | eval loss " in evaluated.stdout
    assert ("zoo: best eval loss" in evaluated.stdout) == (s["best_eval_step"] != 8)


def test_early_stop_after_patience_evaluations_and_the_best_checkpoint(run_zoo):
    """A learning rate of zero cannot improve: the first evaluation is the best, the next
    two do not beat it, and the run stops at the third (step 3), exit 0."""
    run = run_zoo(*FAST, "optim.lr=1e-12", "optim.min_lr=0", "trainer.max_steps=20", "trainer.eval_every=1",
                  "trainer.early_stop.patience=2", "trainer.early_stop.min_delta=0.01", "checkpoint.best=true")
    s = run.summary
    assert s["stopped_early_at_step"] == 3 and s["steps"] == 3 and s["best_eval_step"] == 1
    assert list(run.evals()) == [1, 2, 3]
    assert "zoo: early stop at step 3: 2 evaluations without an eval loss below the best" in run.stdout
    assert "zoo: stopped early at step 3 (trainer.early_stop)" in run.stdout
    best = json.loads((run.run_dir / "checkpoints" / "best" / "state.json").read_text())
    assert best["step"] == 1 and best["eval"] == {"best": s["best_eval_loss"], "best_step": 1, "bad_evals": 0,
                                                    "metric": "eval_loss"}
    assert not (run.run_dir / "checkpoints" / "latest").exists()  # best is not a resume point


def test_a_resumed_run_keeps_the_best_loss_and_the_patience_count(run_zoo, tmp_path):
    """Stopped at step 3 (evaluations at 1, the best, then 2 and 3, no better), resumed from
    its last checkpoint: the next evaluation without improvement ends it at step 4 (with the
    count lost it would be 6)."""
    common = [*FAST, "optim.lr=1e-12", "optim.min_lr=0", "optim.decay_steps=20", "trainer.eval_every=1",
              "trainer.early_stop.patience=3", "trainer.early_stop.min_delta=0.01", "checkpoint.every=2"]
    first = run_zoo(*common, "trainer.max_steps=3", run_dir=tmp_path / "run")
    assert "stopped_early_at_step" not in first.summary
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_0000003" / "state.json").read_text())
    assert state["eval"]["best_step"] == 1 and state["eval"]["bad_evals"] == 2
    resumed = run_zoo(*common, "trainer.max_steps=20", "resume=auto", run_dir=tmp_path / "run")
    assert resumed.summary["stopped_early_at_step"] == 4 and resumed.summary["best_eval_step"] == 1


def test_a_wsd_schedule_resumed_on_another_layout_continues_exactly(run_zoo, tmp_path):
    """optim.schedule=wsd over 8 steps (warmup 2, decay over the last half): 4 steps on one
    process, then resumed under ZeRO-1 at dp 2: every logged lr is the closed-form curve."""
    from zoo.engine.schedules import lr_ratio

    common = ["debug=fast", "logger=none", "trainer.sample_tokens=0", "trainer.log_every=1", "optim.schedule=wsd",
              "optim.decay_fraction=0.5", "optim.warmup_steps=2", "optim.decay_steps=8", "optim.lr=1e-3",
              "optim.min_lr=1e-5", "checkpoint.every=4"]
    first = run_zoo(*common, "parallel=ddp", "trainer.max_steps=4", run_dir=tmp_path / "run")
    resumed = run_zoo(*common, "parallel=zero1", "trainer.max_steps=8", "resume=auto", run_dir=tmp_path / "run")
    assert "at step 4" in resumed.stdout
    logged = {m["step"]: m["lr"] for m in first.metrics + resumed.metrics if "lr" in m}
    assert sorted(logged) == list(range(1, 9))
    for step, lr in logged.items():  # the lr after step N: scheduler iteration N - 1
        want = 1e-3 * lr_ratio(step - 1, schedule="wsd", warmup=2, total=8, min_ratio=1e-2, decay_fraction=0.5)
        assert lr == pytest.approx(want, rel=1e-9, abs=1e-15), (step, lr, want)
    assert logged[4] == pytest.approx(1e-3) and logged[8] == pytest.approx(1e-5)


def test_a_small_corpus_evaluates_what_it_holds_out(run_zoo, tmp_path):
    """58 short documents (the new user's corpus of #22; #33 item 7): 1% held out is under one
    micro-batch of 8 on each of 2 data-parallel ranks, and was refused; now the held-out blocks
    (at least one) are evaluated, the rounds padded."""
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"note {i}: " + "some words here " * 40}) + "\n"
                                                 for i in range(58)))
    run = run_zoo("debug=fast", "logger=none", "trainer.sample_tokens=0", "data=files", "parallel=zero1",
                  f"data.path={tmp_path / 'docs.jsonl'}", "data.eval_fraction=0.01", "trainer.micro_batch_size=8",
                  "trainer.global_batch_size=16", "trainer.max_steps=2")
    s = run.summary
    assert 1 <= s["eval_samples"] < 8 and s["eval_loss"] == run.evals()[2] and s["eval_loss"] < 20
    assert "zoo: data: data=files data.path=" in run.stdout and f"{s['eval_samples']} held out" in run.stdout


def test_a_held_out_source_of_its_own_is_what_evaluation_reads(run_zoo, tmp_path):
    """data.eval_path: training reads all of data.path (no split), evaluation every block of
    the held-out file; the periodic and the final evaluation are over the same blocks."""
    from data_pipelines.corpus import pydoc_documents

    docs = pydoc_documents()
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:60]))
    (tmp_path / "held.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[60:]))
    run = run_zoo("debug=fast", "logger=none", "trainer.sample_tokens=0", "data=files",
                  f"data.path={tmp_path / 'train.jsonl'}", f"data.eval_path={tmp_path / 'held.jsonl'}",
                  "trainer.max_steps=4", "trainer.eval_every=2", "trainer.eval_batches=null")
    s = run.summary
    assert s["data"]["documents"] == 60 and list(run.evals()) == [2, 4] and s["eval_loss"] == run.evals()[4]
    assert s["eval_loss"] < run.evals()[2] + 0.5  # the same held-out blocks, two steps later

"""`--dry-run` (#33 item 8): the run validated and planned (layout, batch, memory per device
against the device, the data and its size), and nothing started or written: no rank, no run
directory. The planner's 32-rank command for an 8B Llama is checked on this CPU in seconds."""
from __future__ import annotations


def test_a_3d_dry_run_plans_and_starts_no_rank(run_zoo, tmp_path):
    run = run_zoo("parallel=3d", "--dry-run", run_dir=tmp_path / "run")
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines[0].startswith("zoo: dry run: layout tp2-pp2-dp2_zero1: world 8 = tp 2 x pp 2 x dp 2, global batch 48 = "
                               "6 micro-batches of 4 through 2 stages x dp 2, fp32"), lines
    assert lines[1].startswith("zoo: dry run: memory: gpt-tiny, ") and " per device (params " in lines[1]
    assert lines[1].endswith(": fits")
    assert lines[2].startswith("zoo: dry run: data=pydoc: the Python documentation inside CPython, ")
    assert lines[-1].startswith("zoo: dry run: validated and planned; nothing started or written")
    assert not any(line.startswith(("zoo: layout", "zoo: start:", "step ")) for line in lines)  # no rank ran
    assert not (tmp_path / "run").exists()


def test_the_planners_8b_command_is_checked_here_without_starting_32_ranks(run_zoo, tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"text": "hello"}\n' * 10)
    run = run_zoo("model=llama", "model.size=llama3-8b", "precision=bf16", "parallel.tp=8", "parallel.pp=4",
                  "parallel.dp=1", "parallel.zero_stage=1", "trainer.global_batch_size=36", "data=files",
                  f"data.path={tmp_path / 'docs.jsonl'}", "trainer.dry_run=true", run_dir=tmp_path / "run")
    assert "zoo: warning: predicted " in run.stderr  # 8B on a 32nd of this machine's RAM
    out = run.stdout
    assert "zoo: dry run: layout tp8-pp4-dp1_zero1: world 32 = " in out and "does NOT fit" in out
    assert f"zoo: dry run: data=files: {tmp_path / 'docs.jsonl'}: 1 file(s), " in out
    assert not (tmp_path / "run").exists()


def test_a_bad_dry_run_is_refused_like_a_run(run_zoo, tmp_path):
    run = run_zoo("model.size=llama3-8b", "--dry-run", run_dir=tmp_path / "run", check=False)
    assert run.returncode == 2 and "zoo: error: model.size='llama3-8b' is a size of model.family=llama" in run.stderr
    assert "add model=llama" in run.stderr and "Traceback" not in run.stderr


def test_the_planners_command_builds_the_planned_model_and_a_dry_run_says_when_it_does_not(run_zoo, tmp_path):
    """#49 item 3: the planner's printed command carries the vocabulary it planned with, so its
    dry run builds the parameter count it planned; without it the default corpus's tokenizer
    would size the model, and the dry run says so in one line."""
    import dataclasses
    import json
    import shlex

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from tests.conftest import REPO
    from zoo.plan.__main__ import run

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        plan_cfg = OmegaConf.to_object(compose(config_name="plan", overrides=[
            "model=llama", "model.size=llama3-8b", "cluster=h200", "trainer.global_batch_size=64"]))
    planned = json.loads(run(dataclasses.replace(plan_cfg, plan=dataclasses.replace(plan_cfg.plan, format="json")))
                         )["model"]["num_params"]
    command = next(line for line in run(plan_cfg).splitlines() if line.startswith("  train with: "))
    overrides = shlex.split(command.split("python -m zoo.train ", 1)[1])
    assert "model.vocab_size=128256" in overrides  # llama3-8b's published vocabulary, padded as training pads it
    out = run_zoo(*overrides, "--dry-run", run_dir=tmp_path / "run").stdout
    assert f"{planned:,} parameters" in out and planned == 8_030_261_248, out
    assert "NOT the planned model" not in out
    without = run_zoo(*[o for o in overrides if not o.startswith("model.vocab_size=")], "--dry-run",
                      run_dir=tmp_path / "run").stdout
    line = next(line for line in without.splitlines() if "NOT the planned model" in line)
    assert "tokenizer's 4,096 tokens (data=pydoc)" in line and "llama3-8b's published 128,256" in line
    assert f"plans {planned:,} for model.size=llama3-8b" in line and "add model.vocab_size=128256" in line



def test_a_cp_dry_run_names_cp_in_the_world(run_zoo, tmp_path):
    run = run_zoo("model=llama", "parallel=cp", "parallel.pp=2", "parallel.num_microbatches=2",
                  "trainer.global_batch_size=8", "--dry-run", run_dir=tmp_path / "run")
    assert "zoo: dry run: layout tp1-cp2-pp2-dp1_zero1: world 4 = tp 1 x cp 2 x pp 2 x dp 1, " in run.stdout
    assert not (tmp_path / "run").exists()

"""The entry point as a user runs it: the main job end to end, `--cfg job`, and bad input
(one message naming the key, exit code 2, no traceback, nothing left in the run dir)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_cfg_job_prints_the_composed_config(run_zoo):
    run = run_zoo(cmd=[sys.executable, "-m", "zoo.train", "--cfg", "job", "model.size=small"])
    assert "family: gpt" in run.stdout and "size: small" in run.stdout and "zero_stage: 0" in run.stdout


BAD_INPUT = [
    (["model=nope"], "model"),
    (["trainer.max_step=5"], "trainer.max_step is not a key of the config: did you mean trainer.max_steps?"),
    (["run_dir=/tmp/x"], "run_dir is not a key of the config: did you mean hydra.run.dir?"),
    (["trainer.micro_batch_size=abc"], "micro_batch_size"),
    (["precision=fp16", "precision.loss_scale=-1"], "precision.loss_scale=-1.0 must be >= 0 (0: dynamic loss scaling)"),
    (["precision.hysteresis=3"], "precision.hysteresis=3 sets fp16's loss scaler, but precision.dtype=fp32 has none"),
    (["trainer.global_batch_size=30", "trainer.micro_batch_size=4"], "trainer.global_batch_size=30"),
    (["model.n_head=0"], "model.n_head=0 must be positive"),
    (["parallel=tp", "model.n_head=3", "model.n_embd=96"], "parallel.tp=2 does not divide model.n_head (3)"),
    # What Hydra and OmegaConf find: each one line too.
    (["+trainer.foo=1"], "trainer.foo is not a key of the config"),
    (["trainer.max_steps=${oc.env:ZOO_TEST_UNSET_VARIABLE}"], "Environment variable 'ZOO_TEST_UNSET_VARIABLE' not found"),
    (["trainer.max_steps=${trainer.nope}"], "trainer.max_steps: "),
    (["experiment=nope"], "experiment=nope is not one of conf/experiment/: choose one of ['bert_tiny_tp'"),
    (["debug=slow"], "debug=slow is not one of conf/debug/"),
    (["hydra/launcher=nope"], "Could not find 'hydra/launcher/nope'"),
    (["trainer.max_steps=[1,2"], "no viable alternative at input"),
    (["~trainer.max_steps"], "does not support deletion"),
    (["optim.betas=[1.5,0.9]"], "optim.betas=[1.5, 0.9] must be two numbers in [0, 1)"),
    (["model.dropout=1.5"], "model.dropout=1.5 must be in [0, 1)"),
    # Accepted and trained (or a traceback on the ranks) before the range and choice checks.
    (["optim.min_lr=-1e-4"], "optim.min_lr=-0.0001 must be >= 0"),
    (["optim.min_lr=0.01"], "optim.min_lr=0.01 is above optim.lr=0.001"),
    (["optim.grad_clip=-1"], "optim.grad_clip=-1.0 must be >= 0 (0 disables clipping)"),
    (["optim.eps=-1"], "optim.eps=-1.0 must be positive"),
    (["data.num_workers=-1"], "data.num_workers=-1 must be >= 0"),
    (["checkpoint.every=-5"], "checkpoint.every=-5 must be >= 0"),
    (["data.vocab_size=1"], "data.vocab_size=1 must be >= 260"),
    (["model.ffn_mult=0"], "model.ffn_mult=0 must be positive"),
    (["+deepspeed.zero_optimization.stage=7"], "deepspeed.zero_optimization.stage is set by zoo"),
    (["+deepspeed.zero_optimization.bogus=1"], "deepspeed.zero_optimization.bogus=1: DeepSpeed says"),
    (["parallel=pp", "parallel.partition_method=bogus"], "parallel.partition_method='bogus' is unknown"),
    (["parallel.backend=nccl"], "parallel.backend=nccl needs CUDA"),
    (["logger.mode=sometimes"], "logger.mode='sometimes' is unknown"),
    # Periodic evaluation and the schedules (#16).
    (["optim.schedule=exp"], "optim.schedule='exp' is unknown; choose one of ['cosine', 'linear', 'constant', 'wsd']"),
    (["optim.schedule=wsd", "optim.decay_fraction=1.5"], "optim.decay_fraction=1.5 must be in (0, 1]"),
    (["+deepspeed.scheduler.type=WarmupLR"], "deepspeed.scheduler is set by zoo from its own config: set optim.schedule"),
    (["trainer.eval_every=-1"], "trainer.eval_every=-1 must be >= 0"),
    (["optim.name=lion"], "optim.name='lion' is unknown; choose optim=adamw or optim=sgd"),
    (["optim=sgd", "optim.momentum=0"], "optim.nesterov=true needs momentum"),
    (["trainer.early_stop.patience=2"], "trainer.early_stop.patience=2 needs periodic evaluation"),
    (["checkpoint.best=true"], "checkpoint.best=true keeps the checkpoint of the best evaluation"),
    # parallel=auto's measured pick (#37 item 3).
    (["plan.measure=2"], "plan.measure=2 is read with parallel=auto (it trains with the fastest of the planner's top 2"),
    (["parallel=auto", "plan.measure_steps=1", "plan.measure=2"], "plan.measure_steps=1 must be >= 2"),
    (["parallel=auto", "parallel.world_size=2", "plan.measure=2", "optim.min_lr=0.01"],
     "optim.min_lr=0.01 is above optim.lr=0.001"),  # the rest of the config checked before any layout runs
    # A layout the planner predicts over the device (here: 1.1B under ZeRO-1 on 2 CPU ranks) (#50 item 3).
    (["model=llama", "model.size=tinyllama-1.1b", "parallel=zero1"],
     "for layout tp1-pp1-dp2_zero1 with micro-batch 8 x 2, precision=fp32, model.activation_checkpointing=False; "
     "lower the micro-batch, turn on activation checkpointing, raise parallel.zero_stage, or run `python -m zoo.plan` "
     "for a layout that fits; plan.allow_over=true starts it anyway"),
    (["plan.allow_over=maybe"], "plan.allow_over"),
]


@pytest.mark.parametrize("overrides, needle", BAD_INPUT)
def test_bad_input_is_one_message_and_exit_2(refused, overrides, needle):
    run = refused[0](overrides)
    assert run["code"] == 2, run["stderr"]
    lines = [line for line in run["stderr"].splitlines() if line.strip() and not line.startswith("zoo: warning:")]
    assert len(lines) == 1 and lines[0].startswith("zoo: error:") and needle in lines[0], run["stderr"]
    assert "Traceback" not in run["stdout"] and run["stdout"] == "", run["stdout"]  # nothing from DeepSpeed either
    assert not run["run_dir"].exists()


def test_refusals_on_the_real_command_line(run_zoo):
    """The in-process refusals above, three of them as a user types them."""
    for overrides, needle in (BAD_INPUT[1], BAD_INPUT[7], BAD_INPUT[26]):
        run = run_zoo(*overrides, check=False)
        lines = [line for line in run.stderr.splitlines() if line.strip() and not line.startswith("zoo: warning:")]
        assert run.returncode == 2 and len(lines) == 1 and needle in lines[0], run.stderr
        assert "Traceback" not in run.stdout and not run.run_dir.exists()


def test_main_job_trains_and_generates(run_zoo):
    """`python -m zoo.train` with no overrides: the tiny GPT on the embedded corpus."""
    run = run_zoo()
    s = run.summary
    assert s["eval_perplexity"] * 2 <= s["unigram_perplexity"], s
    assert "zoo: sample (prompt " in run.stdout and len(s["sample"]) > len("The for statement")
    for key in ("final_loss", "eval_loss", "tokens_per_s", "world_size", "tp", "pp", "dp", "zero_stage",
                "params", "wall_time_s"):
        assert key in s
    assert (s["world_size"], s["tp"], s["pp"], s["dp"], s["zero_stage"]) == (1, 1, 1, 1, 0)
    metrics = run.metrics
    assert [m["step"] for m in metrics] == list(range(10, 201, 10))
    for m in metrics:
        assert {"step", "loss", "lr", "tokens_per_s", "step_time_s", "peak_mem_bytes"} <= m.keys()
        assert math.isfinite(m["loss"]) and m["tokens_per_s"] > 0
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 2
    assert "family: gpt" in (run.run_dir / "config.yaml").read_text()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(run.run_dir / "tokenizer"))
    assert tok.decode(tok("def f(x): return x")["input_ids"]) == "def f(x): return x"
    assert "TP group: [0]" in (run.run_dir / "topology.txt").read_text()


def _paths(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "tok").mkdir()
    (tmp_path / "badtok").mkdir()
    (tmp_path / "badtok" / "tokenizer.json").write_text("{not json")
    (tmp_path / "blob.dat").write_bytes(b"\x00\x01")
    return tmp_path


PATH_CASES = [
    (["data=files", "data.path={d}/nope"], "data.path={d}/nope: no such file or directory"),
    (["data=files", "data.path={d}/empty"], "data.path={d}/empty matches no file with a suffix among"),
    (["data=files", "data.path={d}/blob.dat"], "cannot read ['blob.dat']"),
    (["model=cnn", "data=files", "data.path={d}/empty"], "holds no images in class sub-directories"),
    (["data=prepared", "data.path={d}/empty"], "is not a prepared dataset (no meta.json, tokenizer)"),
    (["data.tokenizer={d}/tok"], "holds no tokenizer.json"),
    (["data.tokenizer=gpt2"], "data.tokenizer=gpt2: no such directory"),
    (["data.tokenizer={d}/badtok"], "data.tokenizer={d}/badtok: its tokenizer.json does not load"),
    (["model.init_from={d}/nope"], "model.init_from={d}/nope: no such directory"),
    (["resume={d}/nope"], "resume={d}/nope: no such checkpoint or run directory"),
    (["data.eval_path={d}/nope.jsonl"], "data.eval_path={d}/nope.jsonl: no such file or directory"),
    (["data.eval_path={d}/empty"], "data.eval_path={d}/empty matches no file with a suffix among"),
    (["model=cnn", "data.eval_path={d}/empty"], "data.eval_path: data=digits is built in and holds out"),
    (["data.eval_path="], "data.eval_path is empty: give the held-out file, directory or glob"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory, zoo_cache):
    """refused(overrides) -> {code, stdout, stderr, run_dir}: every case of BAD_INPUT and
    PATH_CASES through `zoo.train`'s main in one interpreter (tests/e2e/refusals.py), each
    with its own run directory; PATH_CASES' {d} is a directory of bad paths."""
    base = tmp_path_factory.mktemp("refused")
    d = _paths(base)
    def paths(overrides):
        return [o.replace("{d}", str(d)) for o in overrides]

    cases = [list(o) for o, _ in BAD_INPUT] + [paths(o) for o, _ in PATH_CASES]
    argvs = [[f"hydra.run.dir={base}/run{i}", "trainer.progress=false", *c] for i, c in enumerate(cases)]
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "e2e" / "refusals.py")], input=json.dumps(argvs),
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = {json.dumps(c): {**r, "run_dir": base / f"run{i}"} for i, (c, r) in enumerate(zip(cases, json.loads(
        proc.stdout)))}
    return lambda overrides: results[json.dumps(paths(overrides))], d


@pytest.mark.parametrize("overrides, needle", PATH_CASES)
def test_a_path_that_cannot_be_what_it_names_is_refused_before_launch(refused, overrides, needle):
    """Refused in the validation pass: no rank starts (no process group, no topology printed)."""
    lookup, d = refused
    run = lookup(overrides)
    lines = [line for line in run["stderr"].splitlines() if line.strip() and not line.startswith("zoo: warning:")]
    assert run["code"] == 2 and len(lines) == 1 and needle.format(d=d) in lines[0], run["stderr"]
    assert "TP group" not in run["stdout"] and not run["run_dir"].exists()

"""Shared fixtures: running the real entry point in a subprocess, with one data cache per
test session (the tokenizer is trained once) and one CPU thread per rank."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIERS = {"e2e": "e2e", "slurm": "slurm"}  # folder under tests/ -> marker

# The longest real runs (a minute or more each on 2 cores), marked `slow`: the README's test
# command (and CI) leaves them out, `python -m pytest -q -m slow` runs them. Each has a
# faster sibling in the default set that covers the same code path.
SLOW = {
    "tests/e2e/test_real_size.py::test_the_real_size_phases_at_a_small_shape": "the benchmark's phases, small; "
    "their parts (the in-place sample, resume onto another layout, export) stay in the default tier",
    "tests/e2e/test_cli.py::test_main_job_trains_and_generates": "the 200-step default job; every family and "
    "layout trains and generates in test_families/test_experiments",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[3d]": "GPT's 3d exactness stays",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[tp2-sp]": "GPT's sp exactness stays",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[pp2]": "llama tp2 and GPT pp stay",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[bert-3d]": "bert tp and pp stay",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[bert-zero2]": "zero1 and zero3 stay",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[cnn-zero2]": "zero1 and zero3 stay",
    "tests/e2e/test_llama.py::test_import_under_3d_then_export_is_bitwise_and_transformers_agrees": "the export "
    "of a llama trained under 3d stays",
    "tests/e2e/test_experiments.py::test_experiment_runs_one_step[gpt_tiny_3d]": "GPT 3d exactness stays",
    "tests/e2e/test_failures.py::test_a_rank_that_dies_or_hangs_ends_the_whole_job[hang]": "waits out a collective "
    "timeout; the crash case stays",
    "tests/e2e/test_checkpoint_compat.py::test_a_checkpoint_of_the_old_code_resumes[bert-layout1-False]": "the gpt "
    "case stays",
    "tests/e2e/test_hf.py::test_bert_import_into_pp_then_export_again": "BERT export and 3d import stay",
    "tests/e2e/test_rundir_lock.py::test_a_running_directory_is_refused_and_a_killed_runs_lock_taken_over[layout1]":
    "the one-rank case stays",
    "tests/e2e/test_launchers.py::test_deepspeed_launcher[no-local-rank]": "docs/layouts.md's line stays",
    "tests/slurm/test_slurm.py::test_warned_gpt_run_checkpoints_requeues_and_matches_uninterrupted_run": "the "
    "requeue of a stand-in job and the 4-rank GPT run under srun stay",
    "tests/e2e/test_profile.py::test_a_data_parallel_runs_gradient_all_reduce_shows": "the tp run's all-reduce "
    "and the unit breakdown stay",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[zero3]": "llama zero1 and GPT's "
    "zero3 stay",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[zero2]": "llama zero1 and GPT's "
    "zero2 stay",
    "tests/e2e/test_launchers.py::test_under_torchrun_a_killed_rank_leaves_one_line_from_its_peer_and_no_traceback"
    "[stop]": "waits out a collective timeout; the kill case stays",
    "tests/slurm/test_multinode.py::test_a_warned_job_requeues_and_resumes_on_both_nodes": "the single-node "
    "requeue of a stand-in job and the two-node ddp run stay",
    "tests/slurm/test_multinode.py::test_3d_over_two_nodes_of_four_equals_one_process": "8 ranks on 2 cores; "
    "the two-node ddp run and the local 3d run stay",
    "tests/slurm/test_multinode.py::test_a_stopped_rank_on_the_second_node_ends_the_job_and_leaves_no_process":
    "waits out a collective timeout and srun's --wait; the two-node ddp run stays",
    "tests/slurm/test_multinode.py::test_a_killed_rank_restarts_the_ranks_in_the_same_job_with_run_max_restarts":
    "the local and torchrun restart tests stay",
    "tests/slurm/test_multinode.py::test_a_lost_node_restarts_the_job_on_the_node_left_in_the_same_allocation":
    "the torchrun lost-node test stays",
    "tests/slurm/test_multinode.py::test_a_killed_rank_on_the_second_node_ends_the_job": "the local and torchrun "
    "kill tests and the two-node ddp run stay",
    # CI time (the default tier took 27 min of pytest on 2026-12-02): each below has a sibling that stays.
    "tests/e2e/test_checkpoint.py::test_a_pickle_in_one_ranks_optimizer_file_is_refused_by_that_rank": "the "
    "refusing unpickler (test_native_files_load_without_running_pickled_code) and the checksum catch "
    "(test_checkpoint_integrity) stay",
    "tests/e2e/test_sweeps.py::test_a_sweep_over_experiments_runs_each_pinned_combination": "the sweep over layouts "
    "and seeds stays",
    "tests/slurm/test_slurm.py::test_a_hydra_sweep_through_the_submitit_launcher_runs_each_layout_as_a_slurm_job":
    "the local sweep and the sbatch jobs stay",
    "tests/e2e/test_evaluation.py::test_a_resumed_run_keeps_the_best_loss_and_the_patience_count": "early stop and "
    "the best checkpoint stay; resume restores every state (test_checkpoint)",
    "tests/e2e/test_hf.py::test_a_vocabulary_tp_cannot_split_is_padded_inside_and_exported_as_it_was[gpt]": "the "
    "llama case and the unit tests of both families' padding stay",
    "tests/e2e/test_bert_data.py::test_bert_trains_on_a_mix_of_a_jsonl_file_and_a_saved_dataset": "BERT on prepared "
    "data and GPT's mixtures stay",
    "tests/e2e/test_profile.py::test_a_balanced_pipeline_is_not_named": "the unbalanced pipeline (named) and the "
    "unit diagnosis thresholds stay",
    "tests/e2e/test_launchers.py::test_deepspeed_launcher[as-the-readme-prints-it]": "torchrun's tests cover an "
    "external launcher's ranks; this and [no-local-rank] run in the slow tier",
    # CI time (the default tier took 1649 s of pytest on the CI run of 2026-12-04, 951 s here the same day):
    "tests/e2e/test_fp16.py::test_a_resume_on_another_layout_continues_the_scaler": "three fp16 runs (31 s); the "
    "scaler's state in every rank's checkpoint stays (the overflow tests), and the layout-free resume of every "
    "other state (test_checkpoint)",
    "tests/e2e/test_checkpoint.py::test_an_async_save_resumes_on_another_layout_and_sigterm_waits_for_the_write":
    "an async save equal to a synchronous one (tests/unit/checkpoint/test_async_staging.py) and the full disk "
    "during an async write stay",
    "tests/e2e/test_checkpoint.py::test_kill_9_then_resume_matches_an_uninterrupted_run": "SIGTERM's checkpoint, "
    "the bitwise resume and the resume chain over layouts stay",
    "tests/e2e/test_launchers.py::test_under_torchrun_a_killed_rank_leaves_one_line_from_its_peer_and_no_traceback"
    "[kill]": "a crashed rank under zoo's launcher (test_failures) and torchrun's run and config error stay",
    "tests/e2e/test_llama.py::test_trained_under_3d_and_exported_transformers_gives_zoos_logits": "the tied "
    "multi-query Llama trained under tp x pp and exported, and GPT's export from 3d, stay",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[bert-zero3]": "BERT under ddp, tp "
    "and pp, and ZeRO-3 exact for GPT (test_zero), stay",
    **{f"tests/e2e/test_precision.py::test_bf16_follows_fp32[{case}]": "bf16 matmuls are emulated on this CPU "
       "(gpt-ddp took 106 s of the default tier); bf16's configuration and memory are unit-tested (test_config, "
       "plan tests)" for case in ["gpt-ddp", "gpt-tp", "gpt-pp", "gpt-3d", "llama-ddp", "llama-tp", "llama-pp",
                                  "llama-3d", "bert-ddp", "bert-tp", "bert-pp", "bert-3d", "cnn-ddp", "cnn-pp"]},
    **{f"tests/e2e/test_fp16.py::test_fp16_follows_fp32[{family}-{layout}]": "fp16 matmuls are emulated on this CPU "
       "(gpt-ddp's fp16 run took 150 s, fp32's 16 s); the overflow tests under ddp and zero1 and the resume test "
       "stay" for family, layouts in (("gpt", ("ddp", "zero1", "zero2", "tp", "pp", "3d", "cp")),
                                      ("llama", ("ddp", "zero1", "zero2", "tp", "pp", "3d", "cp")),
                                      ("bert", ("ddp", "zero1", "zero2", "tp", "pp", "3d")),
                                      ("cnn", ("ddp", "zero1", "pp"))) for layout in layouts},
    **{f"tests/e2e/test_fp16.py::test_an_overflow_on_one_rank_skips_the_step_on_every_rank[{layout}]": "the overflow "
       "under ddp and zero1 stays (the same DeepSpeed scaler; tp and pp only change which rank overflows)"
       for layout in ("tp", "pp")},
    "tests/slurm/test_slurm.py::test_a_stopped_rank_ends_the_job_within_the_timeout_and_the_wait": "waits out a "
    "collective timeout and srun's --wait (90 s); the requeue tests run every job through the same srun line",
    "tests/e2e/test_families.py::test_bert_3d_matches_single_process": "BERT's tp and pp exactness and GPT's 3d stay",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[bert-zero1]": "bert zero3 stays",
    "tests/e2e/test_families.py::test_allowed_combination_trains_and_reports[cnn-zero3]": "cnn zero1 stays",
    "tests/e2e/test_experiments.py::test_experiment_runs_one_step[gpt_tiny_zero2]": "the experiment sweep "
    "(test_sweeps) runs it",
    "tests/e2e/test_experiments.py::test_experiment_runs_one_step[bert_tiny_tp]": "the experiment sweep runs it",
    "tests/e2e/test_checkpoint_integrity.py::test_resume_auto_falls_back_to_the_newest_intact_checkpoint"
    "[garbage_state]": "every damage is found in test_every_damage_is_found...; truncate and flip resume",
    "tests/e2e/test_checkpoint_integrity.py::test_resume_auto_falls_back_to_the_newest_intact_checkpoint"
    "[missing_state]": "as garbage_state",
    "tests/e2e/test_checkpoint_integrity.py::test_resume_auto_falls_back_to_the_newest_intact_checkpoint"
    "[deleted_directory]": "as garbage_state",
    "tests/e2e/test_evaluation.py::test_a_wsd_schedule_resumed_on_another_layout_continues_exactly": "every "
    "schedule's state through a resume (tests/unit/engine/test_schedules.py) and the checkpoint tests' layout chain",
    "tests/e2e/test_user_errors.py::test_one_line_exit_2_no_traceback[missing resume path-2]": "the 2-rank "
    "empty-data case stays",
    **{f"tests/e2e/test_compile.py::test_compiled_run_matches_eager[{case}]": "compiles on every rank (16-158 s "
       "each; gpt-tp, the case with TP's collectives and the vocab-parallel loss in the graph, 43 s of the default "
       "tier on 2026-12-03, joined them); the unit tests of compile (names, clock, refusals) stay"
       for case in [f"{f}-{p}" for f in ("gpt", "llama") for p in ("ddp", "zero1", "zero2", "zero3", "tp", "sp", "pp",
                                                                "3d") if (f, p) != ("gpt", "tp")]
       + ["bert-tp", "bert-pp", "cnn-ddp", "cnn-pp", "gpt-tp"]},
    # CI time again (24.8 min of pytest on 2026-12-02, machine idle):
    "tests/e2e/test_llama.py::test_a_tied_multi_query_import_trains_under_tp_x_pp_as_one_process_and_exports_tied":
    "42 s; tied and multi-query tp2 against tp1 (tests/unit/models/test_llama.py), llama tp2 over 10 steps and "
    "the llama 3d export stay",
    # CI time (27.4 min of pytest on 2026-12-03, HEAD 84269a1, the machine partly busy): each has a sibling.
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[tp2]": "GPT's tp exactness, llama's "
    "tp2 logits, loss and gradients against tp1 (tests/unit/models/test_llama.py) and the llama 3d export stay",
    "tests/e2e/test_llama.py::test_layout_matches_one_process_over_10_steps[zero1]": "GPT's ZeRO exactness and the "
    "llama 3d export stay",
    "tests/e2e/test_fp16.py::test_an_overflow_on_one_rank_skips_the_step_on_every_rank[zero1]": "the overflow under "
    "ddp stays, and the scaler's resume test runs fp16 under zero1 with an overflow",
    "tests/e2e/test_hf.py::test_a_vocabulary_tp_cannot_split_is_padded_inside_and_exported_as_it_was[llama]": "the "
    "unit tests of both families' padding (tests/unit/models/test_vocab_padding.py) stay",
    "tests/e2e/test_optimizers.py::test_sgd_with_momentum_resumes_on_another_layout_exactly": "SGD's state and "
    "its exactness against torch (tests/unit/engine/test_optimizers.py) and AdamW's layout chain stay",
}


def pytest_collection_modifyitems(items):
    """Mark each test by its tier folder, so `-m "not e2e"` and `-m slurm` select by tier too,
    and the longest runs `slow` (SLOW)."""
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, TIERS[parts[0]]))
        if item.nodeid in SLOW:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo_cache")


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.proc, self.run_dir = proc, run_dir
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list:
        return [json.loads(l) for l in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def losses(self) -> list:
        return [m["loss"] for m in self.metrics if "loss" in m]  # a record may hold only an evaluation

    def evals(self) -> dict:
        """{step: eval_loss} of the periodic evaluations (trainer.eval_every)."""
        return {m["step"]: m["eval_loss"] for m in self.metrics if "eval_loss" in m}


class RunServer:
    """tests/run_server.py: forks each plain `python -m MODULE` run from one process that has
    imported torch, DeepSpeed and zoo once (~7 s of imports a run on 2 cores)."""

    def __init__(self, env: dict):
        self.env, self.proc = env, None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "run_server.py")], cwd=REPO, env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(self.proc.stdout.readline()).get("ready"), "the run server did not start"

    def run(self, module: str, argv: list, env: dict, cwd: Path, timeout: int, tmp: Path) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        out, err = tmp / "stdout.txt", tmp / "stderr.txt"
        self.proc.stdin.write(json.dumps({"module": module, "argv": argv, "env": env, "cwd": str(cwd),
                                          "stdout": str(out), "stderr": str(err), "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        code = json.loads(self.proc.stdout.readline())["returncode"]
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        if code == 124:
            raise subprocess.TimeoutExpired([module, *argv], timeout, stdout, stderr)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], code, stdout, stderr)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def run_server():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    server = RunServer(env)
    yield server
    server.close()


def _ranks(overrides) -> int:
    """The local ranks a run's overrides ask for: its parallel preset's tp x cp x pp x dp, with
    parallel.tp/cp/pp/dp/world_size overrides applied (dp unset: 1)."""
    import yaml

    preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("parallel=")), "ddp")
    path = REPO / "conf" / "parallel" / f"{preset}.yaml"
    loaded = yaml.safe_load(path.read_text()) if path.is_file() else {}
    dims = {k: (loaded or {}).get("parallel", loaded or {}).get(k) for k in ("tp", "cp", "pp", "dp", "world_size")}
    for o in overrides:
        key, _, value = o.partition("=")
        if key.startswith("parallel.") and key[9:] in dims and value.isdigit():
            dims[key[9:]] = int(value)
    if dims["world_size"]:
        return int(dims["world_size"])
    return (dims["tp"] or 1) * (dims["cp"] or 1) * (dims["pp"] or 1) * (dims["dp"] or 1)


@pytest.fixture(scope="session")
def run_zoo(tmp_path_factory, zoo_cache, run_server):
    """run_zoo(*overrides, module="zoo.train", check=True, run_dir=None, env=None) -> Run"""
    runs = tmp_path_factory.mktemp("runs")
    counter = iter(range(10**6))

    def run(*overrides: str, module: str = "zoo.train", check: bool = True, run_dir: Path | None = None,
            env: dict | None = None, timeout: int = 600, cmd: list | None = None, cwd: Path = REPO) -> Run:
        run_dir = run_dir or runs / f"run{next(counter)}"
        # wandb is the default logger; tests that are not about tracking turn it off.
        full_env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", **(env or {})}
        argv = cmd or [sys.executable, "-m", module, f"hydra.run.dir={run_dir}", "trainer.progress=false",
                       *overrides]
        # Forked from the preloaded server, and its ranks forked from the run itself, which has
        # everything imported (zoo.run.launch); not for another tree's code (cwd, PYTHONPATH): the
        # server has this checkout's zoo imported. Runs of 4 ranks or more start theirs by the
        # forkserver, as a user's do: forked from the run, one of them now and then never joined
        # the process group (in three of the last four CI runs, 4- and 8-rank runs: 300 s, then a
        # failure), forked while the elastic agent's rendezvous store thread ran. The forkserver
        # costs a run ~9 s here, so the many 2-rank runs keep the fork (no hang seen in them).
        if (cmd is None and os.environ.get("ZOO_TEST_FORK", "1") != "0" and Path(cwd) == REPO
                and "PYTHONPATH" not in (env or {})):
            if _ranks(overrides) < 4:
                full_env = {"ZOO_START_METHOD": "fork", **full_env}
            proc = run_server.run(module, argv[3:], full_env, cwd, timeout, tmp_path_factory.mktemp("out"))
        else:
            proc = subprocess.run(argv, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
        result = Run(proc, run_dir)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                                 f"\n--- stderr\n{proc.stderr[-6000:]}")
        return result

    return run

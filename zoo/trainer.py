"""The training loop of one rank: steps through the DeepSpeed engine on batches the loader
prepared in the background (`data_pipelines.loader`), the monitor's readings every log_every
steps (`zoo.monitor`), held-out evaluation, the consolidated weights and the run summary.
Everything that differs between model families is the family's (`zoo.families`).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from data_pipelines.loader import StepLoader
from data_pipelines.schedule import restore_order
from zoo import checkpoint
from zoo.checkpoint.final import write_final
from zoo.config.schema import Config
from zoo.engine import initialize_engine, micro_batching
from zoo.engine import native as native_checkpoint
from zoo.engine import state as engine_state
from zoo.evaluate.in_loop import task_scorer
from zoo.evaluate.tasks import best_fields, higher_is_better
from zoo.families.accuracy import tallied
from zoo.families.base_task import Task
from zoo.families.registry import family
from zoo.models.compile import compile_seconds, eager
from zoo.models.documents import whole_sequences
from zoo.observe.metrics import RunLog, peak_memory_bytes
from zoo.observe.monitor import Monitor
from zoo.observe.tracking import open_tracker
from zoo.parallel.context import context_rank
from zoo.parallel.token_weights import token_weights, weighted
from zoo.parallel.topology import Layout, tp_group
from zoo.run import allocator, attempts, signals
from zoo.run.checkpoint_interval import interval_policy
from zoo.run.quiet import held_stdout

DIVERGED_EXIT_CODE = 3  # the loss stayed non-finite


@dataclass
class _LoopClock:
    """What the loop accounts for across steps: its start, the training time (without
    compilation), the steps since the last log line, the last logged loss and the run of
    non-finite steps."""

    started: float
    first_step: int
    compile_start: float
    compile_seen: float = 0.0
    window_steps: int = 0
    train_time: float = 0.0
    loss: float = float("nan")
    bad_steps: int = 0
    first_bad: Optional[int] = None

    def __post_init__(self):
        self.compile_seen = self.compile_start


def _redone(run_dir: Path, step: int) -> str:
    """What a resume trains again: the steps the run had logged past the checkpoint (lost with the
    failure that stopped it), said after the resume line; "" where none."""
    last = attempts.last_logged_step(run_dir)
    return f"; steps {step + 1}-{last}, logged before it stopped, are trained again" if last > step else ""


class Trainer:
    def __init__(self, cfg: Config, layout: Layout, grid, task: Task, run_dir: Path, device: torch.device,
                 startup=None):
        self.cfg, self.layout, self.grid, self.task, self.device = cfg, layout, grid, task, device
        self.run_dir = run_dir
        self.rank = dist.get_rank()
        # zoo.observe.startup.StartupClock (the worker's): marks the model's build, a resume's
        # read, and the first step's end
        self.startup = startup
        self.on_first_step = None  # rank 0: the run's records (config.yaml, ...), written once a step went through
        torch.manual_seed(cfg.trainer.seed)
        self.ckpt_root = run_dir / "checkpoints"
        # A resume's checkpoint is found (and verified) first: the model it fills is then built
        # without the initialisation it would overwrite (on one CPU thread, 46% of a 1.1B start).
        found = self._find_checkpoint() if cfg.resume else None
        with held_stdout(cfg.verbose):  # DeepSpeed's pipeline module prints its seeds and stages
            self.engine = initialize_engine(task.build_model(grid, init=found is None), cfg, layout, grid)
        self.pipelined = layout.pp > 1
        self.micro_batch_size, self.grad_accum = micro_batching(cfg.trainer, cfg.parallel, layout)
        self.dp_rank = grid.get_data_parallel_rank()
        self.dp_group = grid.get_data_parallel_group()
        self.step = 0
        self.consumed = 0  # samples, globally: the layout-free data position
        self.meta = {"family": cfg.model.family, "shape": task.model_meta(), "optimizer": cfg.optim.name,
                     "layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "zero_stage": layout.zero_stage,
                                **({"cp": layout.cp} if layout.cp > 1 else {})},
                     "native": native_checkpoint.layout_key(layout, cfg.parallel, cfg.precision.dtype),
                     "data_order": getattr(task.stream, "order", None)}
        # Periodic evaluation: the best eval loss so far, its step, evaluations since (kept in checkpoints).
        self.eval_state = {"best": None, "best_step": None, "bad_evals": 0, "metric": cfg.trainer.eval_metric}
        self.stopped_early = None  # the step early stopping ended the run at
        self.last_eval = None  # the latest evaluation's record
        self.training_peak = 0  # this rank's peak memory when the training loop ended
        self.eval_scores: dict = {}  # the latest evaluation's tally (the task's eval_tally), summed
        self.scorer = task_scorer(cfg, task)  # trainer.eval_tasks, encoded once (zoo.evaluate.in_loop)
        if self.startup is not None and found is not None:  # the read is its own phase (a fresh start's
            self.startup.mark("model")  # "model" is marked by the worker, once this is built)
        self.resumed_interval = self.resumed_saved_at = None
        self.resumed_from = self._resume(found) if found is not None else None
        if self.startup is not None and found is not None:
            self.startup.mark("resume")
        if self.resumed_from is not None and self.step >= cfg.trainer.max_steps:  # nothing written yet
            from zoo.config.continuation import refusal_at_step
            from zoo.run.errors import ConfigError

            raise ConfigError(refusal_at_step(cfg.resume, self.resumed_from, self.step, cfg.trainer.max_steps))
        self._test_overflow()
        self.monitor = Monitor(task=task, engine=self.engine, cfg=cfg, layout=layout, device=device, rank=self.rank)
        self.profile = None
        if cfg.trainer.profile.start:
            from zoo.observe.profiler import ProfileWindow

            coords = {"tp": grid.get_slice_parallel_rank(), "pp": grid.get_pipe_parallel_rank(), "dp": self.dp_rank}
            self.profile = ProfileWindow(cfg, run_dir, rank=self.rank, coords=coords, device=device,
                                         comm=self.monitor.comm, engine=self.engine, pipelined=self.pipelined)
        self.loader = None
        # A checkpoint written in the background, the steps' stall for them (starting the saves and
        # waiting for their staging copies), and the host buffer its shard was staged in (kept:
        # the next async save copies into it, no page faults).
        self.pending, self.stall_s, self.staging = None, 0.0, None
        tracker = open_tracker(cfg, layout, run_dir, self.rank, {
            "world_size": layout.world_size, "layout": layout.name, "micro_batch_size": self.micro_batch_size,
            "grad_accum": self.grad_accum, "params": task.num_params(), "run_dir": str(run_dir)}, recorded=task.recorded_config())
        self.log = RunLog(run_dir, active=self.rank == 0, total_steps=cfg.trainer.max_steps,
                          progress=cfg.trainer.progress, start_step=self.step, tracker=tracker)
        # When periodic checkpoints are due: every N steps, or auto's interval from the failure rate
        self.ckpt_interval = interval_policy(cfg, self.step, self.resumed_interval)
        self.last_write_s = 0.0  # the last background write's seconds (auto's interval is at least that)
        if self.ckpt_interval.start_line():
            self.log.write(self.ckpt_interval.start_line())
        self.attempt = attempts.current()
        if self.rank == 0 and (self.attempt.number or self.attempt.max_restarts):  # a job that may restart
            record = attempts.begin(run_dir, self.attempt, world_size=layout.world_size, layout=layout.name,
                                    resumed_step=self.step if self.resumed_from is not None else None,
                                    saved_at=self.resumed_saved_at)
            if self.attempt.number:
                self.log.write(attempts.restart_line(record, self.attempt.launcher))
                self.log.event({"step": self.step, **{k: record[k] for k in attempts.METRICS}})

    # -- checkpoints ------------------------------------------------------------------------
    def _find_checkpoint(self) -> Optional[Path]:
        """The checkpoint resume= names, verified: every rank verifies its share of each
        candidate's files (its own shard and index, and every world-th other file), so no rank
        reads the whole checkpoint; they agree on the newest intact one (or raise the same
        error) together. None: resume=auto where there is none yet (a fresh start)."""
        from functools import partial

        from zoo.checkpoint.verify import shared_damage

        verify = partial(shared_damage, rank=self.rank, world=dist.get_world_size(), gather=dist.all_gather_object)
        path, notes = checkpoint.resolve(self.cfg.resume, self.run_dir, verify=verify)
        for line in notes if self.rank == 0 else []:
            print(f"zoo: {line}", flush=True)
        if path is None and self.rank == 0:
            print("zoo: resume=auto: no checkpoint in this run directory yet; starting fresh", flush=True)
        return path

    def _resume(self, path: Path) -> Path:
        """Load the checkpoint at `path` into the engine (its weights, optimizer, schedule, RNG
        and data position), whatever layout wrote it."""
        state = checkpoint.read_state(path)
        checkpoint.check_compatible(state, self.meta, path)
        native_key = self.meta["native"] if native_checkpoint.enabled(self.cfg.checkpoint, self.layout) else None
        t0 = time.perf_counter()
        how = checkpoint.load(self.engine, self.grid, path, state, native_key=native_key)
        took = time.perf_counter() - t0
        self.step, self.consumed = state["step"], state["consumed"]
        self.resumed_interval = state.get("checkpoint_interval")  # what checkpoint.every=auto chose
        self.resumed_saved_at = state.get("saved_at")  # wall time of the save (what a restart lost is since)
        self.task.stream = restore_order(self.task.stream, state.get("data_order"))
        self.meta["data_order"] = getattr(self.task.stream, "order", None)  # what its next checkpoint records
        saved = {"metric": "eval_loss", **(state.get("eval") or {})}  # checkpoints before eval_metric: the loss
        if saved["metric"] == self.cfg.trainer.eval_metric:
            self.eval_state.update(saved)
        elif saved.get("best") is not None and self.rank == 0:  # another metric's best is no best of this one
            print(f"zoo: the checkpoint's best evaluation was by {saved['metric']} and trainer.eval_metric="
                  f"{self.cfg.trainer.eval_metric}: the best starts afresh", flush=True)
        if self.rank == 0:
            was = state.get("layout", {})
            print(f"zoo: resumed from {path} at step {self.step} (written under {Layout(**was).name if was else '?'}; "
                  f"read from its {how} files in {took:.2f} s)" + _redone(self.run_dir, self.step),
                  flush=True)
        return path

    def save_checkpoint(self, name: str | None = None, background: bool = False) -> Path:
        """Write a checkpoint of this step (collective; `name`: checkpoints/NAME, e.g. best); a
        model that is no longer finite is never saved: the run stops as diverged instead, the
        last good checkpoint untouched. `background` (checkpoint.async_save): the shards are
        staged in host memory and written while training goes on (finish_pending completes
        it); a save waits for the one still being written."""
        if not self._parameters_finite():
            self._stop_diverged(f"the parameters are not finite at step {self.step}")
        self.finish_pending()
        saved = checkpoint.save(self.engine, self.grid, self.ckpt_root, step=self.step, consumed=self.consumed,
                                meta={**self.meta, "eval": dict(self.eval_state),
                                      "checkpoint_interval": self.ckpt_interval.record(), "saved_at": time.time()},
                                keep=self.cfg.checkpoint.keep,
                                native=native_checkpoint.enabled(self.cfg.checkpoint, self.layout), name=name,
                                background=background, staging=self.staging)
        if not background:
            return saved
        self.pending, self.stall_s, self.staging = saved, self.stall_s + saved.stall_s, saved.staging
        self.log.write(f"zoo: checkpoint {saved.final.name}: the step stalled {saved.stall_s:.2f} s to start it; "
                       f"staged and written in the background (checkpoint.async_save)")
        return saved.final

    def finish_pending(self) -> None:
        """Complete the checkpoint being written in the background, if any (collective: waits
        for every rank's write; one that failed stops the run, `latest` untouched)."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        path = checkpoint.finish(pending)
        self.stall_s += pending.waited_s
        self.last_write_s = pending.seconds
        self.log.write(f"zoo: checkpoint {path.name} written ({pending.seconds:.2f} s in the background; the next "
                       f"optimizer step waited {pending.waited_s:.2f} s for its staging copy)")

    def _test_overflow(self) -> None:
        """Tests only: with ZOO_TEST_INF_GRAD=STEP:RANK, that rank's gradient of its first
        parameter is inf in that step's backward (an fp16 overflow on one rank)."""
        import os

        spec = os.environ.get("ZOO_TEST_INF_GRAD")
        if not spec:
            return
        step, rank = (int(x) for x in spec.split(":"))
        if self.rank == rank:
            first = next(p for p in self.engine.module.parameters() if p.requires_grad)
            first.register_hook(lambda g: torch.full_like(g, float("inf")) if self.step + 1 == step else g)

    def _test_ballast(self) -> None:
        """Tests only: with ZOO_TEST_BALLAST_MB=RANK:MB, that rank touches MB more memory in this
        start's first step (its peak rises above the others', which the run must report; too
        much fails the step, as an out-of-memory first step would)."""
        import os

        spec = os.environ.get("ZOO_TEST_BALLAST_MB")
        if spec:
            rank, mb = (int(x) for x in spec.split(":"))
            if self.rank == rank:
                torch.ones(mb * 2**20 // 4, device=self.device)  # written, then freed: resident (CPU), allocated (CUDA)

    # -- steps ------------------------------------------------------------------------------
    def open_loader(self) -> StepLoader:
        """The loader from the current data position on (after a resume: the checkpoint's)."""
        t = self.cfg.trainer
        return StepLoader(self.task, self.device, start=self.consumed, end=t.max_steps * t.global_batch_size,
                          global_batch=t.global_batch_size, micro_batch=self.micro_batch_size,
                          grad_accum=self.grad_accum, dp_rank=self.dp_rank, dp_size=self.layout.dp,
                          num_workers=self.cfg.data.num_workers)

    def mark(self, kind: str):
        """A part of a step (forward, backward, optimizer, data) as a profiler range while a
        trainer.profile window is open; nothing otherwise."""
        return self.profile.mark(kind) if self.profile is not None else contextlib.nullcontext()

    def micro_batches(self):
        """This rank's micro-batches of the step at the current data position."""
        with self.monitor.waiting_for_data(), self.mark("data"):
            return self.loader.get(self.consumed)

    def _dp_mean(self, value: torch.Tensor) -> float:
        value = value.detach().float().clone()
        if self.layout.dp > 1:
            dist.all_reduce(value, group=self.dp_group)
            value /= self.layout.dp
        return value.item()

    def train_step(self) -> torch.Tensor:
        """One optimizer step over grad_accum micro-batches; returns this rank's mean loss
        (under pipeline parallelism already averaged over the data-parallel group)."""
        self.engine.train()
        batches = self.micro_batches()
        weights = (token_weights(batches, grad_accum=self.grad_accum, dp=self.layout.dp, dp_group=self.dp_group)
                   if self.task.weighs_tokens else None)  # the mean over the global batch's counted targets
        if self.pipelined:  # the pipeline engine runs its schedule over all micro-batches
            loss = self.engine.train_batch(iter(batches if weights is None else weighted(batches, weights)))
            loss = loss.detach().float()
        else:
            loss = torch.zeros((), device=self.device)
            for i, (x, y) in enumerate(batches):
                with self.mark("forward"):
                    micro_loss = self.engine(x, y)
                    if weights is not None:
                        micro_loss = micro_loss * weights[i]
                with self.mark("backward"):
                    self.engine.backward(micro_loss)
                with self.mark("optimizer"):  # at the accumulation boundary: the step (else bookkeeping)
                    self.engine.step()
                loss += micro_loss.detach().float()
            loss /= self.grad_accum
        self.consumed += self.cfg.trainer.global_batch_size
        self.step += 1
        return loss

    def _profiled_step(self) -> torch.Tensor:
        try:
            return self.train_step()
        except torch.cuda.OutOfMemoryError:
            snapshot = self.profile.dump_memory() if self.profile.open else None
            self.profile.abort()
            if snapshot is None:
                raise
            from zoo.run.errors import ZooError

            raise ZooError(f"out of memory at step {self.step + 1} inside the trainer.profile window; the "
                           f"allocator's history is in {snapshot} (open it at pytorch.org/memory_viz)") from None
        except BaseException:
            self.profile.abort()
            raise

    def _profile_window_end(self, step_s: float) -> None:
        """Counts the step against the profiler's overhead, and at the window's last step
        gathers every rank's breakdown to rank 0, which prints it and writes summary.json."""
        window = self.profile
        if not window.open and 1 < self.step < window.first:  # step 1 warms up
            window.plain_step_s.append(step_s)
        if self.step != window.last or not window.open:
            return
        with self.monitor.outside_step():  # the traces' writing is not the step's time
            self._profile_report(window)

    def _profile_report(self, window) -> None:
        from zoo.observe.profiler import gather_rows, profile_dir, summarize, table_lines

        rows = gather_rows(window.finish(self.step))
        if self.rank == 0:
            import json

            summary = summarize(rows, first=window.first, last=window.last,
                                partition_method=self.cfg.parallel.partition_method)
            out = profile_dir(self.cfg.trainer.profile, self.run_dir)
            (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            for line in table_lines(summary, where=str(out)):
                self.log.write(line)
            for line in summary["diagnoses"]:
                self.log.write(f"zoo: diagnosis: {line}")

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """The held-out loss over every target of the task's `eval_samples()` (None with
        trainer.eval_batches=0): each batch's mean loss times its targets, summed over the
        data-parallel ranks' disjoint batches, over the targets counted. The same samples and
        the same mean on every layout, whatever the micro-batch and the data-parallel degree."""
        from zoo.models.losses import IGNORE

        self.engine.eval()
        batches = self.task.eval_batches(micro_batch=self.micro_batch_size, dp_rank=self.dp_rank,
                                         dp_size=self.layout.dp)
        self.eval_scores = {}
        if not batches:
            return None
        tally = self.task.eval_tally(tp_group(self.grid))
        if tally is None:
            total = self._summed_eval_loss(batches)
        else:  # the loss function of the forward counts the predictions too, on the model in place
            total = self._tallied_forward(batches, tally)
            self.eval_scores = tally.totals(self.layout.tp, self.device)
        counted = sum((y != IGNORE).sum() for _, y in batches).float()
        if self.layout.dp > 1:
            dist.all_reduce(counted, group=self.dp_group)
        return (total / counted).item()

    def _tallied_forward(self, batches, tally) -> torch.Tensor:
        """`_summed_eval_loss` with `tally` observing the loss function's (logits, targets)."""
        owner = (self.engine.module.loss_fn, "loss") if self.pipelined else (self.engine.module, "loss_fn")
        with tallied(*owner, tally), eager(self.engine.module):
            return self._summed_eval_loss(batches)

    @torch.no_grad()
    def score_tasks(self) -> dict:
        """trainer.eval_tasks' metrics on the model in place (collective; zoo.evaluate.in_loop)."""
        if self.scorer is None:
            return {}
        from zoo.engine.pipe_hooks import whole_sequence_shapes  # DeepSpeed's import waits for lean_start
        from zoo.evaluate.in_loop import score

        self.engine.eval()
        with whole_sequences(self.engine.module), whole_sequence_shapes(self.engine):
            return score(self.scorer, self._tallied_forward, micro_batch=self.micro_batch_size, dp_rank=self.dp_rank,
                         dp_size=self.layout.dp, pad_to=self.task.shape.block_size if self.pipelined else None,
                         multiple=self.layout.tp if self.cfg.parallel.sequence_parallel else 1,
                         tp_group=tp_group(self.grid), device=self.device, to_device=self.task._to_device,
                         rows_file=self.run_dir / "tasks" / f"step_{self.step:07d}.jsonl" if self.rank == 0 else None,
                         cp_rank=context_rank(self.grid))

    def _summed_eval_loss(self, batches) -> torch.Tensor:
        """The loss summed over the targets of this replica's held-out batches (summed over the
        data-parallel replicas: over all of them)."""
        from zoo.models.losses import summed

        if self.pipelined:  # DeepSpeed averages the loss function's outputs over micro-batches and dp
            loss_fn = self.engine.module.loss_fn
            loss_fn.summing = True
            try:
                mean = self.engine.eval_batch(iter(batches), num_micro_batches=len(batches)).float()
            finally:
                loss_fn.summing = False
            total = mean * (len(batches) * self.layout.dp)
        else:
            total = sum(summed(self.engine(x, y), y) for x, y in batches)
            if self.layout.dp > 1:
                dist.all_reduce(total, group=self.dp_group)
        return total

    def periodic_evaluation(self) -> dict:
        """The held-out evaluation between two steps (collective): it changes nothing of the
        training (RNG state restored, the loader idle, its time and collectives outside the
        monitor's window). Updates the best eval loss, writes checkpoints/best when it
        improved (checkpoint.best), and decides early stopping. Returns the eval record."""
        t0 = time.perf_counter()
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None  # this rank's device
        self.loader.wait_idle()
        with self.monitor.outside_step():
            eval_loss = self.evaluate()
            t1 = time.perf_counter()
            tasks = self.score_tasks()  # the same on every rank, as the loss
            record = {"step": self.step, "eval_loss": eval_loss, "eval_samples": self.task.eval_samples(),
                      **(self.task.eval_metrics(eval_loss, self.eval_scores) if self.rank == 0 else {}),
                      **tasks, **({"tasks_time_s": time.perf_counter() - t1} if tasks else {}),
                      "eval_time_s": time.perf_counter() - t0}
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state(cuda_rng, self.device)
            es, s, metric = self.cfg.trainer.early_stop, self.eval_state, self.cfg.trainer.eval_metric
            value = record[metric]
            if s["best"] is None or (value > s["best"] + es.min_delta if higher_is_better(metric)
                                     else value < s["best"] - es.min_delta):
                s.update(best=value, best_step=self.step, bad_evals=0)
                if self.cfg.checkpoint.best:
                    self.save_checkpoint(name="best")
            else:
                s["bad_evals"] += 1
            if es.patience and s["bad_evals"] >= es.patience:
                self.stopped_early = self.step
        return record

    def sample(self) -> Optional[list]:
        """The task's end-of-run sample decoded on the distributed model in place (collective:
        every rank takes part, none builds the whole model), or None where it asks none."""
        want = self.task.sampling()
        if want is None:
            return None
        from zoo.parallel.generate import InPlaceDecoder, sample_in_place

        decoder = InPlaceDecoder(self.engine.module, self.grid, self.layout, self.device,
                                 sequence_parallel=self.cfg.parallel.sequence_parallel,
                                 document_mask=want.document_mask)
        with eager(self.engine.module):
            return sample_in_place(decoder, want)

    # -- the run ----------------------------------------------------------------------------
    def fit(self) -> None:
        """The loop: a step, its evaluation when due, its log line, then the rules that act on
        it (the ranks agree on signals, a non-finite loss and the background write; checkpoints;
        divergence; a signal's stop), until the last step or early stopping; then the final
        checkpoint, the result and the summary."""
        t = self.cfg.trainer
        self._announce()
        self.loader = self.open_loader()
        clock = _LoopClock(started=time.perf_counter(), first_step=self.step, compile_start=compile_seconds())
        self.monitor.start_window()
        while self.step < t.max_steps:
            local_loss = self._timed_step(clock)
            evaluated = self._evaluate_if_due()
            self._log_step(clock, local_loss, evaluated)
            self._after_step(clock, local_loss)
            if self.stopped_early:
                self._say_early_stop()
                break
        self._write_records()  # trainer.max_steps=0 (convert, evaluate): no step wrote them
        self.training_peak = peak_memory_bytes(self.device)
        self._end_training(clock)
        last = self.last_eval  # this step's evaluation (the last step's, or early stopping's), else one now
        current = last is not None and last["step"] == self.step
        eval_loss = last["eval_loss"] if current else self.evaluate()
        tasks = {k: v for k, v in last.items() if "/" in k} if current else self.score_tasks()
        summary = self._summary(clock, eval_loss, {**self.finish(eval_loss), **tasks})
        self.log.summary(summary)
        if self.rank == 0:
            from zoo.observe.result import result_lines

            hf_export = family(self.cfg.model.family).hf is not None
            resumable = (self.ckpt_root / f"step_{self.step:07d}").is_dir()
            for line in result_lines(summary, self.run_dir, export=hf_export, resumable=resumable):
                self.log.write(line)

    def _write_records(self) -> None:
        if self.on_first_step is not None:
            write, self.on_first_step = self.on_first_step, None
            write()

    def _announce(self) -> None:
        t = self.cfg.trainer
        self.log.write(f"zoo: {self.task.describe()} ({self.task.num_params():,} parameters) on {self.layout.name}, "
                       f"global batch {t.global_batch_size} = micro {self.micro_batch_size} x accum "
                       f"{self.grad_accum} x dp {self.layout.dp}, {self.cfg.precision.dtype}")
        self.log.write(self.monitor.describe())
        if self.monitor.precision_note:
            self.log.write(f"zoo: warning: {self.monitor.precision_note}")

    def _timed_step(self, clock: "_LoopClock") -> torch.Tensor:
        """One optimizer step (profiled inside trainer.profile's window), timed without
        model.compile's lazy compilation; the start's and the compile's lines after the first."""
        t0 = time.perf_counter()
        if self.step == clock.first_step:
            self._test_ballast()
        if self.profile is None:
            local_loss = self.train_step()
        else:
            with self.profile.step(self.step + 1):
                local_loss = self._profiled_step()
        step_s = time.perf_counter() - t0
        compiled_until = compile_seconds()
        compiled, clock.compile_seen = compiled_until - clock.compile_seen, compiled_until
        if compiled:  # model.compile's lazy compilation: reported, not counted as training
            step_s -= compiled
            self.monitor.exclude(compiled)
        clock.train_time += step_s
        clock.window_steps += 1
        if self.step == clock.first_step + 1:
            with self.monitor.outside_step():  # rank 0 draws the topology: no step's time, on any rank
                self._write_records()
                if self.layout.world_size > 1:
                    dist.barrier()
            if self.startup is not None:
                self.startup.mark("first_step")
                self.log.write(self.startup.line())
            if self.cfg.model.compile:
                self.log.write(f"zoo: compile: {clock.compile_seen - clock.compile_start:.1f} s compiling the model "
                               f"in the first step (torch.compile, inductor); not counted in tokens/s or MFU")
        if self.profile is not None:
            self._profile_window_end(step_s)
        return local_loss

    def _evaluate_if_due(self) -> dict | None:
        """Every trainer.eval_every steps, and at the last step: the final evaluation is that
        step's record too, and counts for the best (checkpoint.best, early stopping)."""
        t = self.cfg.trainer
        due = (t.eval_every and self.step % t.eval_every == 0) or self.step == t.max_steps
        evaluated = self.periodic_evaluation() if due and t.eval_batches != 0 else None
        if evaluated:
            self.last_eval = evaluated
        return evaluated

    def _log_step(self, clock: "_LoopClock", local_loss: torch.Tensor, evaluated: dict | None) -> None:
        """Every trainer.log_every steps (and the last): the monitor's record and diagnoses,
        with this step's evaluation in the same record; an evaluation alone otherwise."""
        t = self.cfg.trainer
        if self.step % t.log_every == 0 or self.step == t.max_steps:
            clock.loss = self._dp_mean(local_loss)
            record, diagnoses = self.monitor.report(self.step, clock.loss, clock.window_steps)
            self.log.step({**record, **(evaluated or {})})
            for line in diagnoses:
                self.log.write(f"zoo: diagnosis: {line}")
            clock.window_steps = 0
        elif evaluated:
            self.log.step(evaluated)
        self.log.advance(1, None if math.isnan(clock.loss) else clock.loss)

    def _after_step(self, clock: "_LoopClock", local_loss: torch.Tensor) -> None:
        """The rules every rank applies alike after a step: one all-reduce agrees on a signal,
        a non-finite loss and the background write; a finished write is completed; too many
        non-finite steps stop the run; a checkpoint is written when due (never of a
        non-finite step); a signal stops the run after its checkpoint."""
        t = self.cfg.trainer
        writing = self.pending.state() if self.pending is not None else 0
        received, nonfinite, writing = self._agree([signals.received(), int(not torch.isfinite(local_loss)), writing])
        if self.pending is not None and writing != 1:  # every rank's write ended (or one failed)
            self.finish_pending()
        clock.bad_steps, clock.first_bad = ((clock.bad_steps + 1, clock.first_bad or self.step) if nonfinite
                                            else (0, None))
        if clock.bad_steps >= t.max_nonfinite_steps:
            self._stop_diverged(f"the loss is not finite at step {clock.first_bad} ({clock.bad_steps} steps in a row)")
        if self.ckpt_interval.due(self.step) and not nonfinite:
            t0 = time.perf_counter()
            self.save_checkpoint(background=self.cfg.checkpoint.async_save and self.step < t.max_steps)
            if self.ckpt_interval.measures:  # the ranks agree on the largest cost and step time
                save_s, step_s, write_s = self._agree([time.perf_counter() - t0, clock.train_time / max(
                    1, self.step - clock.first_step), self.last_write_s])
                line = self.ckpt_interval.saved(self.step, save_s, step_s, write_s)
                if line:
                    self.log.write(line)
        if received:
            self._stop_on_signal(received)

    def _say_early_stop(self) -> None:
        s, es = self.eval_state, self.cfg.trainer.early_stop
        metric = self.cfg.trainer.eval_metric
        what = ("an eval loss below" if metric == "eval_loss" else
                f"a {metric} {'above' if higher_is_better(metric) else 'below'}")
        self.log.write(f"zoo: early stop at step {self.step}: {s['bad_evals']} evaluations without {what} "
                       f"the best, {s['best']:.4f} (step {s['best_step']}), by more than "
                       f"{es.min_delta:g} (trainer.early_stop.patience={es.patience})")

    def _end_training(self, clock: "_LoopClock") -> None:
        """The background write completed, a run that ended non-finite stopped as diverged, the
        log and the loader closed, and the final checkpoint (checkpointing on, or max_steps=0)."""
        self.finish_pending()
        if clock.bad_steps:  # fewer than max_nonfinite_steps were left: the run still diverged
            self._stop_diverged(f"the loss is not finite at step {clock.first_bad} ({clock.bad_steps} steps in a "
                                f"row, to the last step)")
        if not self._parameters_finite():
            self._stop_diverged(f"the parameters are not finite at step {self.step}")
        self.log.close()
        self.loader.close()  # the task is the trainer's again (evaluation, final metrics)
        final_checkpoint = self.cfg.checkpoint.every or self.cfg.trainer.max_steps == 0  # 0: convert/evaluate
        if final_checkpoint and not (self.ckpt_root / f"step_{self.step:07d}").exists():
            self.save_checkpoint()

    def _summary(self, clock: "_LoopClock", eval_loss: float | None, extras: dict) -> dict:
        """summary.json: the result, the monitor's summary, the layout, the batch and the run's facts."""
        t = self.cfg.trainer
        steps = self.step - clock.first_step
        tokens_per_step = t.global_batch_size * self.task.tokens_per_sample()
        local = sum(p.numel() for p in {id(p): p for p in self.engine.module.parameters()}.values())
        per_rank = [None] * dist.get_world_size()  # (parameters held, peak memory, at the loop's end) of each rank
        dist.all_gather_object(per_rank, (local, peak_memory_bytes(self.device), self.training_peak))
        peaks = [peak for _, peak, _ in per_rank]
        top = max(range(len(peaks)), key=peaks.__getitem__)
        return {
            "final_loss": clock.loss, **({} if eval_loss is None else {"eval_loss": eval_loss,
                                                                       "eval_samples": self.task.eval_samples()}),
            **self.monitor.summary(clock.train_time, steps),
            **extras, "tokens_per_s": tokens_per_step * steps / clock.train_time if clock.train_time else 0.0,
            "steps": self.step, "steps_run": steps, "world_size": self.layout.world_size, "tp": self.layout.tp,
            **({"cp": self.layout.cp} if self.layout.cp > 1 else {}), "pp": self.layout.pp, "dp": self.layout.dp, "zero_stage": self.layout.zero_stage,
            "params": self.task.num_params(), "params_per_rank": [n for n, _, _ in per_rank],
            "global_batch_size": t.global_batch_size, "micro_batch_size": self.micro_batch_size,
            "grad_accum": self.grad_accum, "dtype": self.cfg.precision.dtype,
            **(best_fields(self.eval_state) if self.eval_state["best"] is not None else {}),
            **({"stopped_early_at_step": self.stopped_early} if self.stopped_early else {}),
            # the largest rank's, which rank, and every rank's: memory is planned from the largest
            "peak_mem_bytes": peaks[top], "peak_mem_rank": top, "peak_mem_bytes_per_rank": peaks,
            **({"cpu_allocator": allocator.in_use()} if self.device.type == "cpu" else {}),  # rank 0's malloc
            # the same at the end of the training loop: what the end (the last checkpoint, the
            # final weights, evaluation, the sample) added is the difference
            "peak_mem_bytes_per_rank_training": [at_end for _, _, at_end in per_rank],
            **({"peak_mem_share": peaks[top] / self.monitor.device_memory} if steps else {}),
            "wall_time_s": time.perf_counter() - clock.started,
            **({"checkpoint_stall_s": self.stall_s} if self.cfg.checkpoint.async_save else {}),
            **({"skipped_steps": engine_state.skipped_steps(self.engine),
                "loss_scale": engine_state.loss_scale(self.engine)} if self.cfg.precision.dtype == "fp16" else {}),
            **({"compile_s": compile_seconds() - clock.compile_start} if self.cfg.model.compile else {}),
            **({"startup": self.startup.phases()} if self.startup is not None else {}),
            **(attempts.totals(self.run_dir) if self.rank == 0 else {})}  # a job that may restart: its attempts

    def _agree(self, flags):
        """The maximum of each flag over all ranks (one small all-reduce per step)."""
        t = torch.tensor(flags, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def _parameters_finite(self) -> bool:
        """Whether every rank's parameters are finite (its ZeRO-3 partition where partitioned; collective)."""
        bad = 0
        for p in self.engine.module.parameters():
            held = engine_state.held(p)
            if held.numel() and not bool(torch.isfinite(held.detach()).all()):
                bad = 1
                break
        return not self._agree([bad])[0]

    def _stop_diverged(self, what: str) -> None:
        """Stop with exit 3: no checkpoint and no weights file are written from a diverged model
        (one of an earlier step still being written is completed)."""
        self.finish_pending()
        latest = self.ckpt_root / "latest"
        last_good = (self.ckpt_root / latest.read_text().strip()) if latest.exists() else None
        self.log.close()
        if self.rank == 0:
            print(f"zoo: error: {what}; stopping, nothing saved. The last good checkpoint is "
                  f"{last_good or 'none (checkpointing is off)'}, untouched. Lower optim.lr, check the data, or use "
                  f"bf16/fp32; resume with resume=auto", file=sys.stderr, flush=True)
        raise SystemExit(DIVERGED_EXIT_CODE)

    def _stop_on_signal(self, received: int) -> None:
        """Checkpoint (when checkpointing is on, and always for Slurm's SIGUSR1) and exit."""
        name = signals.name(received)
        if self.cfg.checkpoint.every or received == 3:
            path = self.save_checkpoint()
            self.log.write(f"zoo: {name} received: stopped after step {self.step}, checkpoint {path}; continue with "
                           f"python -m zoo.train hydra.run.dir={self.run_dir} resume=auto (on any layout)")
        else:
            self.log.write(f"zoo: {name} received: stopped after step {self.step} (checkpointing is off)")
        self.log.close()
        raise SystemExit(signals.exit_code(received))

    def finish(self, eval_loss: float) -> dict:
        """Write the final weights (checkpoint.save_final; collective, tensor by tensor), decode
        the task's sample in place (collective) and compute the family's metrics on rank 0 from
        the last evaluation's tally and the sample."""
        if self.cfg.checkpoint.save_final:
            write_final(self.engine, self.grid, self.run_dir, self.meta)
        sample = self.sample()
        return self.task.final_metrics(eval_loss, self.eval_scores, sample) if self.rank == 0 else {}

    def close(self) -> None:
        """Stop the loader and the monitor, finish the tracker (with the exit code when a
        SystemExit or an error is on its way out)."""
        err = sys.exc_info()[1]
        code = 0 if err is None else (err.code if isinstance(err, SystemExit) and isinstance(err.code, int) else 1)
        if self.loader is not None:
            self.loader.close()
        self.monitor.close()
        self.log.finish(code)


"""Train a model: `python -m zoo.train [model=gpt] [parallel=ddp|zero1|zero2|zero3] [key=value ...]`.

Composes `conf/` with Hydra, validates the config once (before any process group exists),
then either starts the layout's local worker processes (plain `python -m zoo.train`) or
runs as one rank under torchrun, the deepspeed launcher or srun.

    python -m zoo.train                                   # tiny GPT on the embedded corpus
    python -m zoo.train parallel=zero2 trainer.max_steps=50
    python -m zoo.train --cfg job                         # print the composed config
    torchrun --nproc-per-node 2 -m zoo.train parallel=zero1
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from zoo.config.cli import CONF, TaskStarted, run_hydra_app
from zoo.config.schema import Config, config_from_yaml, register_configs

register_configs()
_task_started = TaskStarted()
# Exit codes with which ranks stop after printing the reason (rank 0, or the rank whose own
# files were refused): a config error (2), a diverged loss (3), a Slurm requeue request
# (75), SIGINT (130), SIGTERM (143).
REPORTED_EXITS = (2, 3, 75, 130, 143)


def _rank0() -> bool:
    """This process is rank 0, or the only one: RANK, else srun's SLURM_PROCID (read before
    zoo.run.launch.detect sets RANK from it), so that every rank's line is said once."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0


def _fail(message: str, run_dir: str | None) -> None:
    """One line, exit code 2; an empty run directory we created is removed again. Under an
    external launcher every rank validates and fails alike: rank 0 says it, once."""
    if run_dir and os.path.isdir(run_dir) and not os.listdir(run_dir):
        os.rmdir(run_dir)
    if _rank0():
        print(f"zoo: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


RUN_RESULTS = ("summary.json", "metrics.jsonl", "model.safetensors", "model.safetensors.index.json")  # a run's results


def _refuse_overwriting(run_dir: str) -> None:
    """A fresh start never writes over an earlier run's checkpoints or results (a run still
    going there is refused by its lock instead, naming it)."""
    if _running_there(run_dir):
        return
    steps = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.is_dir())
    if steps:
        _fail(f"hydra.run.dir={run_dir} already holds checkpoints ({', '.join(steps[-3:])}); a fresh start would "
              f"write over them: continue that run with resume=auto, or start in another hydra.run.dir", run_dir)
    results = [name for name in RUN_RESULTS if (Path(run_dir) / name).exists()]
    if results:
        _fail(f"hydra.run.dir={run_dir} already holds a run's results ({', '.join(results)}); a fresh start would "
              f"write over them: start in another hydra.run.dir (or remove that run)", run_dir)


def _refuse_starting_over(run_dir: str) -> None:
    """resume=auto where no checkpoint is: a fresh start, unless the directory holds a finished
    run (its results), which a fresh start would overwrite."""
    path = Path(run_dir)
    if _running_there(run_dir) or any(p.is_dir() for p in (path / "checkpoints").glob("step_*")):
        return
    results = [name for name in ("summary.json", "model.safetensors", "model.safetensors.index.json")
               if (path / name).exists()]
    if results:
        _fail(f"hydra.run.dir={run_dir} holds a finished run ({', '.join(results)}) but no checkpoint to continue "
              f"from (it ran with checkpoint.every=0), and resume=auto would start afresh over it: start in another "
              f"hydra.run.dir (to go on from its weights: python -m zoo.export {run_dir} {run_dir}/hf, then "
              f"model.init_from={run_dir}/hf)", run_dir)


def _running_there(run_dir: str) -> bool:
    """A run is going on in `run_dir` (its lock is held): starts there are refused by the lock, naming it."""
    from zoo.run.lock import RunDirLock

    return RunDirLock(run_dir).in_use()


def nothing_to_train(resume: str, run_dir: str, max_steps: int) -> str | None:
    """The line refusing a resume whose checkpoint is already at trainer.max_steps (or past
    it): it would train no step and write over the finished run's results. Read from the
    checkpoint's state.json alone, before anything starts (the trainer checks the checkpoint it
    really takes again)."""
    from zoo.checkpoint.verify import newest_step, step_of

    root = Path(run_dir if resume == "auto" else resume)
    if (root / "state.json").is_file():  # resume=CHECKPOINT_DIR
        found = (root, step_of(root))
    else:  # resume=auto, or resume=RUN_DIR: its newest checkpoint
        found = newest_step(root / "checkpoints" if (root / "checkpoints").is_dir() else root) or (root, None)
    if found[1] is None or found[1] < max_steps:
        return None
    from zoo.config.continuation import refusal_at_step

    return refusal_at_step(resume, found[0], found[1], max_steps)


def continued(dcfg: DictConfig, run_dir: str, overrides) -> DictConfig:
    """A resume in a run directory that has its config.yaml continues that config, with the
    command line's overrides on top (zoo.config.continuation); other starts are as composed."""
    from zoo.run.attempts import current

    saved = Path(run_dir) / "config.yaml"
    attempt = current()
    if attempt.number and not dcfg.get("resume"):  # a restarted attempt (torchrun --max-restarts) continues the run
        dcfg = dcfg.copy()
        dcfg.resume = "auto"
        overrides = [*overrides, "resume=auto"]  # over the run's own config, as if typed
        if _rank0():
            print(f"zoo: restart {attempt.number} of {attempt.max_restarts} ({attempt.launcher}) on "
                  f"{os.environ.get('WORLD_SIZE')} rank(s): resume=auto, from the newest checkpoint", flush=True)
    if not dcfg.get("resume") or not saved.is_file():
        return dcfg
    import yaml

    from zoo.config.continuation import continued_config

    try:
        merged = continued_config(OmegaConf.to_container(dcfg, resolve=False), saved.read_text(), overrides)
    except yaml.YAMLError as err:
        _fail(f"{saved} does not parse ({str(err).splitlines()[0]}), and a resume continues the config it holds: "
              f"restore it (each run writes it at its start), or start in another hydra.run.dir", None)
    if _rank0():
        given = " ".join(o for o in overrides if not o.startswith("resume="))
        print(f"zoo: resume: the run's own config ({saved})" + (f", with {given} on top" if given else ""), flush=True)
    return OmegaConf.create(merged)


def _auto_layout(cfg: Config, env, run_dir: str, overrides, measured: bool = True, memory=None) -> Config:
    """parallel=auto: the planned layout for the ranks there are (zoo.plan.auto), said in at
    most three lines; on a resume, what changed from the layout that wrote the run.
    `measured=False`: the planner's own pick, plan.measure left out and nothing said.
    `memory`: (device bytes, host bytes) to plan for; None: this machine's."""
    import torch

    from zoo.plan.auto import given_keys, plan_layout, replanned_line, world_of
    from zoo.plan.dry_run import planned_vocab
    from zoo.plan.one_plan import planning_memory
    from zoo.run import launch

    world, per_node = world_of(cfg.parallel, env.world_size, launch.ranks_per_node(), torch.cuda.device_count(),
                               len(os.sched_getaffinity(0)))
    device, host = memory or planning_memory(per_node)
    measure = None
    if not measured:
        cfg = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, measure=None))
    elif env.kind == "local":  # plan.measure: the layouts run here, from this one process
        from zoo.plan.measure import measure

        if cfg.plan.measure is not None:
            print(f"zoo: parallel=auto: running the planner's top {cfg.plan.measure} layouts here for "
                  f"{cfg.plan.measure_steps} steps each (plan.measure)", flush=True)
    planned, lines = plan_layout(cfg, world=world, per_node=per_node, device_bytes=device,
                                 host_bytes=host, cuda=torch.cuda.is_available(), given=given_keys(overrides),
                                 vocab_size=planned_vocab(cfg.data), measure=measure,
                                 devices_here=torch.cuda.device_count())
    saved = Path(run_dir) / "config.yaml"
    if cfg.resume and saved.is_file():
        import yaml

        before = (yaml.safe_load(saved.read_text()) or {}).get("parallel")
        if before:  # the layout that wrote the run
            lines = [replanned_line(before, planned, world, per_node), *lines]
    if measured and _rank0():
        for line in lines:
            print(f"zoo: {line}", flush=True)
    return planned


def _checked(cfg: Config, env) -> tuple:
    """(the layout, the warnings) of the validation pass; ZooError for a mistake."""
    import torch

    from zoo.config.validate import resolve_layout, validate
    from zoo.run import launch
    from zoo.run.errors import ConfigError

    if cfg.run.max_restarts and env.kind != "local":
        fix = {"torchrun": f"drop it and give torchrun --max-restarts={cfg.run.max_restarts}",
               "slurm": "the sbatch scripts read it (slurm/srun_ranks.sh runs srun again); under a bare srun drop it"}
        raise ConfigError(f"run.max_restarts={cfg.run.max_restarts} is read by zoo's own launcher (python -m zoo.train), "
                          f"not under {env.kind}: " + fix.get(env.kind, "drop it: there a failure ends the job, and a "
                                                                         "requeue or a new start with resume=auto "
                                                                         "resumes it"))
    layout, warnings = resolve_layout(cfg, env.world_size)
    warnings += validate(cfg, layout, cuda_available=torch.cuda.is_available())
    placed = launch.tp_placement_warning(layout.tp, launch.ranks_per_node()) if env.world_size else None
    return layout, warnings + ([placed] if placed else [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(dcfg: DictConfig, run_dir: str, overrides=()) -> None:
    job_start = time.time()
    from omegaconf.errors import OmegaConfBaseException

    from zoo.config.cli import omegaconf_error_line
    from zoo.run import launch
    from zoo.run.errors import ConfigError, ZooError

    try:  # typed and resolved once, the object the ranks get: an unknown `+key` or a bad interpolation fails here
        cfg_yaml = OmegaConf.to_yaml(dcfg, resolve=True)
        cfg: Config = config_from_yaml(cfg_yaml)
    except OmegaConfBaseException as err:
        _fail(omegaconf_error_line(err), run_dir)
    env = launch.detect()
    from zoo.run.quiet import quiet_third_party

    quiet_third_party(cfg.verbose)  # the raw-deepspeed-key check imports DeepSpeed here
    if not cfg.resume:  # before anything takes time (plan.measure runs layouts for minutes)
        _refuse_overwriting(run_dir)
    elif cfg.resume == "auto":
        _refuse_starting_over(run_dir)
    if cfg.resume and not _running_there(run_dir):  # a run going on there: its lock refuses, naming it
        problem = nothing_to_train(cfg.resume, run_dir, cfg.trainer.max_steps)
        if problem:
            _fail(problem, None)
    unplanned_here = False
    try:
        if cfg.parallel.auto:
            from zoo.config.ranges import check_ranges

            check_ranges(cfg)  # parallel.world_size among them, before it is planned for
            if cfg.plan.measure is not None:  # the rest of the config checked before the layouts run
                _checked(_auto_layout(cfg, env, run_dir, overrides, measured=False), env)
            unplanned = cfg
            try:
                cfg = _auto_layout(cfg, env, run_dir, overrides)
            except ConfigError:  # under a launcher: nothing fits this rank's memory, and so none the job's
                if env.kind == "local":
                    raise
                unplanned_here = True  # rank 0 plans for the smallest memory and says it once (zoo.plan.one_plan)
        elif cfg.parallel.world_size is not None:
            raise ConfigError(f"parallel.world_size={cfg.parallel.world_size} is read with parallel=auto (the ranks it "
                              f"plans for); without it set the layout: parallel.dp=N replicas of tp x pp")
        elif cfg.plan.measure is not None:
            raise ConfigError(f"plan.measure={cfg.plan.measure} is read with parallel=auto (it trains with the fastest "
                              f"of the planner's top {cfg.plan.measure} layouts, run here first); to compare layouts "
                              f"without training: python -m zoo.plan model=... cluster=cpu plan.measure="
                              f"{cfg.plan.measure}")
        if not unplanned_here:
            layout, warnings = _checked(cfg, env)
    except ZooError as err:
        if cfg.verbose:
            raise
        _fail(str(err) + restarted_on(cfg, env), run_dir)
    if unplanned_here:
        _one_plan_worker(cfg, env, run_dir, overrides, None)
        return
    rank0 = _rank0()
    over = _over_memory(cfg, layout, env)  # every rank alike: each refuses, rank 0 says it
    if over and not (cfg.plan.allow_over or cfg.trainer.dry_run):
        _fail(f"{over}; plan.allow_over=true starts it anyway", run_dir)
    if over:
        warnings.append(over)
    for w in warnings:
        if rank0:
            print(f"zoo: warning: {w}", file=sys.stderr, flush=True)
    if cfg.trainer.dry_run:
        _dry_run(cfg, layout, env, run_dir)
    from zoo.observe.startup import mark_validated

    mark_validated(job_start)  # the ranks' start-up clock: from this command's start, validation ended now

    if env.kind != "local":
        if cfg.parallel.auto:  # rank 0's plan for the smallest memory any rank has (zoo.plan.one_plan)
            _one_plan_worker(unplanned, env, run_dir, overrides, cfg)
            return
        from zoo.worker import main as worker_main

        worker_main(cfg, run_dir)
        return
    os.makedirs(run_dir, exist_ok=True)
    from zoo.run.lock import HELD_ENV, RunDirLock

    try:
        lock = RunDirLock(run_dir).acquire()  # this process owns the run: its workers inherit that
    except ZooError as err:
        _fail(str(err), run_dir)
    os.environ[HELD_ENV] = "1"
    try:
        _launch_local(cfg, layout, run_dir)
    except SystemExit as stop:
        if stop.code == 2:  # refused: the ranks removed what they wrote; so goes a directory made for it
            lock.release()
            if not os.listdir(run_dir):
                os.rmdir(run_dir)
        raise
    finally:
        os.environ.pop(HELD_ENV, None)
        lock.release()


def restarted_on(cfg: Config, env) -> str:
    """What a config error on a restarted attempt adds: the job came back on other ranks than
    the given layout was written for ("" on a first attempt, or where parallel=auto re-plans)."""
    from zoo.run.attempts import current

    attempt = current()
    if not attempt.number or cfg.parallel.auto:
        return ""
    return (f" (restart {attempt.number} of {attempt.max_restarts}, {attempt.launcher}: the job came back on "
            f"{env.world_size} rank(s), and this layout no longer fits them; parallel=auto re-plans a restarted job "
            f"for the ranks it has)")


def _one_plan_worker(unplanned: Config, env, run_dir: str, overrides, planned: Optional[Config]) -> None:
    """This rank under an external launcher with parallel=auto: it runs the plan rank 0 makes for
    the smallest memory any rank reports (`planned`: this rank's own, None where nothing fit it)."""
    from zoo.plan.auto import world_of
    from zoo.plan.one_plan import planning_memory
    from zoo.run import launch
    from zoo.worker import main as worker_main

    per_node = world_of(unplanned.parallel, env.world_size, launch.ranks_per_node(), 0, 1)[1]
    replan = lambda device, host: _auto_layout(unplanned, env, run_dir, overrides, measured=False,  # noqa: E731
                                               memory=(device, host))
    worker_main(planned or unplanned, run_dir, one_plan=(planned is not None, planning_memory(per_node), replan))


def _over_memory(cfg: Config, layout, env) -> str | None:
    """The planner's line where its memory estimate per device is above plan.mem_fraction of the
    device (a GPU's, or on a CPU the host's RAM over its local ranks); None where it fits or the
    planner does not describe the family."""
    from zoo.plan.dry_run import planned_vocab
    from zoo.plan.fit import device_memory_bytes, fit_warning

    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", layout.world_size if env.kind == "local" else 1))
    try:
        return fit_warning(cfg, layout, device_memory_bytes(ranks_here), vocab_size=planned_vocab(cfg.data))
    except (ValueError, KeyError):  # a family the planner does not describe yet
        return None


def _dry_run(cfg: Config, layout, env, run_dir: str) -> None:
    """Print the plan of the validated run (rank 0) and exit 0: no rank, nothing written."""
    import torch

    from zoo.families.registry import family
    from zoo.plan.dry_run import dry_run_lines
    from zoo.plan.fit import device_memory_bytes

    if _rank0():
        ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", layout.world_size if env.kind == "local" else 1))
        device = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                  else f"CPU share (this host's RAM over its {ranks_here} rank(s))")
        for line in dry_run_lines(cfg, layout, family(cfg.model.family), device_memory_bytes(ranks_here), device):
            print(f"zoo: dry run: {line}", flush=True)
        print("zoo: dry run: validated and planned; nothing started or written (drop --dry-run to train)", flush=True)
    if os.path.isdir(run_dir) and not os.listdir(run_dir):
        os.rmdir(run_dir)
    sys.exit(0)


def _launch_local(cfg: Config, layout, run_dir: str) -> None:
    """Run the layout's ranks on this host: in this process for one rank, else as workers."""
    from zoo.run import launch

    if layout.world_size == 1 and not cfg.run.max_restarts:  # (a restartable rank is a worker process)
        from zoo.worker import main as worker_main

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), ZOO_LOCAL_WORKER="1")
        worker_main(cfg, run_dir)
        return
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from zoo.run.errors import ZooError
    from zoo.run.oom import oom_kills

    for attempt in range(cfg.run.max_restarts + 1):
        kills_before = oom_kills()
        try:
            launch.launch_local(layout.world_size, cfg, run_dir, cfg.parallel.timeout_s, cfg.verbose,
                                dynamo=cfg.model.compile or layout.zero_stage == 3, attempt=attempt)
            return
        except ZooError as err:  # before any rank started
            _fail(str(err), run_dir)
        except SignalException as err:  # the agent passed SIGTERM/SIGINT on to the ranks, which checkpointed
            sys.exit(128 + int(err.sigval))
        except ChildFailedError as err:
            rank, first = _cause(err)
            if first.exitcode in REPORTED_EXITS:
                sys.exit(first.exitcode)  # that rank said why (the others were stopped)
            kills = oom_kills()
            if first.exitcode == -9 and kills is not None and kills_before is not None and kills > kills_before:
                from zoo.run.oom import oom_line

                print(f"zoo: error: {oom_line(rank, Path(run_dir), _planned_bytes(cfg, layout))}"
                      + ("; not restarted (run.max_restarts): the same layout would run out again"
                         if attempt < cfg.run.max_restarts else ""), file=sys.stderr, flush=True)
                sys.exit(1)
            failed = f"rank {rank} failed first (exit code {first.exitcode}): {_last_error_line(first.message)}"
            if attempt < cfg.run.max_restarts:
                print(f"zoo: {failed}; restart {attempt + 1} of {cfg.run.max_restarts} (run.max_restarts): the ranks "
                      f"start again and resume the newest checkpoint", file=sys.stderr, flush=True)
                cfg = dataclasses.replace(cfg, resume="auto")
                continue
            if cfg.run.max_restarts:
                from zoo.checkpoint.verify import newest_step

                newest = newest_step(Path(run_dir) / "checkpoints")  # the one resume=auto takes first
                print(f"zoo: error: {failed}; that was attempt {attempt + 1} of {attempt + 1}: run.max_restarts="
                      f"{cfg.run.max_restarts} spent, the job ends" + (
                          f" (resume=auto in hydra.run.dir={run_dir} goes on from {newest[0].name})" if newest else
                          " (no checkpoint was written)"), file=sys.stderr, flush=True)
            else:
                print(f"zoo: {failed}", file=sys.stderr, flush=True)
            sys.exit(1)


def _planned_bytes(cfg: Config, layout) -> float | None:
    """The planner's memory estimate of one local rank (None for a family it does not describe)."""
    from zoo.plan.dry_run import planned_vocab
    from zoo.plan.fit import device_memory_bytes, run_memory

    try:
        return run_memory(cfg, layout, device_memory_bytes(layout.world_size), vocab_size=planned_vocab(cfg.data))[1]["total"]
    except (ValueError, KeyError):
        return None


def _cause(err):
    """(rank, failure) that explains the others: a rank that stopped with a reported exit (it
    printed why), else one killed by a signal (its peers then fail in a collective, "Connection
    closed by peer", and may be seen first), else the agent's first failure."""
    failures = sorted(err.failures.items())
    for rank, failure in failures:
        if failure.exitcode in REPORTED_EXITS:
            return rank, failure
    for rank, failure in failures:
        if failure.exitcode < 0:
            return rank, failure
    return err.get_first_failure()


def _last_error_line(message) -> str:
    """The line that says what went wrong, from the agent's failure message: a string (a
    signal) or the error file's record, a dict whose `message` ends with the exception."""
    if isinstance(message, dict):
        message = message.get("message", "")
    lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
    return lines[-1][:500] if lines else "(no message)"


@hydra.main(version_base=None, config_path=str(CONF), config_name="config")  # absolute: also when imported
def _hydra_main(dcfg: DictConfig) -> None:
    _task_started()
    from hydra.core.hydra_config import HydraConfig

    from zoo.config.cli import unknown_optional_choices

    for problem in unknown_optional_choices(HydraConfig.get().runtime.choices):
        _fail(problem, HydraConfig.get().runtime.output_dir)

    # A Hydra sweep runs every job in this process: each starts from the environment the
    # process started with (the local launcher sets RANK, WORLD_SIZE, ... for its ranks).
    environ = dict(os.environ)
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        overrides = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)  # as typed
        run(continued(dcfg, run_dir, overrides), run_dir, overrides)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def _take_local_rank(argv: list) -> list:
    """The deepspeed launcher passes `--local_rank=N` (unless --no_local_rank): Hydra would
    refuse it, so it is taken out here and kept as LOCAL_RANK, which the launcher also sets."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--local_rank=") or arg.startswith("--local-rank="):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        elif arg in ("--local_rank", "--local-rank") and i + 1 < len(argv):
            os.environ.setdefault("LOCAL_RANK", argv[i + 1])
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


def _debug_alias(argv: list) -> list:
    """`debug=true|false` means verbose=...: the `debug` group holds presets (debug=fast), and
    Hydra would refuse a boolean group choice with a traceback."""
    return [f"verbose={a.split('=', 1)[1].lower()}" if re.fullmatch(r"debug=(?i:true|false)", a) else a for a in argv]


def _dry_run_flag(argv: list) -> list:
    """`--dry-run` is trainer.dry_run=true (Hydra would refuse the flag)."""
    return ["trainer.dry_run=true" if a == "--dry-run" else a for a in argv]


def _explicit_run_dir(argv) -> str | None:
    for arg in argv:
        if arg.startswith("hydra.run.dir="):
            return arg.split("=", 1)[1]
    return None


def main() -> None:
    from zoo.run import signals
    from zoo.run.directory import RunDirError, check_writable

    signals.install()  # before the slow imports: Slurm's warning may come during start-up
    sys.argv[1:] = _dry_run_flag(_debug_alias(_take_local_rank(sys.argv[1:])))
    run_dir = _explicit_run_dir(sys.argv[1:])
    # Hydra would fail on an unwritable run directory with a traceback. Without hydra.run.dir
    # the run goes under outputs/ in the working directory.
    probe = "outputs" if run_dir is None else (None if "${" in run_dir else run_dir)
    hydra_flags = any(a.startswith("-") for a in sys.argv[1:])  # --cfg, --help, --info, -m: no run directory
    made = probe is not None and not hydra_flags and not os.path.isdir(probe)
    if probe and not hydra_flags:
        try:
            check_writable(probe)
        except RunDirError as err:
            _fail(str(err), None)
    try:
        run_hydra_app(_hydra_main, _task_started)
    except SystemExit as stop:  # a config that did not compose leaves no directory made for it
        if stop.code == 2 and made and not _task_started.value and os.path.isdir(probe) and not os.listdir(probe):
            os.rmdir(probe)
        raise


if __name__ == "__main__":
    # The importable module's main, not this __main__ copy's: Hydra's submitit launcher pickles
    # the task function, and cloudpickle copies a function of __main__ by value, with its
    # globals (the held stderr among them: not picklable); zoo.train's is pickled by name.
    import zoo.train

    zoo.train.main()

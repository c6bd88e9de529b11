"""What every rank runs: join the process group, agree on the run directory, build the rank
grid, the data, the (parallelized) model and the engine, then hand over to the trainer.

`main` is the entry point of the local launcher's worker processes and of each rank
started by torchrun, the deepspeed launcher or srun (through `zoo.train`).
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import socket
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from zoo.config.schema import Config
from zoo.parallel.topology import Layout, build_grid, describe_grid
from zoo.run.errors import USER_ERROR_EXIT_CODE, RunDirError, ZooError


def _device(local_rank: int) -> torch.device:
    """This rank's device. A site may give each task one GPU of its own (LOCAL_RANK 3, one
    visible device): the rank takes local_rank % visible devices, and LOCAL_RANK is set to that
    index, which DeepSpeed reads for its own set_device and the process group's device_id
    (with the raw value: "invalid device ordinal")."""
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        if index != local_rank:
            os.environ["LOCAL_RANK"] = str(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_distributed(parallel, dtype: str, raw_deepspeed) -> None:
    """The default process group over parallel.backend with parallel.timeout_s (`parallel`: that
    section; `dtype`: precision.dtype; `raw_deepspeed`: the config's raw deepspeed keys)."""
    import deepspeed

    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()
    lean_start.skip_muon_import(raw_deepspeed)
    if dtype == "fp16":  # on a CPU: DeepSpeed's fp16 paths, where torch computes fp16 here
        from zoo.engine import half

        half.enable_on_cpu()

    backend = parallel.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    timeout = timedelta(seconds=parallel.timeout_s)
    # DeepSpeed's grid creates its groups with dist.new_group() and no timeout, which falls
    # back to torch's module-level default (30 min): make that default ours, so a hung rank
    # ends the job after parallel.timeout_s in every group.
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    c10d.default_pg_nccl_timeout = timeout
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # torchrun: the process group on a store of this attempt's own
        bound = {"device_id": torch.device("cuda", torch.cuda.current_device())} if backend == "nccl" else {}
        dist.init_process_group(backend, store=attempt_store(timeout), rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout, **bound)  # as DeepSpeed binds it
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, timeout=timeout)  # (then wraps it)


def attempt_store(timeout: timedelta):
    """torchrun's store (its agent's, at MASTER_ADDR:MASTER_PORT) under a prefix of this run and
    attempt (TORCHELASTIC_RESTART_COUNT). Through torch's own env:// rendezvous, a restarted
    attempt whose ranks came up at different times read a peer's address from the attempt
    before and failed its gloo mesh ("Connection refused"; pytorch#167288 for NCCL): a rank
    killed under `torchrun --max-restarts` could never restart."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
                          os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and os.environ["RANK"] == "0",
                          timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    # with the world size: a node joining makes the agent restart the ranks without counting a restart
    return dist.PrefixStore(f"zoo/{os.environ['TORCHELASTIC_RUN_ID']}/attempt_{attempt}/world_{os.environ['WORLD_SIZE']}",
                            store)


def leave_process_group() -> None:
    """Destroy every process group, after collecting the garbage that still refers to them.

    Autograd graphs of tensor-parallel collectives form reference cycles; left to the
    interpreter's teardown, they are freed after the groups were shut down and the rank
    aborts ("terminate called without an active exception", SIGABRT) after it chose its exit
    code: 3 of 15 two-rank runs of a tp forward/backward did here, 0 of 25 with this."""
    gc.collect()
    dist.destroy_process_group()


def agree_run_dir(proposed: str) -> Path:
    """Rank 0's run directory, for every rank. Ranks started by an external launcher each
    composed their own (e.g. a timestamp); the ones that differ are removed if empty."""
    chosen = [proposed]
    dist.broadcast_object_list(chosen, src=0)
    if chosen[0] != proposed and os.path.isdir(proposed) and not os.listdir(proposed):
        os.rmdir(proposed)
    return Path(chosen[0])


def show_topology(layout: Layout, rank: int, device: torch.device, verbose: bool = False):
    """The rank grid with each rank's host and device (collective; ('', [], []) on ranks but 0).
    Rank 0 prints its first line and the hosts (verbose: all of it); the whole grid goes to
    topology.txt. Returns (the grid's text, the hosts, the devices)."""
    places = [None] * dist.get_world_size()
    dist.all_gather_object(places, (socket.gethostname(), str(device)))
    if rank != 0:
        return "", [], []
    hosts, devices = [h for h, _ in places], [d for _, d in places]
    text = describe_grid(layout, hosts, devices)
    distinct = sorted(set(hosts))
    hosts_shown = ", ".join(distinct[:4]) + (", ..." if len(distinct) > 4 else "")
    shown = "zoo: " + (text if verbose else f"{text.splitlines()[0]} on {len(distinct)} host(s) ({hosts_shown}); "
                                            f"the rank grid goes to topology.txt\n")
    print(shown, end="", flush=True)
    return text, hosts, devices


def _find_micro_batch(cfg: Config, layout: Layout, grid, task, device: torch.device, rank: int) -> None:
    """trainer.micro_batch_size=auto: measure, and set the micro-batch this run will use."""
    from zoo.plan.batch_finder import describe, find_micro_batch_size

    best, trials, budget = find_micro_batch_size(cfg, layout, grid, task, device)
    cfg.trainer.micro_batch_size = best
    if rank == 0:
        print(describe(best, trials, budget, cfg.trainer.global_batch_size, layout.dp), flush=True)


def main(cfg: Config, run_dir: str, threads: Optional[int] = None, one_plan=None, attempt: Optional[tuple] = None) -> None:
    """Run one rank of a training job with the config `zoo.train` composed and validated (handed
    over as it is: in this process under torchrun, srun and the deepspeed launcher, pickled to
    the workers of zoo's own launcher). `one_plan`: (this rank's planning memory, replan) under
    an external launcher with parallel=auto: the job runs rank 0's plan (zoo.plan.one_plan).
    `attempt`: (number, wall time it was launched) from the local launcher (run.max_restarts; a
    forkserver's ranks inherit its environment of the first attempt, so it comes as an argument):
    a restarted attempt's start-up is timed from its own launch."""
    from zoo.observe.startup import StartupClock
    from zoo.run import signals

    if attempt is not None:
        from zoo.observe.startup import START_ENV, VALIDATED_ENV
        from zoo.run.attempts import ATTEMPT_ENV, MAX_RESTARTS_ENV

        os.environ.update({ATTEMPT_ENV: str(attempt[0]), MAX_RESTARTS_ENV: str(cfg.run.max_restarts)})
        if attempt[0]:
            os.environ[START_ENV] = os.environ[VALIDATED_ENV] = repr(attempt[1])
    clock = StartupClock()
    clock.mark("ranks")
    signals.install()
    # DeepSpeed still calls the collectives torch renamed; the notice says nothing to users.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    # DeepSpeed's pipeline engine broadcasts inside autograd (losses match the plain model's).
    warnings.filterwarnings("ignore", message=r"c10d::broadcast_: an autograd kernel was not registered")
    if threads:
        torch.set_num_threads(threads)
    from zoo.run.quiet import quiet_third_party

    quiet_third_party(cfg.verbose, int(os.environ.get("RANK", 0)))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = _device(local_rank)
    init_distributed(cfg.parallel, cfg.precision.dtype, cfg.deepspeed)
    from zoo.run import roll_call

    listener = None  # should a peer be lost: this rank answers the survivors' roll call
    if not os.environ.get("ZOO_LOCAL_WORKER"):  # (zoo's launcher names a failed rank itself)
        listener = roll_call.listen(dist.get_rank())
    clock.mark("process_group")
    try:
        plan_record = None
        if one_plan is not None:
            from zoo.plan.one_plan import agree

            cfg, plan_record = agree(cfg, *one_plan)
        _run(cfg, run_dir, device, clock, plan_record)
    except ZooError as err:  # a user mistake found on the ranks: one line, exit 2 (verbose=true: the traceback)
        if cfg.verbose:
            raise
        # Rank 0 reports what every rank finds alike; a rank reports what only its own inputs showed.
        if dist.get_rank() == 0 or err.rank_local:
            print(f"zoo: error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(USER_ERROR_EXIT_CODE) from None
    except Exception as err:
        lost = _peer_lost(err) or _timed_out(err)
        if os.environ.get("ZOO_LOCAL_WORKER") or cfg.verbose:
            if lost:  # let the launcher see the rank that died first: it is the one to report
                time.sleep(PEER_LOST_GRACE_S)
            raise  # zoo's local launcher names the first failing rank itself
        verdict = None
        if lost:  # under srun and the deepspeed launcher rank 0's process serves the store: it stays for the verdict
            keeps_store = dist.get_rank() == 0 and not os.environ.get("TORCHELASTIC_RUN_ID")
            verdict = roll_call.roll_call(roll_call.client(), dist.get_rank(), dist.get_world_size(),
                                          PEER_LOST_GRACE_S, keeps_store=keeps_store)
        report_failure(err, lost, verdict)
        raise SystemExit(1) from None
    finally:  # on every way out: an error, a refusal, a signal
        if listener is not None:
            listener.stop()
        leave_process_group()


PEER_LOST_GRACE_S = 2.0
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Read error")


def _peer_lost(err: BaseException) -> bool:
    """A collective failed because another rank went away (gloo's words for it)."""
    return any(text in str(err) for text in _PEER_LOST)


def _timed_out(err: BaseException) -> bool:
    """A collective waited parallel.timeout_s for a rank that did not come (it hangs)."""
    text = str(err)
    return "Timed out" in text or "timed out" in text or type(err).__name__ == "DistBackendError" and "timeout" in text


def report_failure(err: BaseException, lost: bool, verdict=None) -> None:
    """Under torchrun, srun or the deepspeed launcher (each rank prints for itself): where a
    peer vanished or hangs, one survivor names it (zoo.run.roll_call; the others stay silent),
    or, where the roll call could not be held, each survivor says it lost a peer; a rank that
    failed on its own prints its traceback, then one line naming it, its host, the exit code
    and the error."""
    import socket
    import traceback

    from zoo.run.roll_call import named

    rank, host = os.environ.get("RANK", "?"), socket.gethostname()
    last = (str(err).strip().splitlines() or [""])[-1][:300]
    if lost:
        if verdict is not None and not verdict.namer:
            return  # another survivor names who went away
        gone = _peer_lost(err)
        if verdict is not None and verdict.missing:
            who = named(verdict.missing)
            why = (f"{who} went away (no answer to the survivors' roll call: killed, or its host lost)" if gone else
                   f"{who} did not answer within parallel.timeout_s (hung or stopped)")
            print(f"zoo: rank {rank} on {host}: {why}; the {verdict.answered} surviving rank(s) stop (exit code 1)"
                  + _restarts_left(), file=sys.stderr, flush=True)
            return
        why = "a peer rank went away" if gone else "a peer rank did not answer within parallel.timeout_s"
        print(f"zoo: rank {rank} on {host}: {why} ({type(err).__name__}: {last}); stopping (exit code 1): the rank "
              f"that failed first reports why", file=sys.stderr, flush=True)
        return
    traceback.print_exception(err)
    print(f"zoo: rank {rank} on {host} failed (exit code 1): {type(err).__name__}: {last}", file=sys.stderr, flush=True)


def _restarts_left() -> str:
    """What follows a lost peer's line in a job that restarts itself: a restart, or the end."""
    from zoo.run.attempts import current

    attempt = current()
    if not attempt.max_restarts:
        return ""
    if attempt.restarts_left:
        return f"; {attempt.launcher} restarts the job ({attempt.restarts_left} of {attempt.max_restarts} left)"
    return (f"; that was attempt {attempt.number + 1} of {attempt.number + 1}: {attempt.launcher}={attempt.max_restarts} "
            f"spent, the job ends (resume=auto goes on from its newest checkpoint)")


def _run(cfg: Config, run_dir: str, device: torch.device, clock, plan_record=None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    from zoo.config.validate import resolve_layout

    layout, _ = resolve_layout(cfg, world)
    run_path = agree_run_dir(run_dir)
    found = set(os.listdir(run_path)) if rank == 0 and run_path.is_dir() else set()
    lock = _lock_run_dir(run_path, rank)
    training = []
    try:
        _train(cfg, run_path, layout, device, training, clock, plan_record)
    except ZooError:
        if rank == 0 and not training:
            remove_new_entries(run_path, found)
        raise
    finally:
        if lock is not None:
            lock.release()


def remove_new_entries(run_path: Path, found: set) -> None:
    """A start refused before training leaves the run directory as it found it: what this
    start wrote there (config.yaml, topology.txt, tokenizer/, ...) is removed; what was
    there before (a resumed run's checkpoints and results) is never touched."""
    from zoo.run.lock import LOCK_NAME

    for name in set(os.listdir(run_path)) - found - {LOCK_NAME}:
        path = run_path / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def write_run_records(run_path: Path, recorded: dict, layout: Layout, topology: str, hosts, devices,
                      plan_record: Optional[dict] = None) -> None:
    """config.yaml (the config a resume continues), topology.txt and topology.png, written by
    rank 0 once this start has trained its first step: a start that failed before (a wrong
    layout, an out-of-memory first step) leaves the run's own config for the next resume. A
    config.yaml this start changes is kept beside it as config.previous.yaml. `plan_record`:
    parallel=auto's plan under an external launcher, appended to plans.jsonl (one line an attempt)."""
    from zoo.config.schema import to_yaml

    if plan_record is not None:
        with open(run_path / "plans.jsonl", "a") as f:
            f.write(json.dumps(plan_record) + "\n")
    config, text = run_path / "config.yaml", to_yaml(recorded)
    if config.is_file() and config.read_text() != text:
        os.replace(config, run_path / "config.previous.yaml")
    tmp = run_path / "config.yaml.tmp"
    tmp.write_text(text)
    os.replace(tmp, config)
    (run_path / "topology.txt").write_text(topology)
    if layout.world_size > 1:  # the same grid as a picture
        from zoo.observe.topology_picture import draw_topology

        draw_topology(layout, hosts, devices, run_path / "topology.png")


def _lock_run_dir(run_path: Path, rank: int):
    """Under torchrun, the deepspeed launcher or srun rank 0 owns the run and locks its
    directory (the local launcher's parent already holds it); every rank stops if it is taken."""
    from zoo.run.lock import HELD_ENV, RunDirLock

    lock, problem = None, [None]
    if rank == 0 and not os.environ.get(HELD_ENV):
        try:
            lock = RunDirLock(run_path).acquire()
        except RunDirError as err:
            problem = [str(err)]
    dist.broadcast_object_list(problem, src=0)
    if problem[0]:
        raise RunDirError(problem[0])
    return lock


def _train(cfg: Config, run_path: Path, layout: Layout, device: torch.device, training: list, clock,
           plan_record=None) -> None:
    """Start and run the training; `training` gets an entry once the start is over; `clock`
    (zoo.observe.startup) the start's phases."""
    rank = dist.get_rank()
    topology, hosts, devices = show_topology(layout, rank, device, cfg.verbose)
    from zoo.run.quiet import held_stdout

    with held_stdout(cfg.verbose):  # DeepSpeed's `Using topology: ...`
        grid = build_grid(layout)

    from zoo.families.registry import family
    from zoo.trainer import Trainer

    task = family(cfg.model.family).new_task(cfg, device, layout)
    task.prepare(run_path, rank)  # cached; the first rank to take the cache lock builds
    if rank == 0:
        print(f"zoo: {task.data_line()}", flush=True)
    dist.barrier()
    clock.mark("data")
    from zoo.engine import native as native_checkpoint
    from zoo.run.directory import check_space, expected_bytes

    problem = [None]
    if rank == 0:
        try:
            check_space(run_path, expected_bytes(task.num_params(), save_final=cfg.checkpoint.save_final,
                                                 checkpoints_kept=cfg.checkpoint.keep if cfg.checkpoint.every else 0,
                                                 native=native_checkpoint.enabled(cfg.checkpoint, layout)))
        except RunDirError as err:
            problem = [str(err)]
    dist.broadcast_object_list(problem, src=0)  # every rank stops, none waits in a collective
    if problem[0]:
        raise RunDirError(problem[0])
    if cfg.trainer.micro_batch_size == "auto":
        _find_micro_batch(cfg, layout, grid, task, device, rank)

    small_split = task.check_eval_split()  # refuses an empty one
    if small_split and rank == 0:
        print(f"zoo: warning: {small_split}", file=sys.stderr, flush=True)
    trainer = Trainer(cfg, layout, grid, task, run_path, device, startup=clock)  # a resume: "model", "resume"
    clock.mark("model")  # (already marked where a resume read a checkpoint)
    if rank == 0:  # written once the first step went through: a failed start leaves the run's own config
        trainer.on_first_step = lambda: write_run_records(run_path, task.recorded_config(), layout, topology, hosts,
                                                          devices, plan_record)
    training.append(True)
    try:
        trainer.fit()
        dist.barrier()
    finally:  # also when a signal stops the run
        trainer.close()
    # Every rank leaves together, after rank 0's last writes and its tracker's close: srun
    # ends the tasks still running a while after the first one exits (slurm/srun_ranks.sh).
    dist.barrier()

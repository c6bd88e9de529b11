"""Checkpoints in a layout-free format: save under one (tp, pp, dp, ZeRO) layout, resume
under any other, pipeline degree included, with the data position.

A checkpoint is a directory `checkpoints/step_NNNNNNN/` holding every rank's shard of the
weights and optimizer state (zoo.checkpoint.sharded: `shard-RRRRR.safetensors` and
`index-RRRRR.json`; each rank writes only what it holds and a resume reads only what it
needs), the merged index of every rank's boxes (`index.json` and `boxes.npy`, written once
at finish: zoo.checkpoint.merged_index), `rng.safetensors` (each rank's torch RNG state),
`state.json` (format, step, data position, optimizer step, LR schedule, loss scale, layout,
model shape) and
`checksums.json` (every file's size and digest, each rank's computed as it wrote).
Checkpoints of format 1 (per-stage files of whole tensors, zoo.checkpoint.format1) still
resume.

These files need no pickle to load: safetensors and JSON only. Writes go to a temporary
directory that is renamed into place, and `checkpoints/latest` moves only after that, so a
run killed while saving leaves the previous checkpoint usable. The restore is exact, bit
for bit, on any layout.

With `checkpoint.native` on (by default under ZeRO-3) a checkpoint also holds DeepSpeed's
per-rank files (zoo/engine/native.py): a resume on the very layout that wrote it reads them,
and every other layout reads the layout-free files.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist

from zoo.checkpoint import format1, merged_index, sharded
from zoo.checkpoint.verify import damage, newest_intact, write_checksums
from zoo.engine import native as native_checkpoint
from zoo.engine import state as engine_state
from zoo.run.errors import CheckpointError

FORMAT = "zoo-checkpoint-2"
FORMATS = (format1.FORMAT, FORMAT)  # what a resume reads


class PendingSave:
    """A checkpoint whose shards are being written: in a background thread (an asynchronous
    save: it first copies the parameters' state to host memory, which the optimizer's next
    step waits for, then writes the copies) or already, inline. `finish` completes it."""

    def __init__(self, job, *, tmp: Path, final: Path, periodic: bool, keep: int, background: bool):
        self.job, self.tmp, self.final, self.periodic, self.keep = job, tmp, final, periodic, keep
        self.stall_s, self.started = 0.0, time.perf_counter()  # stall_s: how long the save itself held the step
        self.waited_s = 0.0  # what the optimizer's next step waited for the staging copy
        self.written: Optional[dict] = None
        self.error: Optional[BaseException] = None
        self.staging: Optional[torch.Tensor] = None  # the host buffer it was staged in (kept for the next)
        self.state_json = ""  # state.json's text, and this rank's RNG state: written by finish
        self.rng: dict = {}  # this rank's RNG states (_rng_states)
        self.index_part: dict = {}  # this rank's boxes, for the merged index (merged_index.rank_part)
        self.native_written: dict = {}  # digests of the DeepSpeed files this rank verified at save
        self.staged = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(background,), name=f"zoo-save-{final.name}",
                                       daemon=True)
        if background:
            self.thread.start()
        else:
            self._run(False)

    def _run(self, stage: bool) -> None:
        try:
            if stage:
                self.job.stage_state()
                self.staged.set()
            self.written = self.job.run()
        except BaseException as err:  # reported to every rank by finish
            self.error = err
        finally:
            self.staged.set()
        self.seconds = time.perf_counter() - self.started

    def wait_staged(self) -> None:
        """Wait until the parameters' state is copied (before the optimizer changes it)."""
        if not self.staged.is_set():
            t0 = time.perf_counter()
            self.staged.wait()
            self.waited_s += time.perf_counter() - t0

    def state(self) -> int:
        """This rank's part: 0 written, 1 still writing, 2 failed."""
        return 1 if self.thread.is_alive() else (2 if self.error is not None else 0)


def save(engine, grid, ckpt_root: Path, *, step: int, consumed: int, meta: dict, keep: int,
         native: bool = False, name: Optional[str] = None, background: bool = False,
         staging: Optional[torch.Tensor] = None):
    """Write a checkpoint of this step (collective over all ranks); returns its directory.
    native: also DeepSpeed's per-rank files, for a fast resume on this layout. `name` (e.g.
    `best`) writes ckpt_root/name instead of step_N, which neither `latest` nor pruning touch.
    `background`: stage each rank's shard in host memory (`staging`: the buffer of the last
    such save, reused) and write it, in a thread; the optimizer's next step waits until the
    thread has copied what it changes. Returns a PendingSave (its `staging` buffer to reuse),
    which `finish` completes (collective) once written."""
    t0 = time.perf_counter()
    rank = dist.get_rank()
    periodic = name is None
    name = name or f"step_{step:07d}"
    tmp = ckpt_root / f".{name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    job = sharded.ShardWrite(engine, grid, tmp)
    if background:  # the buffers now (a forward changes them); the rest in the writer's thread
        staging = job.allocate(staging)
        job.stage_buffers()
    # What the step is, taken now; gathered and written by finish (no collective here).
    state = {"format": FORMAT, "step": step, "consumed": consumed, "optimizer_step": engine_state.optimizer_step(engine),
             "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
             "loss_scale": engine_state.saved_loss_scale(engine), "scaler_state": engine_state.scaler_state(engine),
             "skipped_steps": engine_state.skipped_steps(engine), "world_size": dist.get_world_size(), **meta}
    native_written = {}
    if native:  # DeepSpeed's files, each hashed by one rank (its own by name), not all by rank 0 at finish
        native_checkpoint.save(engine, tmp)
        dist.barrier()
        native_written = _own_digests(tmp, native_checkpoint.TAG, rank, dist.get_world_size())
    pending = PendingSave(job, tmp=tmp, final=ckpt_root / name, periodic=periodic, keep=keep, background=background)
    pending.native_written = native_written
    pending.staging, pending.rng = staging, _rng_states(_device_of(engine))
    pending.index_part = merged_index.rank_part(job.shard, job.entries)  # for the merged index, sent at finish
    pending.state_json = json.dumps(state, indent=1, default=str)  # as it is now: text, nothing shared with the engine
    if background:
        engine_state.before_next_optimizer_step(engine, pending.wait_staged)
        pending.stall_s = time.perf_counter() - t0
    return pending if background else finish(pending)


def finish(pending: PendingSave) -> Path:
    """Complete a checkpoint once every rank wrote its shard (collective: waits for this rank's
    writer): record the checksums, move it into place and `latest` to it. A rank whose write
    failed fails the checkpoint on every rank, `latest` untouched."""
    if pending.thread.ident is not None:  # started: a background write
        pending.thread.join()
    from safetensors.torch import save_file

    rank = dist.get_rank()
    _die_here_for_a_test(pending, rank)
    errors = [None] * dist.get_world_size()  # each rank's write error, or None (a few bytes each)
    dist.all_gather_object(errors, None if pending.error is None else f"{type(pending.error).__name__}: "
                                                                       f"{pending.error}")
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    root = pending.final.parent
    if failed:
        if rank == 0:
            shutil.rmtree(pending.tmp, ignore_errors=True)
        dist.barrier()
        latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
        raise CheckpointError(f"writing checkpoint {pending.final.name} failed on rank {failed[0][0]}: "
                              f"{failed[0][1]}; nothing of it was kept and checkpoints/latest still names "
                              f"{latest or 'no checkpoint'} (free space, or save to another hydra.run.dir)")
    # What rank 0 alone writes: each rank's file digests, RNG state and boxes (a few integers
    # each), gathered to it only; it merges the boxes into the one index a resume reads.
    parts = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(({**pending.written, **pending.native_written}, pending.rng, pending.index_part), parts, dst=0)
    dist.barrier()
    if rank == 0:
        digests = [written for written, _, _ in parts]
        save_file({f"{kind}rank_{i}": state for i, (_, rng, _) in enumerate(parts) for kind, state in rng.items()},
                  str(pending.tmp / "rng.safetensors"))
        merged_index.write(pending.tmp, [index for _, _, index in parts])
        (pending.tmp / "state.json").write_text(pending.state_json)
        write_checksums(pending.tmp, known={f: d for part in digests for f, d in part.items()})  # last: finished
        shutil.rmtree(pending.final, ignore_errors=True)
        os.replace(pending.tmp, pending.final)
        if pending.periodic:
            _write_atomic(root / "latest", pending.final.name + "\n")
            _prune(root, pending.keep)
    dist.barrier()
    return pending.final


DIE_IN_SAVE_ENV = "ZOO_TEST_DIE_IN_SAVE"  # STEP:RANK: that rank is killed in that step's save (first attempt)


def _die_here_for_a_test(pending: PendingSave, rank: int) -> None:
    """Tests of a rank lost while a checkpoint is written: its shard is on disk, the checkpoint
    not yet complete (no state.json, no checksums, not moved into place)."""
    wanted = os.environ.get(DIE_IN_SAVE_ENV)
    if not wanted or pending.final.name != f"step_{int(wanted.split(':')[0]):07d}" or rank != int(wanted.split(':')[1]):
        return
    from zoo.run.attempts import current

    if current().number == 0:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _device_of(engine) -> torch.device:
    """The device this rank's engine computes on (its parameters')."""
    return next(engine.module.parameters()).device


def _rng_states(device: torch.device) -> dict:
    """This rank's RNG states: the CPU generator's, and on CUDA its own device's (not every
    visible device's), as rng.safetensors keys them (rank_R, cuda_rank_R)."""
    states = {"": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda_"] = torch.cuda.get_rng_state(device)
    return states


def _own_digests(tmp: Path, subdir: str, rank: int, world: int) -> dict:
    """{relative path: {bytes, xxh3_64}} of the files under tmp/subdir that this rank verifies
    (zoo.checkpoint.verify.owner: its own by the rank in their names, and every world-th other)."""
    from zoo.checkpoint.verify import owner
    from zoo.run.checksums import manifest

    mine = manifest(tmp / subdir, keep=lambda name, position: owner(name, position, world) == rank)
    return {f"{subdir}/{name}": record for name, record in mine.items()}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def resolve(resume: str, run_dir: Path, key: str = "resume=",
            verify: Callable[[Path], Optional[str]] = damage) -> Tuple[Optional[Path], List[str]]:
    """(the checkpoint `resume` names, a line for each damaged one passed over): `auto` (the
    newest intact checkpoint of this run, or None when it has none), a checkpoint directory
    (refused when damaged), or a run directory (its newest intact checkpoint). Verified
    against the checksums recorded at save time (zoo.checkpoint.verify). `key`: how errors
    name `resume` (the config key, or nothing for a command's argument); `verify`: damage
    here, or zoo.checkpoint.verify.shared_damage bound to a resume's ranks, all of which call
    this alike."""
    if resume == "auto":
        return newest_intact(run_dir / "checkpoints", verify)
    root = Path(resume)
    if not root.exists():
        raise CheckpointError(f"{key}{resume}: no such checkpoint or run directory")
    if (root / "state.json").exists() or root.name.startswith("step_"):
        problem = verify(root)
        if problem is not None:
            raise CheckpointError(f"{key}{resume}: the checkpoint is damaged ({problem}); resume from another "
                                  f"checkpoint, or give its run directory to take the newest intact one")
        return root, []
    path, notes = newest_intact(root / "checkpoints" if (root / "checkpoints").is_dir() else root, verify)
    if path is None:
        raise CheckpointError(f"{key}{resume}: no checkpoint there (no state.json, no step_* directories)")
    return path, notes


def read_state(path: Path) -> dict:
    state = json.loads((path / "state.json").read_text())
    if state.get("format") not in FORMATS:
        raise CheckpointError(f"{path} is not a zoo checkpoint of a format this zoo reads ({', '.join(FORMATS)}; "
                              f"found {state.get('format')!r})")
    return state


def check_compatible(state: dict, meta: dict, path: Path) -> None:
    """Refuse a checkpoint of another model: the family and every shape field must match. A
    field a checkpoint lacks is one added to the shape after it was written, whose default,
    None, is what that checkpoint's model had (e.g. `vocab_real`, no padded vocabulary)."""
    if state.get("family") != meta.get("family"):
        raise CheckpointError(f"checkpoint {path} was written for model.family={state.get('family')} but this run "
                              f"builds model.family={meta.get('family')}; resume with model={state.get('family')}")
    written, now = state.get("shape"), meta.get("shape")
    if not _same(written, now):
        if isinstance(written, dict) and isinstance(now, dict):  # name only the fields that differ
            differ = sorted(k for k in written.keys() | now.keys() if written.get(k) != now.get(k))
            what = ", ".join(f"{k} {written.get(k)} (this run: {now.get(k)})" for k in differ)
        else:
            what = f"{written} (this run: {now})"
        raise CheckpointError(f"checkpoint {path} was written for another model shape: {what}; resume with the "
                              f"model settings it was written with")
    written, now = state.get("optimizer", "adamw"), meta.get("optimizer", "adamw")  # older checkpoints: AdamW
    if written != now:
        raise CheckpointError(f"checkpoint {path} holds optim={written}'s state but this run uses optim={now}; resume "
                              f"with optim={written}, or export the weights (python -m zoo.export) and start from "
                              f"them with model.init_from")


def _same(written, now) -> bool:
    if isinstance(written, dict) and isinstance(now, dict):
        return all(written.get(k) == now.get(k) for k in written.keys() | now.keys())
    return written == now


def load(engine, grid, path: Path, state: dict, native_key: Optional[dict] = None) -> str:
    """Restore weights, optimizer, LR schedule, loss scale and RNG from `path` (whose
    state.json is `state`, from read_state) into this rank's engine, whatever layout wrote
    it. Returns how it was read: "native" (DeepSpeed's per-rank shards: the layout that wrote
    it, native_key, is this one), "layout-free" (the sharded files) or "format-1 layout-free"."""
    if native_key is not None and native_checkpoint.usable(path, state, native_key):
        _refuse_pickles(path)
        try:
            native_checkpoint.load(engine, path)
        except pickle.UnpicklingError as err:
            raise CheckpointError(f"rank {dist.get_rank()} refused to load {path / native_checkpoint.TAG}: it holds "
                                  f"pickled objects outside the allowlist of plain data ({err}); resume with "
                                  f"checkpoint.native=false to read the layout-free safetensors files",
                                  rank_local=True) from None
        how = "native"
    else:
        if state["format"] == format1.FORMAT:
            format1.load(engine, path, state)
            how = "format-1 layout-free"
        else:
            sharded.read(engine, path, state["optimizer_step"])
            how = "layout-free"
        engine_state.set_optimizer_step(engine, state["optimizer_step"])
        if engine.lr_scheduler is not None and state.get("lr_scheduler"):
            engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if state.get("loss_scale") is not None:
            engine_state.set_loss_scale(engine, state["loss_scale"])
        engine_state.set_scaler_state(engine, state.get("scaler_state") or {})
    engine_state.set_skipped_steps(engine, state.get("skipped_steps", 0))
    if engine.lr_scheduler is not None:
        # The schedule's position is loaded, but the optimizer's learning rates are the ones
        # of the run that wrote the checkpoint (whose schedule may have been shorter): step the
        # schedule to its position, so the next update uses this run's rate for it.
        engine.lr_scheduler.step(engine.lr_scheduler.last_batch_iteration)
    from safetensors import safe_open

    with safe_open(str(path / "rng.safetensors"), framework="pt") as rngs:  # this rank's states only
        keys = set(rngs.keys())
        same_world = sum(k.startswith("rank_") for k in keys) == dist.get_world_size()
        rank = dist.get_rank() if same_world else 0
        torch.set_rng_state(rngs.get_tensor(f"rank_{rank}"))
        device = _device_of(engine)
        if device.type == "cuda" and f"cuda_rank_{rank}" in keys:  # the rank's own device's generator
            torch.cuda.set_rng_state(rngs.get_tensor(f"cuda_rank_{rank}"), device)
    engine_state.set_global_steps(engine, state["step"])
    return how


def _refuse_pickles(path: Path) -> None:
    """Before DeepSpeed reads a native file, the ranks check all of them (each its share) with
    the weights-only unpickler and agree: a hostile file of any rank stops every rank alike,
    with one line, before any rank waits in a collective its peer will never reach."""
    rank, world = dist.get_rank(), dist.get_world_size()
    found = [None] * world
    dist.all_gather_object(found, native_checkpoint.refused_files(path, rank, world))
    refused = [line for lines in found for line in lines]
    if refused:
        more = f" (and {len(refused) - 1} more file(s))" if len(refused) > 1 else ""
        raise CheckpointError(f"refused to load the native checkpoint {path / native_checkpoint.TAG}: {refused[0]}"
                              f"{more}; it holds pickled objects outside the allowlist of plain data; resume with "
                              f"checkpoint.native=false to read the layout-free safetensors files")

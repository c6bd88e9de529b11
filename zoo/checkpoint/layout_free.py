"""Checkpoints in a layout-free format: save under one (tp, pp, dp, ZeRO) layout, resume
under any other.

A checkpoint is a directory `checkpoints/step_NNNNNNN/` holding, per pipeline stage,
`model-SSS.safetensors` (full fp32 master weights and buffers under the plain model's
names) and `optim-SSS.safetensors` (AdamW's `exp_avg.NAME` / `exp_avg_sq.NAME`, full
shape), plus `rng.safetensors` (each rank's torch RNG state) and `state.json` (step, data
position, optimizer step, LR schedule, loss scale, layout, model shape). Each stage's
(dp 0, tp 0) rank writes its own files, so stages write in parallel; tensor-parallel
shards are gathered over the tp group and ZeRO partitions over the dp group first.

These files need no pickle to load: safetensors and JSON only. Every rank reads just the tensors it
holds and slices its tensor-parallel shard. Writes go to a temporary directory that is
renamed into place, and `checkpoints/latest` moves only after that, so a run killed while
saving leaves the previous checkpoint usable. Same layout: the restore is exact, bit for bit.

With `checkpoint.native` on (by default under ZeRO-3) a checkpoint also holds DeepSpeed's per-rank files
(zoo/native_checkpoint.py): a resume on the very layout that wrote it reads only its own
shards from them, and every other layout reads the layout-free files.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from zoo.checkpoint import native as native_checkpoint
from zoo.checkpoint.verify import damage, newest_intact, write_checksums
from zoo.errors import CheckpointError
from zoo.parallel.names import plain_name
from zoo.parallel.sharding import gather_full, local_shard
from zoo.parallel.topology import tp_group

FORMAT = "zoo-checkpoint-1"
ADAM_KEYS = ("exp_avg", "exp_avg_sq")


def state_keys(engine) -> Tuple[str, ...]:
    """The per-parameter optimizer state a checkpoint keeps: AdamW's two moments, or SGD's
    momentum buffer (none without momentum)."""
    base = _base_optimizer(engine)
    if isinstance(base, torch.optim.SGD):
        return ("momentum_buffer",) if any(g.get("momentum", 0) for g in base.param_groups) else ()
    return ADAM_KEYS


def _base_optimizer(engine):
    opt = engine.optimizer
    return opt if isinstance(opt, torch.optim.Optimizer) and not hasattr(opt, "optimizer") else opt.optimizer


def _ensure_optimizer_state(engine) -> None:
    """Make AdamW's state readable and writable through the parameters.

    ZeRO optimizers and the bf16 optimizer create their state at the first step; some link each
    parameter to its fragment of it then; they link after the first parameter group's step,
    before the later groups have state, and never again. So: create any missing state and
    link all groups anew."""
    opt, base = engine.optimizer, _base_optimizer(engine)
    if base is opt:  # no ZeRO, fp32: state is read per parameter, zeros where missing
        return
    # ZeRO-3 keeps its flat fp32 partitions outside the base optimizer's groups between steps.
    flats = getattr(opt, "fp32_partitioned_groups_flat", None) or [p for g in base.param_groups for p in g["params"]]
    keys, adam = state_keys(engine), not isinstance(base, torch.optim.SGD)
    for flat in flats:
        state = base.state[flat]
        if adam:
            state.setdefault("step", torch.tensor(0.0))
        for key in keys:  # SGD's first step from a zero buffer equals its own start (buffer = grad)
            state.setdefault(key, torch.zeros_like(flat))
    if hasattr(opt, "_lazy_init_hp_params_optimizer_state"):  # ZeRO-3 reads its flat state directly
        opt._hp_optimizer_states_linked = False
        opt._lazy_init_hp_params_optimizer_state()


def _unique_params(module: nn.Module) -> Iterator[Tuple[str, nn.Parameter]]:
    seen = set()
    for name, p in module.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield name, p


def _local_full(engine, p: nn.Parameter, key: Optional[str]) -> torch.Tensor:
    """This tp rank's shard of the fp32 master weight (key None) or an AdamW state, with the
    ZeRO partitions gathered (collective over the dp group under ZeRO)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    if hasattr(p, "ds_id") or hasattr(p, "_hp_mapping"):
        t = safe_get_full_fp32_param(p) if key is None else safe_get_full_optimizer_state(p, key)
        return t.reshape(p.ds_shape if hasattr(p, "ds_id") else p.shape)
    if key is None:
        return p.detach()
    state = _base_optimizer(engine).state.get(p, {})
    return state[key] if key in state else torch.zeros_like(p)


def _full(engine, p: nn.Parameter, key: Optional[str], group) -> torch.Tensor:
    return gather_full(_local_full(engine, p, key).float(), getattr(p, "tp_shard", None), group).cpu()


def _optimizer_step(engine) -> int:
    for state in _base_optimizer(engine).state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def save(engine, grid, ckpt_root: Path, *, step: int, consumed: int, meta: dict, keep: int,
         native: bool = False, name: Optional[str] = None) -> Path:
    """Write a checkpoint of this step (collective over all ranks); returns its directory.
    native: also DeepSpeed's per-rank files, for a fast resume on this layout. `name` (e.g.
    `best`) writes ckpt_root/name instead of step_N, which neither `latest` nor pruning touch."""
    from safetensors.torch import save_file

    rank, group = dist.get_rank(), tp_group(grid)
    stage = grid.get_stage_id()
    _ensure_optimizer_state(engine)
    periodic = name is None
    name = name or f"step_{step:07d}"
    tmp = ckpt_root / f".{name}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    writer = grid.get_data_parallel_rank() == 0 and grid.get_slice_parallel_rank() == 0
    weights: Dict[str, torch.Tensor] = {}
    optim: Dict[str, torch.Tensor] = {}
    for pname, p in _unique_params(engine.module):
        plain = plain_name(pname)
        weights[plain] = _full(engine, p, None, group)
        for key in state_keys(engine):
            optim[f"{key}.{plain}"] = _full(engine, p, key, group)
    for bname, b in engine.module.named_buffers():
        if bname.rsplit(".", 1)[-1] in {"running_mean", "running_var", "num_batches_tracked"}:
            weights[plain_name(bname)] = b.detach().cpu().clone()
    if writer:
        save_file(weights, str(tmp / f"model-{stage:03d}.safetensors"))
        save_file(optim, str(tmp / f"optim-{stage:03d}.safetensors"))
    rngs = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, torch.get_rng_state())
    if rank == 0:
        save_file({f"rank_{i}": r for i, r in enumerate(rngs)}, str(tmp / "rng.safetensors"))
        state = {"format": FORMAT, "step": step, "consumed": consumed, "optimizer_step": _optimizer_step(engine),
                 "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
                 "loss_scale": getattr(engine.optimizer, "cur_scale", None), **meta}
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
    if native:
        native_checkpoint.save(engine, tmp)
    dist.barrier()
    final = ckpt_root / name
    if rank == 0:
        write_checksums(tmp)  # last: a directory without it never finished
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        if periodic:
            _write_atomic(ckpt_root / "latest", name + "\n")
            _prune(ckpt_root, keep)
    dist.barrier()
    return final


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


def resolve(resume: str, run_dir: Path) -> Tuple[Optional[Path], List[str]]:
    """(the checkpoint `resume` names, a line for each damaged one passed over): `auto` (the
    newest intact checkpoint of this run, or None when it has none), a checkpoint directory
    (refused when damaged), or a run directory (its newest intact checkpoint). Verified
    against the checksums recorded at save time (zoo.checkpoint.verify)."""
    if resume == "auto":
        return newest_intact(run_dir / "checkpoints")
    root = Path(resume)
    if not root.exists():
        raise CheckpointError(f"resume={resume}: no such checkpoint or run directory")
    if (root / "state.json").exists() or root.name.startswith("step_"):
        problem = damage(root)
        if problem is not None:
            raise CheckpointError(f"resume={resume}: the checkpoint is damaged ({problem}); resume from another "
                                  f"checkpoint, or give its run directory to take the newest intact one")
        return root, []
    path, notes = newest_intact(root / "checkpoints" if (root / "checkpoints").is_dir() else root)
    if path is None:
        raise CheckpointError(f"resume={resume}: no checkpoint there (no state.json, no step_* directories)")
    return path, notes


def read_state(path: Path) -> dict:
    state = json.loads((path / "state.json").read_text())
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a zoo checkpoint of format {FORMAT} (found {state.get('format')!r})")
    return state


def check_compatible(state: dict, meta: dict, path: Path) -> None:
    """Refuse a checkpoint of another model: the family and every shape field must match. A
    field a checkpoint lacks is one added to the shape after it was written, whose default,
    None, is what that checkpoint's model had (e.g. `vocab_real`, no padded vocabulary)."""
    for key in ("family", "shape"):
        if not _same(state.get(key), meta.get(key)):
            raise CheckpointError(f"checkpoint {path} was written for model {key} {state.get(key)} but this run "
                                  f"builds {meta.get(key)}; resume with the same model settings")
    written, now = state.get("optimizer", "adamw"), meta.get("optimizer", "adamw")  # older checkpoints: AdamW
    if written != now:
        raise CheckpointError(f"checkpoint {path} holds optim={written}'s state but this run uses optim={now}; resume "
                              f"with optim={written}, or export the weights (python -m zoo.export) and start from "
                              f"them with model.init_from")


def _same(written, now) -> bool:
    if isinstance(written, dict) and isinstance(now, dict):
        return all(written.get(k) == now.get(k) for k in written.keys() | now.keys())
    return written == now


class _Tensors:
    """Lazy access to the tensors of all stage files of a checkpoint."""

    def __init__(self, path: Path, kind: str):
        from safetensors import safe_open

        self.handles = [safe_open(str(f), framework="pt") for f in sorted(path.glob(f"{kind}-*.safetensors"))]
        self.where = {k: h for h in self.handles for k in h.keys()}

    def get(self, key: str) -> torch.Tensor:
        if key not in self.where:
            raise CheckpointError(f"the checkpoint has no tensor {key!r}: it was written for another model")
        return self.where[key].get_tensor(key)


def load(engine, grid, path: Path, state: dict, native_key: Optional[dict] = None) -> str:
    """Restore weights, optimizer, LR schedule, loss scale and RNG from `path` (whose
    state.json is `state`, from read_state) into this rank's engine, whatever layout wrote
    it. Returns how it was read: "native" (DeepSpeed's per-rank shards: the layout that wrote
    it, native_key, is this one) or "layout-free"."""
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
        _load_layout_free(engine, path, state)
        how = "layout-free"
    if engine.lr_scheduler is not None:
        # The schedule's position is loaded, but the optimizer's learning rates are the ones
        # of the run that wrote the checkpoint (whose schedule may have been shorter): step the
        # schedule to its position, so the next update uses this run's rate for it.
        engine.lr_scheduler.step(engine.lr_scheduler.last_batch_iteration)
    from safetensors.torch import load_file

    rngs = load_file(str(path / "rng.safetensors"))
    key = f"rank_{dist.get_rank()}" if len(rngs) == dist.get_world_size() else "rank_0"
    torch.set_rng_state(rngs[key])
    engine.global_steps = state["step"]
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


@torch.no_grad()
def _load_layout_free(engine, path: Path, state: dict) -> None:
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    _ensure_optimizer_state(engine)
    weights, optim = _Tensors(path, "model"), _Tensors(path, "optim")
    base = _base_optimizer(engine)
    device = next(engine.module.parameters()).device
    for pname, p in _unique_params(engine.module):
        plain = plain_name(pname)
        w = local_shard(weights.get(plain), p).to(device)
        moments = {k: local_shard(optim.get(f"{k}.{plain}"), p).to(device) for k in state_keys(engine)}
        if hasattr(p, "ds_id"):  # ZeRO-3: the fp32 partitions, then the model's partitions
            safe_set_full_fp32_param(p, w)
            for k, v in moments.items():
                safe_set_full_optimizer_state(p, v, k)
            with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
                p.data.copy_(w.to(p.dtype))
        elif hasattr(p, "_hp_mapping"):  # ZeRO-1/2 and the bf16 optimizer
            safe_set_full_fp32_param(p, w)
            for k, v in moments.items():
                safe_set_full_optimizer_state(p, v, k)
            p.data.copy_(w.to(p.dtype))
        else:
            p.data.copy_(w.to(p.dtype))
            step = {} if isinstance(base, torch.optim.SGD) else {"step": torch.tensor(float(state["optimizer_step"]))}
            base.state[p] = {**step, **moments}
    for bname, b in engine.module.named_buffers():
        key = plain_name(bname)
        if key in weights.where:
            b.copy_(weights.get(key))
    for s in base.state.values():
        if "step" in s:
            s["step"] = torch.full_like(s["step"], state["optimizer_step"]) if torch.is_tensor(s["step"]) \
                else state["optimizer_step"]
    if engine.lr_scheduler is not None and state.get("lr_scheduler"):
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    if state.get("loss_scale") is not None and hasattr(engine.optimizer, "cur_scale"):
        engine.optimizer.cur_scale = state["loss_scale"]

"""A run's final weights (the plain model's full state under its own names, the family and
shape in each file's metadata), written tensor by tensor in transformers' layout: one
`model.safetensors` without pipeline parallelism, else one file per pipeline stage,
`model-0000S-of-0000P.safetensors`, with `model.safetensors.index.json` mapping each tensor to
its file. Each stage's (tp 0, dp 0) rank writes its stage's file: each tensor is gathered over
the stage's tensor-parallel group (and ZeRO-3's data-parallel group), written and freed
before the next, so no rank holds more than one full tensor besides its share, and no stage's
weights leave it. `load_run_weights` reads either form back."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from zoo.checkpoint.sharded import state_buffers, unique_params, writer_stages
from zoo.checkpoint.stream_write import StreamWriter
from zoo.engine.state import full_shape, gathered
from zoo.parallel.names import plain_name
from zoo.parallel.sharding import gather_full
from zoo.parallel.topology import replica_coords, tp_group

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _entries(engine, grid, writers) -> List[Tuple[str, Tuple[int, ...], torch.dtype]]:
    """This stage's tensors that it writes, in order: (plain name, full shape, dtype)."""
    from zoo.checkpoint.boxes import full_shape as unsharded

    stage, out = grid.get_stage_id(), []
    for name, p in unique_params(engine.module):
        plain = plain_name(name)
        if writers[plain] == stage:
            out.append((plain, unsharded(tuple(full_shape(p)), getattr(p, "tp_shard", None)), torch.float32))
    for name, b in state_buffers(engine.module).items():
        if writers[name] == stage:
            out.append((name, tuple(b.shape), b.dtype))
    return out


def weight_files(run_dir: Path) -> List[Path]:
    """The files of a run's final weights (empty where there are none)."""
    if (run_dir / INDEX).is_file():
        index = json.loads((run_dir / INDEX).read_text())
        return [run_dir / f for f in sorted(set(index["weight_map"].values()))]
    return [run_dir / SINGLE] if (run_dir / SINGLE).is_file() else []


@torch.no_grad()
def write_final(engine, grid, run_dir: Path, meta: dict) -> List[Path]:
    """Write the final weights into `run_dir` (collective over all ranks); returns the files."""
    rank, pp = dist.get_rank(), grid.get_pipe_parallel_world_size()
    writers = writer_stages(engine, grid)
    stage = grid.get_stage_id()
    first_rank = grid.get_slice_parallel_rank() == 0 and replica_coords(grid)[0] == 0
    mine = _entries(engine, grid, writers)
    name = SINGLE if pp == 1 else f"model-{stage + 1:05d}-of-{pp:05d}.safetensors"
    metadata = {"family": meta["family"], "shape": json.dumps(meta["shape"])}
    writer = None
    if first_rank:
        for stale in [run_dir / SINGLE, run_dir / INDEX] if rank == 0 else []:
            stale.unlink(missing_ok=True)  # an earlier run's weights in the other form (a resumed run)
        writer = StreamWriter(run_dir / f".{name}.tmp", [(n, d, s) for n, s, d in mine], metadata=metadata)
    params: Dict[str, torch.nn.Parameter] = {plain_name(n): p for n, p in unique_params(engine.module)}
    buffers = state_buffers(engine.module)
    group = tp_group(grid)
    for tensor, shape, dtype in mine:  # every rank of the stage: the gathers are collective
        if tensor in params:
            p = params[tensor]
            with gathered([p]):  # a copy: ZeRO-3 frees (and reuses) the gathered storage on exit
                t = gather_full(p.detach().float(), getattr(p, "tp_shard", None), group).cpu().clone()
        else:
            t = buffers[tensor].detach().cpu()
        if writer is not None:
            writer.write(tensor, t.to(dtype).reshape(shape))
        del t
    if writer is not None:
        record = writer.close()
        (run_dir / f".{name}.tmp").replace(run_dir / name)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, (name, [n for n, _, _ in mine], record["bytes"]) if writer is not None else None)
    if rank == 0 and pp > 1:
        weight_map = {tensor: file for part in found if part for file, names, _ in [part] for tensor in names}
        total = sum(part[2] for part in found if part)
        (run_dir / INDEX).write_text(json.dumps({"metadata": {**metadata, "total_size": total},
                                                 "weight_map": weight_map}, indent=1) + "\n")
    dist.barrier()
    return weight_files(run_dir)


def load_run_weights(run_dir: Path) -> Dict[str, torch.Tensor]:
    """A run's final weights as one state dict (small models: tests, the end-of-run sample)."""
    from safetensors.torch import load_file

    files = weight_files(run_dir)
    if not files:
        raise FileNotFoundError(f"{run_dir} holds no final weights ({SINGLE} or {INDEX})")
    state: Dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state

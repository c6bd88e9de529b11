"""A run's final weights, `model.safetensors` (the plain model's full state, the family and
shape in its metadata), written tensor by tensor: each tensor is gathered over its stage's
tensor-parallel group (and ZeRO-3's data-parallel group) by its own stage, sent to rank 0,
written there (zoo.checkpoint.stream_write) and freed before the next, so no rank holds more
than one full tensor besides its share."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

from zoo.checkpoint.sharded import _unique_params, _writers, state_buffers
from zoo.checkpoint.stream_write import StreamWriter
from zoo.engine.state import full_shape, gathered
from zoo.parallel.names import plain_name
from zoo.parallel.sharding import gather_full
from zoo.parallel.topology import tp_group


def _entries(engine, grid, writers) -> List[Tuple[str, Tuple[int, ...], torch.dtype]]:
    """This stage's tensors that it writes, in order: (plain name, full shape, dtype)."""
    from zoo.checkpoint.boxes import full_shape as unsharded

    stage, out = grid.get_stage_id(), []
    for name, p in _unique_params(engine.module):
        plain = plain_name(name)
        if writers[plain] == stage:
            out.append((plain, unsharded(tuple(full_shape(p)), getattr(p, "tp_shard", None)), torch.float32))
    for name, b in state_buffers(engine.module).items():
        if writers[name] == stage:
            out.append((name, tuple(b.shape), b.dtype))
    return out


@torch.no_grad()
def write_final(engine, grid, path: Path, meta: dict) -> None:
    """Write the final weights to `path` on rank 0 (collective over all ranks)."""
    rank = dist.get_rank()
    writers = _writers(engine, grid)
    stage, first_rank = grid.get_stage_id(), grid.get_slice_parallel_rank() == 0 and grid.get_data_parallel_rank() == 0
    mine = _entries(engine, grid, writers)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, (rank, stage, first_rank, [(n, s, str(d)) for n, s, d in mine] if first_rank else []))
    sender = {st: r for r, st, first, _ in found if first}  # each stage's (tp 0, dp 0) rank
    order = [(st, n, tuple(s), getattr(torch, d.split(".")[-1])) for r, st, first, entries in sorted(found, key=lambda f: f[1])
             if first for n, s, d in entries]
    writer = None
    if rank == 0:
        tmp = path.with_suffix(".tmp")
        writer = StreamWriter(tmp, [(n, d, s) for _, n, s, d in order],
                              metadata={"family": meta["family"], "shape": json.dumps(meta["shape"])})
    params: Dict[str, torch.nn.Parameter] = {plain_name(n): p for n, p in _unique_params(engine.module)}
    buffers = state_buffers(engine.module)
    group = tp_group(grid)
    for owner, name, shape, dtype in order:
        t = None
        if owner == stage:
            if name in params:
                p = params[name]
                with gathered([p]):  # a copy: ZeRO-3 frees (and reuses) the gathered storage on exit
                    t = gather_full(p.detach().float(), getattr(p, "tp_shard", None), group).cpu().clone()
            else:
                t = buffers[name].detach().cpu()
        if rank == 0:
            if sender[owner] != 0:
                t = torch.empty(shape, dtype=dtype)
                dist.recv(t, src=sender[owner])
            writer.write(name, t.to(dtype).reshape(shape))
        elif owner == stage and sender[owner] == rank:
            dist.send(t.to(dtype).contiguous(), dst=0)
        del t
    if rank == 0:
        writer.close()
        tmp.replace(path)
    dist.barrier()

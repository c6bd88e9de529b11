"""The reader of format-1 checkpoints (`zoo-checkpoint-1`, written before the sharded format):
per pipeline stage `model-SSS.safetensors` (full fp32 weights and buffers under the plain
model's names) and `optim-SSS.safetensors` (`KEY.NAME`: each optimizer state, full shape).
Every rank reads the tensors of its parameters and slices its tensor-parallel shard; the
values go into the engine through zoo.engine.state, as in any layout."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Tuple

import torch

from zoo.checkpoint.sharded import unique_params
from zoo.engine import state as engine_state
from zoo.parallel.names import plain_name
from zoo.parallel.sharding import local_shard
from zoo.run.errors import CheckpointError

FORMAT = "zoo-checkpoint-1"


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


@torch.no_grad()
def load(engine, path: Path, state: dict) -> None:
    engine_state.ensure_optimizer_state(engine)
    weights, optim = _Tensors(path, "model"), _Tensors(path, "optim")
    device = next(engine.module.parameters()).device
    keys = engine_state.state_keys(engine)
    for pname, p in unique_params(engine.module):
        plain = plain_name(pname)
        w = local_shard(weights.get(plain), p).to(device)
        moments = {k: local_shard(optim.get(f"{k}.{plain}"), p).to(device) for k in keys}
        engine_state.set_values(engine, p, w, moments, step=state["optimizer_step"])
    for bname, b in engine.module.named_buffers():
        key = plain_name(bname)
        if key in weights.where:
            b.copy_(weights.get(key))


def stage_tensors(path: Path, kind: str = "model") -> Iterator[Tuple[str, torch.Tensor]]:
    """(plain name, full tensor) of every tensor of a format-1 checkpoint's `kind` files, one at a time."""
    for f in sorted(path.glob(f"{kind}-*.safetensors")):
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                yield key, fh.get_tensor(key)

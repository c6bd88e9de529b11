"""Layout-independent initialisation.

Every parameter's full (unsharded) value is a pure function of (seed, parameter name):
the full tensor is generated in blocks of rows along dim 0, each block from its own
generator seeded by (seed, name, block index). A tensor-parallel shard generates only the
blocks it needs (or, for a shard along dim 1, each block in turn and keeps its columns),
so it equals the matching slice of the tp=1 tensor exactly while the full tensor is never
held in memory. Same seed, same full weights, whatever the layout.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Optional

import torch
import torch.nn as nn

from zoo.parallel.sharding import ShardSpec, shard_rows

ROWS_PER_BLOCK = 64


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _normal_rows(seed: int, name: str, start: int, stop: int, row_shape, std: float) -> torch.Tensor:
    """Rows [start, stop) of the full N(0, std) tensor named `name`."""
    out = []
    first, last = start // ROWS_PER_BLOCK, (stop - 1) // ROWS_PER_BLOCK
    for b in range(first, last + 1):
        g = torch.Generator().manual_seed(_block_seed(seed, name, b))
        block = torch.randn(ROWS_PER_BLOCK, *row_shape, generator=g) * std
        lo = max(start, b * ROWS_PER_BLOCK) - b * ROWS_PER_BLOCK
        hi = min(stop, (b + 1) * ROWS_PER_BLOCK) - b * ROWS_PER_BLOCK
        out.append(block[lo:hi])
    return torch.cat(out)


def full_shape_of(param: torch.Tensor) -> tuple:
    spec: Optional[ShardSpec] = getattr(param, "tp_shard", None)
    shape = list(param.shape)
    if spec is not None:
        shape[spec.dim] *= spec.world
    return tuple(shape)


def normal_param(param: torch.Tensor, name: str, seed: int, std: float) -> torch.Tensor:
    """The value of `param` (a shard or a whole tensor) under the layout-free N(0, std) init."""
    spec: Optional[ShardSpec] = getattr(param, "tp_shard", None)
    full = full_shape_of(param)
    if spec is None:
        return _normal_rows(seed, name, 0, full[0], full[1:], std)
    if spec.dim == 0:
        return torch.cat([_normal_rows(seed, name, a, b, full[1:], std) for a, b in shard_rows(spec, full[0])])
    cols = shard_rows(spec, full[spec.dim])
    pieces = []
    for start in range(0, full[0], ROWS_PER_BLOCK):
        rows = _normal_rows(seed, name, start, min(full[0], start + ROWS_PER_BLOCK), full[1:], std)
        pieces.append(torch.cat([rows.narrow(spec.dim, a, b - a) for a, b in cols], dim=spec.dim))
    return torch.cat(pieces)


@torch.no_grad()
def init_parameters(module: nn.Module, seed: int, std_of: Callable[[str], Optional[float]],
                    prefix: str = "", skip: Callable[[torch.Tensor], bool] = lambda p: False) -> None:
    """Fill every parameter of `module` (names relative to the full model via `prefix`).

    `std_of(name)` gives the std of a normal init, or None for biases (zeros) and norm
    weights (ones). Tied parameters are filled once, under their first name; `skip(p)`:
    parameters filled already (a tied one whose owner was built first).
    """
    seen = set()
    for name, p in module.named_parameters(prefix=prefix.rstrip("."), remove_duplicate=True):
        if id(p) in seen or skip(p):
            continue
        seen.add(id(p))
        std = std_of(name)
        if std is not None:
            p.copy_(normal_param(p, name, seed, std).to(p.dtype))
        elif name.endswith("bias") or p.dim() > 1:
            p.zero_()
        else:
            p.fill_(1.0)

"""Layout-independent initialisation.

Every parameter's full (unsharded) value is a pure function of (seed, parameter name): the
full tensor is generated in tiles of ROWS_PER_BLOCK rows along dim 0 by COLS_PER_TILE columns
along dim 1 (a 1-D tensor: blocks of rows), each tile from its own generator seeded by (seed,
name, row block, column tile). A tensor-parallel shard generates only the tiles it overlaps,
along dim 0 (column-parallel weights, vocabulary shards) and along dim 1 (row-parallel
weights) alike, so it equals the matching slice of the tp=1 tensor exactly, the full tensor
is never held, and a rank's work is its share plus at most a tile's width at each edge
(before, a dim-1 shard drew every column of the full tensor and kept 1/tp of them: its work
grew with tp). Same seed, same full weights, whatever the layout.
"""
from __future__ import annotations

import hashlib
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn

from zoo.parallel.sharding import ShardSpec, shard_rows

ROWS_PER_BLOCK = 64
COLS_PER_TILE = 256


def _tile_seed(seed: int, name: str, block: int, tile: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{block}/{tile}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _normal_region(seed: int, name: str, rows: Tuple[int, int], cols: Optional[Tuple[int, int]], full: tuple,
                   std: float) -> torch.Tensor:
    """Rows [rows) and columns [cols) (None: a 1-D tensor) of the full N(0, std) tensor `name`."""
    out = []
    start, stop = rows
    for b in range(start // ROWS_PER_BLOCK, (stop - 1) // ROWS_PER_BLOCK + 1):
        lo = max(start, b * ROWS_PER_BLOCK) - b * ROWS_PER_BLOCK
        hi = min(stop, (b + 1) * ROWS_PER_BLOCK) - b * ROWS_PER_BLOCK
        if cols is None:
            g = torch.Generator().manual_seed(_tile_seed(seed, name, b, 0))
            out.append((torch.randn(ROWS_PER_BLOCK, generator=g) * std)[lo:hi])
            continue
        tiles: List[torch.Tensor] = []
        for t in range(cols[0] // COLS_PER_TILE, (cols[1] - 1) // COLS_PER_TILE + 1):
            width = min(COLS_PER_TILE, full[1] - t * COLS_PER_TILE)
            g = torch.Generator().manual_seed(_tile_seed(seed, name, b, t))
            tile = torch.randn(ROWS_PER_BLOCK, width, *full[2:], generator=g) * std
            a = max(cols[0], t * COLS_PER_TILE) - t * COLS_PER_TILE
            z = min(cols[1], t * COLS_PER_TILE + width) - t * COLS_PER_TILE
            tiles.append(tile[lo:hi, a:z])
        out.append(torch.cat(tiles, dim=1))
    return torch.cat(out)


def full_shape_of(param: torch.Tensor) -> tuple:
    spec: Optional[ShardSpec] = getattr(param, "tp_shard", None)
    shape = list(param.shape)
    if spec is not None:
        shape[spec.dim] *= spec.world
    return tuple(shape)


def normal_param(param: torch.Tensor, name: str, seed: int, std: float) -> torch.Tensor:
    """The value of `param` (a shard or a whole tensor) under the layout-free N(0, std) init:
    only the tiles the shard overlaps are drawn."""
    spec: Optional[ShardSpec] = getattr(param, "tp_shard", None)
    full = full_shape_of(param)
    every_col = None if len(full) == 1 else (0, full[1])
    if spec is None:
        return _normal_region(seed, name, (0, full[0]), every_col, full, std)
    if spec.dim == 0:
        return torch.cat([_normal_region(seed, name, (a, b), every_col, full, std)
                          for a, b in shard_rows(spec, full[0])])
    if spec.dim != 1:
        raise ValueError(f"{name}: a shard along dim {spec.dim} has no layout-free init (dims 0 and 1 have)")
    return torch.cat([_normal_region(seed, name, (0, full[0]), (a, b), full, std)
                      for a, b in shard_rows(spec, full[1])], dim=1)


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

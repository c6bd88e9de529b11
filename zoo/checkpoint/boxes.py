"""Where a rank's piece of a tensor sits in the full tensor, as boxes (an offset and a length
per dimension): the arithmetic of the sharded checkpoint.

A rank holds a flat range of its tensor-parallel shard (a ZeRO partition or fragment; the
whole shard where nothing partitions it), and the shard is `ShardSpec`'s cut of the full
tensor (zoo.parallel.sharding). A contiguous flat range of an N-d tensor is a few boxes,
each contiguous in the flat order; a box of the shard is one box of the full tensor per
chunk it crosses (a fused [q; k; v] shard crosses three). Saved pieces and the pieces a
resume needs are both such boxes of the full tensor, so any layout reads any other's by
intersecting them.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from zoo.parallel.sharding import ShardSpec, shard_rows

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, sizes), one entry per dimension


def flat_boxes(shape: Sequence[int], start: int, numel: int) -> List[Box]:
    """The boxes, in flat order, of elements [start, start + numel) of a row-major tensor of
    `shape`; each box is contiguous in the flat order."""
    shape = tuple(int(s) for s in shape)
    if numel <= 0:
        return []
    if not shape:
        return [((), ())]
    return _flat(shape, start, start + numel)


def flat_views(shape: Sequence[int], start: int, out):
    """(box, view) for each of flat_boxes(shape, start, len(out)): the part of the flat tensor
    `out` (elements [start, start + len(out)) of a row-major tensor of `shape`) that the box
    covers, viewed in the box's shape."""
    at = 0
    for box in flat_boxes(shape, start, out.numel()):
        n = math.prod(box[1])
        yield box, out.narrow(0, at, n).view(box[1])
        at += n


def _flat(shape: Tuple[int, ...], lo: int, hi: int) -> List[Box]:
    inner = math.prod(shape[1:])
    if len(shape) == 1:
        return [((lo,), (hi - lo,))]
    rest = shape[1:]
    first, last = lo // inner, (hi - 1) // inner
    if first == last:  # inside one row: its boxes with that row's index in front
        return [((first, *o), (1, *s)) for o, s in _flat(rest, lo - first * inner, hi - first * inner)]
    out: List[Box] = []
    if lo % inner:  # the first row's tail
        out += [((first, *o), (1, *s)) for o, s in _flat(rest, lo - first * inner, inner)]
        first += 1
    full_end = hi // inner
    if full_end > first:  # whole rows
        out.append(((first, *([0] * len(rest))), (full_end - first, *rest)))
    if hi % inner:  # the last row's head
        out += [((full_end, *o), (1, *s)) for o, s in _flat(rest, 0, hi - full_end * inner)]
    return out


def full_shape(local_shape: Sequence[int], spec: Optional[ShardSpec]) -> Tuple[int, ...]:
    """The full tensor's shape from a tensor-parallel shard's."""
    shape = list(local_shape)
    if spec is not None:
        shape[spec.dim] *= spec.world
    return tuple(shape)


def to_full(box: Box, spec: Optional[ShardSpec], full: Sequence[int]) -> List[Tuple[Box, Box]]:
    """A box of a shard as boxes of the full tensor: (the full tensor's box, the same piece as
    a box within `box`), one per chunk of the shard it crosses, in order along spec.dim."""
    offsets, sizes = box
    if spec is None:
        return [(box, ((0,) * len(sizes), sizes))]
    d = spec.dim
    rows = shard_rows(spec, full[d])  # the full tensor's range of each chunk of the shard
    part = rows[0][1] - rows[0][0]
    out = []
    lo, hi = offsets[d], offsets[d] + sizes[d]
    for c, (row_start, _) in enumerate(rows):
        a, b = max(lo, c * part), min(hi, (c + 1) * part)  # this chunk's part of the box, shard coordinates
        if a >= b:
            continue
        o, s, within = list(offsets), list(sizes), [0] * len(sizes)
        o[d], s[d], within[d] = row_start + a - c * part, b - a, a - lo
        out.append(((tuple(o), tuple(s)), (tuple(within), tuple(s))))
    return out


def intersect(a: Box, b: Box) -> Optional[Box]:
    """The common box of two boxes of one tensor, None where they do not meet."""
    offsets, sizes = [], []
    for (ao, asz, bo, bsz) in zip(a[0], a[1], b[0], b[1]):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if lo >= hi:
            return None
        offsets.append(lo)
        sizes.append(hi - lo)
    return tuple(offsets), tuple(sizes)


def slices(box: Box, within: Box) -> tuple:
    """`box` (of the full tensor) as index slices into the tensor holding `within`."""
    return tuple(slice(o - wo, o - wo + s) for o, s, wo in zip(box[0], box[1], within[0]))

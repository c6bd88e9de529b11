"""The sharded checkpoint's arithmetic (zoo.checkpoint.boxes) against plain indexing: a flat
range's boxes cover exactly its elements in order, a shard's boxes land where ShardSpec puts
them in the full tensor, and pieces saved under one cut reassemble under any other."""
from __future__ import annotations

import math
import random

import torch

from zoo.checkpoint.boxes import flat_boxes, full_shape, intersect, slices, to_full
from zoo.checkpoint.stream_write import StreamWriter
from zoo.parallel.sharding import ShardSpec, shard_tensor


def _ravel(offsets, shape):
    index = 0
    for o, s in zip(offsets, shape):
        index = index * s + o
    return index


def test_a_flat_range_is_boxes_that_cover_it_in_order():
    rng = random.Random(0)
    for shape in [(7,), (5, 6), (3, 4, 5), (2, 3, 2, 4)]:
        n = math.prod(shape)
        t = torch.arange(n).view(shape)
        for _ in range(40):
            start = rng.randrange(n)
            numel = rng.randrange(1, n - start + 1)
            got = torch.cat([t[tuple(slice(o, o + s) for o, s in zip(*box))].reshape(-1)
                             for box in flat_boxes(shape, start, numel)])
            assert torch.equal(got, torch.arange(start, start + numel)), (shape, start, numel)
            for box in flat_boxes(shape, start, numel):  # each box is contiguous in the flat order
                first = _ravel(box[0], shape)
                assert torch.equal(t[tuple(slice(o, o + s) for o, s in zip(*box))].reshape(-1),
                                   torch.arange(first, first + math.prod(box[1])))
    assert flat_boxes((4, 4), 3, 0) == []
    assert len(flat_boxes((4, 6), 3, 16)) == 3  # a row's tail, whole rows, a row's head


def test_a_shards_boxes_land_where_the_shard_spec_puts_them():
    full = torch.arange(12 * 6).view(12, 6).float()
    for spec in [ShardSpec(dim=0, rank=1, world=2, chunks=3), ShardSpec(dim=1, rank=2, world=3),
                 ShardSpec(dim=0, rank=0, world=4)]:
        shard = shard_tensor(full, spec)
        assert full_shape(shard.shape, spec) == tuple(full.shape)
        for start, numel in [(0, shard.numel()), (5, 13), (1, 1), (shard.numel() - 7, 7)]:
            for box in flat_boxes(shard.shape, start, numel):
                local = shard[tuple(slice(o, o + s) for o, s in zip(*box))]
                for full_box, within in to_full(box, spec, tuple(full.shape)):
                    piece = local[tuple(slice(o, o + s) for o, s in zip(*within))]
                    assert torch.equal(piece, full[tuple(slice(o, o + s) for o, s in zip(*full_box))])


def test_pieces_saved_under_one_cut_reassemble_under_another():
    """Save: tp=2 (fused chunks) x a 3-way flat partition; read: tp=3 x a 2-way partition."""
    full = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    saved = []
    for tp_rank in range(2):
        spec = ShardSpec(dim=0, rank=tp_rank, world=2, chunks=3)
        shard = shard_tensor(full, spec).reshape(-1)
        part = math.ceil(shard.numel() / 3)
        for dp_rank in range(3):
            start = dp_rank * part
            numel = min(shard.numel(), start + part) - start
            for box in flat_boxes(shard_tensor(full, spec).shape, start, numel):
                data = shard_tensor(full, spec)[tuple(slice(o, o + s) for o, s in zip(*box))]
                for full_box, within in to_full(box, spec, tuple(full.shape)):
                    saved.append((full_box, data[tuple(slice(o, o + s) for o, s in zip(*within))].clone()))
    assert sum(d.numel() for _, d in saved) == full.numel()  # each value saved once
    rebuilt = torch.full_like(full, float("nan"))
    for tp_rank in range(2):
        spec = ShardSpec(dim=1, rank=tp_rank, world=2)
        want = shard_tensor(full, spec)
        got = torch.full_like(want, float("nan"))
        for full_box, within in to_full(((0, 0), tuple(want.shape)), spec, tuple(full.shape)):
            for saved_box, data in saved:
                common = intersect(full_box, saved_box)
                if common is not None:
                    got[slices(common, full_box)] = data[slices(common, saved_box)]
        assert torch.equal(got, want)
        rebuilt[:, tp_rank * 3:(tp_rank + 1) * 3] = got
    assert torch.equal(rebuilt, full)


def test_the_stream_writer_writes_what_safetensors_reads(tmp_path):
    from safetensors.torch import load_file

    from zoo.run.checksums import digest

    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "empty": torch.zeros(0, 4), "h": torch.randn(2).bfloat16()}
    writer = StreamWriter(tmp_path / "x.safetensors", [(k, v.dtype, v.shape) for k, v in tensors.items()],
                          metadata={"format": "test"})
    for k, v in tensors.items():
        writer.write(k, v)
    record = writer.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())
    assert record == {"bytes": (tmp_path / "x.safetensors").stat().st_size, "xxh3_64": digest(tmp_path / "x.safetensors")}

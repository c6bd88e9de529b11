"""The merged index (zoo.checkpoint.merged_index): every rank's boxes, written once at save,
read per tensor at resume; the boxes it gives for a region are exactly the saved boxes that
meet it, and a resume that has it opens no rank's own index file."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from zoo.checkpoint import merged_index
from zoo.checkpoint.boxes import flat_boxes, intersect
from zoo.checkpoint.merged_index import MergedIndex
from zoo.checkpoint.sharded import Index


def _entries(rank: int, world: int) -> list:
    """What `world` ranks of a tp x ZeRO layout would index: a (12, 10) weight split by columns
    over 2 tp ranks, its halves' flat ranges over the dp ranks; a 1-D bias split by ranges; a
    4-D convolution kept whole by rank 0; a scalar."""
    out, key = [], itertools.count()
    tp, dp = rank % 2, rank // 2
    cols = (0, 5) if tp == 0 else (5, 5)
    per = 12 * 5 // (world // 2)
    for (off, size) in flat_boxes((12, 5), dp * per, per):  # boxes of the (12, 5) half
        out.append({"tensor": "model/w", "shape": [12, 10], "dtype": "F32", "key": str(next(key)),
                    "offsets": [off[0], off[1] + cols[0]], "sizes": list(size)})
    out.append({"tensor": "exp_avg/b", "shape": [16], "dtype": "F32", "key": str(next(key)),
                "offsets": [rank * 16 // world], "sizes": [16 // world]})
    if rank == 0:
        out.append({"tensor": "model/conv", "shape": [4, 3, 3, 3], "dtype": "BF16", "key": str(next(key)),
                    "offsets": [0, 0, 0, 0], "sizes": [4, 3, 3, 3]})
        out.append({"tensor": "model/scale", "shape": [], "dtype": "F32", "key": str(next(key)), "offsets": [],
                    "sizes": []})
    return out


@pytest.fixture
def written(tmp_path):
    world = 8
    per_rank = [_entries(r, world) for r in range(world)]
    merged_index.write(tmp_path, [merged_index.rank_part(f"shard-{r:05d}.safetensors", e)
                                  for r, e in enumerate(per_rank)])
    return tmp_path, per_rank


def test_the_merged_index_holds_every_rank_s_boxes(written):
    directory, per_rank = written
    merged = MergedIndex(directory)
    for tensor in ("model/w", "exp_avg/b", "model/conv", "model/scale"):
        saved = sorted((f"shard-{r:05d}.safetensors", e["key"], (tuple(e["offsets"]), tuple(e["sizes"])))
                       for r, entries in enumerate(per_rank) for e in entries if e["tensor"] == tensor)
        assert sorted(merged.boxes(tensor)) == saved, tensor
        assert merged.tensors[tensor]["shape"] == next(e["shape"] for es in per_rank for e in es if e["tensor"] == tensor)
    assert merged.tensors["model/conv"]["dtype"] == "BF16"
    np.load(directory / merged_index.BOXES, allow_pickle=False)  # no pickle in it


@pytest.mark.parametrize("near", [((0, 0), (12, 10)), ((3, 4), (2, 3)), ((11, 9), (1, 1)), ((0, 5), (12, 5)),
                                  ((6, 0), (1, 10))])
def test_the_boxes_near_a_region_are_exactly_those_that_meet_it(written, near):
    directory, per_rank = written
    every = MergedIndex(directory).boxes("model/w")
    assert sorted(MergedIndex(directory).boxes("model/w", near)) == sorted(b for b in every
                                                                          if intersect(b[2], near) is not None)


def test_a_resume_with_the_merged_index_reads_no_rank_s_own_index(written):
    directory, per_rank = written
    for r in range(len(per_rank)):
        (directory / f"index-{r:05d}.json").write_text("{not json")  # would fail if read
    index = Index(directory)
    assert index.shapes["model/w"] == (12, 10) and index.has("exp_avg/b") and not index.has("model/nothing")
    assert len(index.boxes("model/w", ((0, 0), (1, 1)))) == 1


def test_a_checkpoint_without_it_reads_the_ranks_files(written):
    directory, per_rank = written
    (directory / merged_index.INDEX).unlink()
    for r, entries in enumerate(per_rank):
        (directory / f"index-{r:05d}.json").write_text(json.dumps({"file": f"shard-{r:05d}.safetensors",
                                                                   "entries": entries}))
    index = Index(directory)
    assert index.merged is None and index.shapes["model/conv"] == (4, 3, 3, 3)
    assert len(index.boxes("model/w", ((0, 0), (12, 10)))) == sum(e["tensor"] == "model/w" for es in per_rank
                                                                   for e in es)

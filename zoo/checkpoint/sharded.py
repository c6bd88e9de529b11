"""The sharded checkpoint (format 2): every rank writes what it holds and reads what it needs.

Each rank writes `shard-RRRRR.safetensors`, the boxes (zoo.checkpoint.boxes) of the full
tensors it holds: of its pipeline stage's parameters, its tensor-parallel shard, and of that
its ZeRO partition or fragment of the fp32 master weights and each optimizer state; what
several ranks hold alike is written once (a replicated range split over the data-parallel
ranks, a tensor that tensor parallelism does not split by its tp rank 0, a weight tied
across stages by its first stage). Beside it `index-RRRRR.json` says which box of which
tensor each entry is. Nothing is gathered over any group, and a rank writes tensor by
tensor (zoo.checkpoint.stream_write), so a save holds no more than one piece at a time
besides what the rank already holds.

A resume reads the merged index (zoo.checkpoint.merged_index: the rows of the tensors it
holds, not every rank's file), then for each of its own parameters fills what it holds (its
fp32 partition, optimizer-state partitions and the model's copy) in place, from the
intersections of the saved boxes with the ones it needs, read as slices of the memory-
mapped shards: any tp x pp x dp x ZeRO layout reads any other's, bit for bit.

Why not torch.distributed.checkpoint: its metadata file is a pickle (FileSystemReader's
read_metadata calls pickle.load) and zoo loads no pickle; and a ZeRO-1/2 fragment is a flat
range of a parameter, not the rectangular chunk of a DTensor its planner describes, so the
boxes above, and a reader for them, would be needed anyway.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import weakref
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from zoo.checkpoint.boxes import Box, flat_boxes, flat_views, full_shape, intersect, slices, to_full
from zoo.checkpoint.merged_index import INDEX, MergedIndex
from zoo.checkpoint.stream_write import DTYPES, StreamWriter
from zoo.engine import state as engine_state
from zoo.parallel.names import plain_name
from zoo.parallel.topology import replica_coords
from zoo.run.errors import CheckpointError

MODEL = "model"  # the fp32 master weights (and buffers); optimizer states go under their own key


def unique_params(module: nn.Module) -> Iterator[Tuple[str, nn.Parameter]]:
    seen = set()
    for name, p in module.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            yield name, p


def state_buffers(module: nn.Module) -> Dict[str, torch.Tensor]:
    """The module's buffers that are part of its state (persistent, in its state_dict: a
    BatchNorm's running statistics), by plain name; not a cache like rotary tables."""
    persistent = dict(module.named_buffers())
    return {plain_name(n): b for n, b in module.state_dict(keep_vars=True).items() if n in persistent}


def _split(numel: int, parts: int, index: int) -> Tuple[int, int]:
    """(start, numel) of part `index` of [0, numel) cut into `parts` near-equal ranges."""
    size = math.ceil(numel / parts) if numel else 0
    start = min(numel, index * size)
    return start, min(numel, start + size) - start


def _ravel(offsets, shape) -> int:
    index = 0
    for o, s in zip(offsets, shape):
        index = index * s + o
    return index


# -- save -----------------------------------------------------------------------------------
def writer_stages(engine, grid) -> Dict[str, int]:
    """The pipeline stage that writes each parameter and buffer: the first that holds it."""
    names = {plain_name(n) for n, _ in unique_params(engine.module)} | set(state_buffers(engine.module))
    held = [None] * dist.get_world_size()
    dist.all_gather_object(held, (grid.get_stage_id(), sorted(names)))
    first: Dict[str, int] = {}
    for stage, found in held:
        for name in found:
            first[name] = min(stage, first.get(name, stage))
    return first


def _pieces(engine, grid, writers) -> Tuple[List[tuple], int]:
    """What this rank writes: (tensor, full shape, full box, dtype, source, flat offset in
    source, the box's shape, the piece within it) for each box, `source` a callable giving the
    flat tensor the box is cut from (parameters' values and states are fp32); the parameters'
    pieces first, then the buffers': and how many are the parameters'."""
    stage, tp_rank = grid.get_stage_id(), grid.get_slice_parallel_rank()
    dp_rank, dp = replica_coords(grid)  # the ranks holding the same parameters (dp, with cp dp x cp)
    keys = engine_state.state_keys(engine)
    by_kind: Dict[str, List[tuple]] = {kind: [] for kind in (MODEL, *keys)}
    for pname, p in unique_params(engine.module):
        plain, spec = plain_name(pname), getattr(p, "tp_shard", None)
        if writers[plain] != stage or (spec is None and tp_rank != 0):
            continue
        local = tuple(engine_state.full_shape(p))
        full = full_shape(local, spec)
        start, numel, replicated = engine_state.held_range(p)
        held_start = start
        if replicated:  # written once: each data-parallel rank its part
            offset, numel = _split(numel, dp, dp_rank)
            start += offset
        sources = [(MODEL, lambda p=p: engine_state.fp32_held(engine, p))]
        sources += [(key, lambda p=p, key=key: engine_state.optimizer_held(engine, p, key)) for key in keys]
        boxes = [(_ravel(box[0], local) - held_start, box[1], full_box, within)
                 for box in flat_boxes(local, start, numel) for full_box, within in to_full(box, spec, full)]
        for kind, source in sources:  # a source's pieces together: each source is read once (write's cache)
            for flat, box_shape, full_box, within in boxes:
                by_kind[kind].append((f"{kind}/{plain}", full, full_box, torch.float32, source, flat, box_shape,
                                      within))
    # Kind by kind, in the order of their memory: where the engine keeps a kind in flat
    # partitions (ZeRO), consecutive pieces are then consecutive in memory and `stage` copies
    # them at once (the order is only that: `stage` checks adjacency at each save).
    out = [piece for kind in by_kind.values() for piece in sorted(kind, key=_address)]
    n_state = len(out)
    if tp_rank == 0 and dp_rank == 0:
        for name, b in state_buffers(engine.module).items():
            if writers[name] == stage:
                box = ((0,) * b.dim(), tuple(b.shape))
                out.append((f"{MODEL}/{name}", tuple(b.shape), box, b.dtype, lambda b=b: b.detach().reshape(-1), 0,
                            tuple(b.shape), box))
    return out, n_state


def _address(piece: tuple) -> Tuple[int, int]:
    """(its storage, where in memory it starts) of a piece's source today."""
    source, flat = piece[4](), piece[5]
    return source.untyped_storage().data_ptr(), source.data_ptr() + flat * source.element_size()


_PLANS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine -> what its rank writes (_pieces)


class ShardWrite:
    """One rank's part of a save: what it writes, decided when it is built (collectively, at
    a run's first save; kept per engine after that), then written by `run` (no collective: a
    background thread may run it). For an asynchronous save the pieces are first copied to
    host memory (`allocate`, then `stage_buffers` and `stage_state`), so that training may
    change the engine's tensors meanwhile; unstaged, `run` reads them as it writes."""

    def __init__(self, engine, grid, directory: Path):
        engine_state.ensure_optimizer_state(engine)
        rank = dist.get_rank()
        if engine not in _PLANS:  # what a rank writes is the same at every save of a run
            _PLANS[engine] = _pieces(engine, grid, writer_stages(engine, grid))
        # The parameters' pieces, then the buffers': a forward changes buffers (a BatchNorm's
        # statistics), only an optimizer step the parameters and their state.
        self.pieces, self.n_state = _PLANS[engine]
        self.directory, self.rank = directory, rank
        self.shard, self.index_name = f"shard-{rank:05d}.safetensors", f"index-{rank:05d}.json"
        self.staged: Optional[List[torch.Tensor]] = None
        # index-RRRRR.json's entries: which box of which tensor each of the shard's keys holds
        self.entries = [{"tensor": tensor, "shape": list(full), "dtype": DTYPES[dtype], "offsets": list(box[0]),
                         "sizes": list(box[1]), "key": f"{n}"}
                        for n, (tensor, full, box, dtype, *_) in enumerate(self.pieces)]

    def _values(self, lo: int = 0, hi: Optional[int] = None):
        """The tensor of each piece in [lo, hi), in order: views of the engine's tensors (or the staged copies)."""
        if self.staged is not None:
            yield from self.staged[lo:hi]
            return
        cached = (None, None)  # the flat tensor of the source the last piece came from
        for _, _, _, dtype, source, flat, box_shape, within in self.pieces[lo:hi]:
            if cached[0] is not source:
                cached = (source, source())
            values = cached[1].narrow(0, flat, math.prod(box_shape)).view(box_shape)
            if within[1] != box_shape:  # a part of the box (tensor parallelism cut it)
                values = values[tuple(slice(o, o + s) for o, s in zip(*within))]
            yield values if values.dtype == dtype else values.to(dtype)

    def allocate(self, buffer: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The host buffer to stage in: `buffer` (uint8, at least the pieces' bytes; one kept from
        the last save spares the allocation and its page faults), else a new one (pinned on CUDA)."""
        sizes = [math.prod(box[1]) * dtype.itemsize for _, _, box, dtype, *_ in self.pieces]
        if buffer is None or buffer.numel() < sum(sizes):
            buffer = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        views, offset = [], 0
        for (_, _, box, dtype, *_), nbytes in zip(self.pieces, sizes):
            views.append(buffer.narrow(0, offset, nbytes).view(dtype).view(box[1]))
            offset += nbytes
        self.buffer, self.views = buffer, views
        return buffer

    def stage_buffers(self) -> None:
        """Copy the model's buffers (what a forward changes) into the buffer `allocate` chose."""
        self._stage(self.n_state, len(self.pieces))

    def stage_state(self) -> None:
        """Copy the parameters' fp32 values and optimizer state (what only an optimizer step
        changes; a background thread may do this while the next forward and backward run);
        from then on `run` writes the staged copies."""
        self._stage(0, self.n_state)
        self.staged = self.views

    @torch.no_grad()
    def _stage(self, lo: int, hi: int) -> None:
        run = None  # [first source piece, elements, buffer offset]: pieces contiguous in memory, copied at once
        for view, values in zip(self.views[lo:hi], self._values(lo, hi)):
            offset = view.data_ptr() - self.buffer.data_ptr()
            if run is not None and _follows(run, values):
                run[1] += values.numel()
                continue
            _copy_run(run, self.buffer)
            run = [values, values.numel(), offset] if values.is_contiguous() else None
            if run is None:
                view.copy_(values)
        _copy_run(run, self.buffer)

    @torch.no_grad()
    def run(self) -> Dict[str, dict]:
        """Write the shard and the index; returns their {file name: {bytes, xxh3_64}}."""
        delay = float(os.environ.get("ZOO_TEST_SAVE_DELAY_S", "0"))  # tests: a write still in flight
        if delay > 0:
            import time

            time.sleep(delay)
        entries = [(f"{n}", dtype, box[1]) for n, (_, _, box, dtype, *_) in enumerate(self.pieces)]
        writer = StreamWriter(self.directory / self.shard, entries,
                              metadata={"format": "zoo-shard-1", "rank": str(self.rank)})
        for n, values in enumerate(self._values()):
            writer.write(f"{n}", values)
        written = {self.shard: writer.close()}
        self.staged = None  # the staged copies go once written
        text = json.dumps({"file": self.shard, "entries": self.entries}, separators=(",", ":"))
        (self.directory / self.index_name).write_text(text)
        from zoo.run.checksums import digest

        written[self.index_name] = {"bytes": len(text.encode()), "xxh3_64": digest(self.directory / self.index_name)}
        return written


def _follows(run: list, values: torch.Tensor) -> bool:
    """`values` continue the run in memory: contiguous, of its dtype, right after it in its storage."""
    first = run[0]
    return (values.is_contiguous() and values.dtype == first.dtype
            and values.data_ptr() == first.data_ptr() + run[1] * first.element_size()
            and values.untyped_storage().data_ptr() == first.untyped_storage().data_ptr())


def _copy_run(run: Optional[list], buffer: torch.Tensor) -> None:
    if run is None:
        return
    first, numel, offset = run
    nbytes = numel * first.element_size()
    if first.device.type == "cpu":  # memmove: 1.6x torch's copy_ of the same bytes on one thread
        ctypes.memmove(buffer.data_ptr() + offset, first.data_ptr(), nbytes)
        return
    source = first.as_strided((numel,), (1,), first.storage_offset())
    buffer.narrow(0, offset, nbytes).view(first.dtype).copy_(source)  # from the device: into pinned memory


# -- load -----------------------------------------------------------------------------------
class ShardReader:
    """Slices of a shard's tensors read with pread, not memory-mapped (safetensors' safe_open):
    a mapped file's pages count in the process's memory once touched, so reading a rank's
    whole share through a map held its size again until the map closed; here only the rows
    a slice spans are read, and freed once copied."""

    def __init__(self, path: Path):
        import struct

        self.path = path
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            self.header = json.loads(fh.read(length))
        self.data_start = 8 + length
        self.fd = os.open(path, os.O_RDONLY)
        by_name = {name: dtype for dtype, name in DTYPES.items()}
        self.dtypes = {k: by_name[v["dtype"]] for k, v in self.header.items() if k != "__metadata__"}

    def read(self, key: str, index: tuple) -> torch.Tensor:
        """`tensor[index]` of the stored `key` (`index`: one slice per dimension): the rows it
        spans are read, or, where it takes a narrow band of a 2-d tensor's columns, each row's band."""
        entry, dtype = self.header[key], self.dtypes[key]
        shape, size = entry["shape"], torch.empty((), dtype=dtype).element_size()
        base = self.data_start + entry["data_offsets"][0]
        if not shape:
            return self._pread(base, size).view(dtype).view(())
        first, last = index[0].start, index[0].stop
        row = math.prod(shape[1:]) * size
        if len(shape) == 2 and len(index) == 2 and (index[1].stop - index[1].start) * 4 <= shape[1]:
            lo, hi = index[1].start, index[1].stop  # a narrow band: each row's part of it
            out = torch.empty((last - first, hi - lo), dtype=dtype)
            flat = out.view(torch.uint8).view(last - first, (hi - lo) * size)
            for i in range(last - first):
                self._pread(base + (first + i) * row + lo * size, (hi - lo) * size, into=flat[i])
            return out
        rows = self._pread(base + first * row, (last - first) * row).view(dtype).view(last - first, *shape[1:])
        return rows[(slice(None), *index[1:])]

    def _pread(self, offset: int, nbytes: int, into: Optional[torch.Tensor] = None) -> torch.Tensor:
        buffer = torch.empty(nbytes, dtype=torch.uint8) if into is None else into
        if nbytes and os.preadv(self.fd, [memoryview(buffer.numpy())], offset) != nbytes:
            raise CheckpointError(f"{self.path} is shorter than its header says (truncated)")
        return buffer

    def close(self) -> None:
        os.close(self.fd)


class Index:
    """The saved boxes of every tensor: from the merged index written at save (zoo.checkpoint.
    merged_index: O(tensors) read, then only the rows of the tensors asked for) or, in a
    checkpoint written before it, from all ranks' index files; the shards opened lazily."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.merged: Optional[MergedIndex] = None
        self._boxes: Dict[str, List[Tuple[str, str, Box]]] = {}
        self.shapes: Dict[str, Tuple[int, ...]] = {}
        self.dtypes: Dict[str, torch.dtype] = {}
        by_name = {name: dtype for dtype, name in DTYPES.items()}
        if (directory / INDEX).is_file():
            self.merged = MergedIndex(directory)
            for name, t in self.merged.tensors.items():
                self.shapes[name], self.dtypes[name] = tuple(t["shape"]), by_name[t["dtype"]]
        for f in [] if self.merged else sorted(directory.glob("index-*.json")):
            record = json.loads(f.read_text())
            for e in record["entries"]:
                self.shapes[e["tensor"]] = tuple(e["shape"])
                self.dtypes[e["tensor"]] = by_name[e["dtype"]]
                self._boxes.setdefault(e["tensor"], []).append(
                    (record["file"], e["key"], (tuple(e["offsets"]), tuple(e["sizes"]))))
        self._open: Dict[str, ShardReader] = {}

    def has(self, tensor: str) -> bool:
        return tensor in self.shapes

    def boxes(self, tensor: str, near: Box) -> List[Tuple[str, str, Box]]:
        """(file, key, box) of the saved boxes of `tensor` that may meet `near`."""
        if self.merged is not None:
            return self.merged.boxes(tensor, near)
        return self._boxes[tensor]

    def _reader(self, file: str) -> "ShardReader":
        if file not in self._open:
            self._open[file] = ShardReader(self.directory / file)
        return self._open[file]

    def fill(self, tensor: str, full: Tuple[int, ...], spec, local: Tuple[int, ...], start: int,
             out: torch.Tensor) -> None:
        """Fill `out` (flat) with elements [start, start + len(out)) of the tensor-parallel shard
        `spec` (of shape `local`) of the saved full tensor `tensor`."""
        if tensor not in self.shapes:
            raise CheckpointError(f"the checkpoint has no tensor {tensor!r}: it was written for another model")
        if self.shapes[tensor] != tuple(full):
            raise CheckpointError(f"the checkpoint's {tensor} has shape {list(self.shapes[tensor])} but this model's "
                                  f"is {list(full)}: it was written for another model")
        filled = 0
        for box, dest in flat_views(local, start, out):
            for full_box, within in to_full(box, spec, full):
                target = dest[tuple(slice(o, o + s) for o, s in zip(*within))]
                for file, key, saved in self.boxes(tensor, full_box):
                    common = intersect(full_box, saved)
                    if common is None:
                        continue
                    target[slices(common, full_box)].copy_(self._reader(file).read(key, slices(common, saved)))
                    filled += math.prod(common[1])
        if filled != out.numel():
            raise CheckpointError(f"the checkpoint holds {filled} of the {out.numel()} values of {tensor} this rank "
                                  f"needs: its shards are incomplete (a partial write?)")

    def close(self) -> None:
        for reader in self._open.values():
            reader.close()
        self._open.clear()

    def full(self, tensor: str) -> torch.Tensor:
        """The whole saved tensor (for export: one tensor at a time)."""
        shape = self.shapes[tensor]
        out = torch.empty(math.prod(shape), dtype=self.dtypes[tensor])
        self.fill(tensor, shape, None, shape, 0, out)
        return out.view(shape)


@torch.no_grad()
def read(engine, directory: Path, optimizer_step: int) -> None:
    """Fill this rank's engine from the sharded checkpoint in `directory`, in place: each
    parameter's fp32 master and optimizer-state partitions and the model's own copy, then
    the buffers (whatever layout wrote it)."""
    engine_state.ensure_optimizer_state(engine)
    index = Index(directory)
    keys = engine_state.state_keys(engine)
    for pname, p in unique_params(engine.module):
        plain, spec = plain_name(pname), getattr(p, "tp_shard", None)
        local = tuple(engine_state.full_shape(p))
        full = full_shape(local, spec)
        start, numel, _ = engine_state.held_range(p)
        master = engine_state.fp32_held(engine, p)
        if numel:
            index.fill(f"{MODEL}/{plain}", full, spec, local, start, master)
            for key in keys:
                index.fill(f"{key}/{plain}", full, spec, local, start,
                           engine_state.optimizer_held(engine, p, key, step=optimizer_step))
        model_start, model = engine_state.model_held(p)
        if model.data_ptr() == master.data_ptr() and model.numel() == master.numel():
            continue  # the model's weights are the fp32 master itself (fp32 without ZeRO)
        if model_start == start and model.numel() == numel:  # its partition: the master's, in its dtype
            model.copy_(master)
        else:
            index.fill(f"{MODEL}/{plain}", full, spec, local, model_start, model)
    for name, b in state_buffers(engine.module).items():
        if index.has(f"{MODEL}/{name}"):
            shape = tuple(b.shape)
            flat = torch.empty(b.numel(), dtype=b.dtype)
            index.fill(f"{MODEL}/{name}", shape, None, shape, 0, flat)
            b.copy_(flat.view(shape))
    index.close()

"""Loading: the next step's micro-batches are prepared while this step trains.

A step's batches are addressed by the data position (samples consumed before it), so
prefetching cannot change which samples a step sees: prepared batches are handed out only
for the position they were prepared for, and anything else is prepared on the spot. A
resumed run starts the loader at the checkpoint's position.

`data.num_workers=0`: one background thread prepares the next step. `data.num_workers=N`:
N DataLoader worker processes prepare whole steps, a few steps ahead. The task's batching
code is not thread-safe, so nothing but the loader may ask the task for training batches
while it is open. On CUDA the batches are staged in pinned host memory and copied without
blocking on a side stream, which the compute stream waits for.
"""
from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, List, Optional, Tuple

import torch

Batch = Tuple[torch.Tensor, ...]


class _Steps(torch.utils.data.Dataset):
    """Item i: the micro-batches of the step at data position start + i * stride."""

    def __init__(self, fetch: Callable[[int], List[Batch]], start: int, stride: int, count: int):
        self.fetch, self.start, self.stride, self.count = fetch, start, stride, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> List[Batch]:
        return self.fetch(self.start + i * self.stride)


class StepLoader:
    def __init__(self, task, device: torch.device, *, start: int, end: int, global_batch: int, micro_batch: int,
                 grad_accum: int, dp_rank: int, dp_size: int, num_workers: int = 0):
        self.device, self.stride, self.end, self.num_workers = device, global_batch, end, num_workers
        self.cuda = device.type == "cuda"
        host = task
        if self.cuda:  # the same task, leaving the batches on the host (a shallow copy: the data is shared)
            host = copy.copy(task)
            host.device = torch.device("cpu")
        self._fetch = lambda consumed: [
            host.micro_batch(consumed, m, micro_batch=micro_batch, global_batch=global_batch, dp_rank=dp_rank,
                             dp_size=dp_size) for m in range(grad_accum)]
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._pool: Optional[ThreadPoolExecutor] = None
        self._next: Optional[Tuple[int, Future]] = None
        self._iter, self._iter_position = None, None
        if num_workers > 0:
            self._open_workers(start)
        else:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="zoo-prefetch")
            self._prefetch(start)

    # -- one background thread --------------------------------------------------------------
    def _prepare(self, consumed: int):
        batches = self._fetch(consumed)
        if not self.cuda:
            return batches, None
        with torch.cuda.stream(self._stream):
            batches = [tuple(t.pin_memory().to(self.device, non_blocking=True) for t in b) for b in batches]
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return batches, ready

    def _prefetch(self, consumed: int) -> None:
        self._next = (consumed, self._pool.submit(self._prepare, consumed)) if consumed < self.end else None

    # -- DataLoader worker processes ----------------------------------------------------------
    def _open_workers(self, start: int) -> None:
        steps = _Steps(self._fetch, start, self.stride, max(0, -(-(self.end - start) // self.stride)))
        loader = torch.utils.data.DataLoader(steps, batch_size=None, shuffle=False, num_workers=self.num_workers,
                                             pin_memory=self.cuda, prefetch_factor=2,
                                             multiprocessing_context="fork")  # the workers share the task's data
        self._iter, self._iter_position = iter(loader), start

    # -- the trainer's side -------------------------------------------------------------------
    def get(self, consumed: int) -> List[Batch]:
        """The micro-batches of the step that starts at data position `consumed`, on the device."""
        if self._pool is None:
            if self._iter_position != consumed:  # not the position the workers are on: restart there
                self._open_workers(consumed)
            batches = next(self._iter)
            self._iter_position = consumed + self.stride
            if self.cuda:
                batches = [tuple(t.to(self.device, non_blocking=True) for t in b) for b in batches]
            return batches
        if self._next is None or self._next[0] != consumed:
            if self._next is not None:
                self._next[1].cancel()
            self._next = (consumed, self._pool.submit(self._prepare, consumed))
        batches, ready = self._next[1].result()
        self._prefetch(consumed + self.stride)
        if ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(ready)
            for b in batches:
                for t in b:
                    t.record_stream(compute)  # the caching allocator must not reuse it before compute is done
        return batches

    def wait_idle(self) -> None:
        """Return once the background thread has finished the step it is preparing (it starts
        no other until the next `get`): the task may then be asked for other batches."""
        if self._next is not None:
            self._next[1].result()

    def close(self) -> None:
        """Stop preparing; returns once no batch is being prepared (the task is free again)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._next = None, None
        self._iter = None

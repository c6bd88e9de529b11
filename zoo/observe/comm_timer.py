"""Time spent in communication: every torch.distributed collective and point-to-point call
of this process (DeepSpeed's included: deepspeed.comm calls torch.distributed), and every
wait on an asynchronous one's handle; on CUDA timed with events on the issuing stream."""
from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from typing import Dict

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "_all_gather_base", "all_gather_coalesced", "all_gather_object", "gather", "gather_object", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single",
               "all_gather_single", "reduce_scatter_single",  # zoo.parallel.mappings' tensor-parallel gathers
               "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier", "broadcast_object_list")


class CommTimer:
    """Times every torch.distributed collective and point-to-point call of this process, and
    every wait on a handle of an asynchronous one, by patching them while installed."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.counting = True
        self.annotate = False  # a profiler window is open: each call is a `zoo.comm:NAME` range
        self._nested = threading.local()
        self._restore: list = []
        self.reset()

    def install(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        for module in (dist, c10d):  # DeepSpeed calls both
            for name in COLLECTIVES:
                fn = getattr(module, name, None)
                if fn is not None:
                    self._patch(module, name, self._timed(name, fn))
        work = c10d.Work
        self._patch(work, "wait", self._timed("wait", work.wait))
        from zoo.engine.comm import backend_functions

        # DeepSpeed's backend took these when it was created: given torch's again, now the timed ones
        for obj, name, fn in backend_functions():
            self._patch(obj, name, fn)

    def uninstall(self) -> None:
        for obj, name, old in reversed(self._restore):
            setattr(obj, name, old)
        self._restore.clear()

    def _patch(self, obj, name, new) -> None:
        self._restore.append((obj, name, getattr(obj, name)))
        setattr(obj, name, new)

    def _timed(self, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if torch.compiler.is_compiling():  # inside a model.compile graph: traced, not timed from Python
                return fn(*args, **kwargs)
            if not self.counting or getattr(self._nested, "on", False):  # e.g. all_gather_object -> all_gather
                return fn(*args, **kwargs)
            self._nested.on = True
            start = self._mark()
            try:
                if self.annotate:
                    with torch.profiler.record_function(f"zoo.comm:{name}"):
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            finally:
                self._nested.on = False
                self._spans.append((name, start, self._mark()))

        return timed

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def reset(self) -> None:
        self._spans: list = []
        self._origin = self._mark()

    def seconds(self) -> tuple[float, Dict[str, float]]:
        """(time with a call in flight since the last reset, seconds by call), then reset."""
        if self.cuda:
            torch.cuda.synchronize()
            spans = [(n, self._origin.elapsed_time(a) / 1e3, self._origin.elapsed_time(b) / 1e3)
                     for n, a, b in self._spans]
        else:
            spans = self._spans
        by_name: Dict[str, float] = {}
        for n, a, b in spans:
            by_name[n] = by_name.get(n, 0.0) + b - a
        total, reach = 0.0, -math.inf  # the union of the spans: concurrent calls count once
        for _, a, b in sorted(spans, key=lambda s: s[1]):
            total += max(0.0, b - max(a, reach))
            reach = max(reach, b)
        self.reset()
        return total, by_name

    @contextlib.contextmanager
    def paused(self):
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

"""Where a profiled step's device time went, from the kernels in the trace (CUDA runs).

On a GPU the training thread's ranges (zoo.observe.breakdown) say what the CPU was doing:
launching work, or waiting in a synchronize. Kernels run later, on their streams, so forward
and the optimizer absorb the device time the CPU waited for and backward and communication
read near zero. This reads the Chrome trace torch.profiler writes (Kineto's format): each
kernel, memory copy and memset (`cat` "kernel", "gpu_memcpy", "gpu_memset") with its time on
the device, and the runtime call that launched it (`cat` "cuda_runtime" / "cuda_driver", the
same `args.correlation`). A kernel counts for the kind of the training thread's range that
was open when it was launched, by whichever thread (zoo.observe.breakdown's PRIORITY: a kernel launched inside an
all-reduce is that all-reduce's); an NCCL kernel (its name says nccl) is communication whatever
launched it. Per step of the window: each kind's device milliseconds, the device's busy time
(the union of every kernel's interval), and how much of communication ran while compute did.
"""
from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from zoo.observe.breakdown import COMM_KINDS, COMPUTE, Span, kind_of, length, merged, owned

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
COMM = tuple(COMM_KINDS)


def _ranges(events: Iterable[dict]) -> Tuple[List[Tuple[float, float, str]], int]:
    """The training thread's zoo.* ranges as disjoint (start, end, kind) spans, sorted, each
    moment the first kind in PRIORITY that covers it (zoo.observe.breakdown.owned), and its
    count of zoo.step ranges (the training thread: the one with the most of them)."""
    steps: Dict[object, int] = {}
    ranges: Dict[object, Dict[str, List[Span]]] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("user_annotation", "cpu_op", "python_function"):
            continue
        name = e.get("name", "")
        if name == "zoo.step":
            steps[e.get("tid")] = steps.get(e.get("tid"), 0) + 1
        elif kind_of(name) is not None:
            span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            ranges.setdefault(e.get("tid"), {}).setdefault(kind_of(name), []).append(span)
    if not steps:
        return [], 0
    tid = max(steps, key=steps.__getitem__)
    spans = sorted((a, b, kind) for kind, own in owned(ranges.get(tid, {})).items() for a, b in own)
    return spans, steps[tid]


def _kind_at(t: float, spans: List[Tuple[float, float, str]], starts: List[float]) -> Optional[str]:
    i = bisect_right(starts, t) - 1  # the last span starting at or before t
    return spans[i][2] if i >= 0 and t <= spans[i][1] else None


def device_breakdown(trace: dict) -> Optional[Dict[str, object]]:
    """{"steps", "device_ms": {kind: ms a step}, "busy_ms", "comm_overlap_ms", "kernels"} of a
    Chrome trace (the dict torch.profiler's export_chrome_trace wrote); None where it holds no
    device activity (a CPU run) or no zoo.step range."""
    events = trace.get("traceEvents", [])
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    if not device:
        return None
    spans, count = _ranges(events)
    starts = [a for a, _, _ in spans]
    if not count:
        return None
    # Launches from any thread (autograd's device thread launches the backward's kernels while
    # the training thread waits inside its zoo.backward range): attributed by when they happened.
    launched = {e.get("args", {}).get("correlation"): float(e["ts"]) for e in events
                if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS}
    by_kind: Dict[str, List[Span]] = {}
    for e in device:
        span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
        at = launched.get(e.get("args", {}).get("correlation"))
        kind = _kind_at(at, spans, starts) if at is not None else None
        if "nccl" in e.get("name", "").lower() and kind not in COMM:
            kind = "other comm"
        if kind is None:
            kind = "memory" if e["cat"] != "kernel" else "other"
        by_kind.setdefault(kind, []).append(span)
    busy = merged(s for spans in by_kind.values() for s in spans)
    compute = merged(s for k in COMPUTE for s in by_kind.get(k, []))
    comm = merged(s for k in COMM for s in by_kind.get(k, []))
    overlap = length(comm) + length(compute) - length(merged([*comm, *compute]))
    return {"steps": count,
            "device_ms": {k: length(merged(v)) / 1e3 / count for k, v in sorted(by_kind.items())},
            "busy_ms": length(busy) / 1e3 / count, "comm_overlap_ms": overlap / 1e3 / count,
            "kernels": len(device)}


def trace_device_breakdown(path: Path) -> Optional[Dict[str, object]]:
    """device_breakdown of the trace file torch.profiler wrote at `path`."""
    with open(path) as fh:
        return device_breakdown(json.load(fh))

"""Where a profiled step's time went, from the profiler's ranges on the training thread.

The trainer marks each step (`zoo.step`), its forward, backward, optimizer step and data
wait (`zoo.forward`, ...; under pipeline parallelism DeepSpeed's schedule instructions), and
the communication timer marks every torch.distributed call (`zoo.comm:all_reduce`, ...);
context parallelism marks its key/value gathers and their gradients' reduce-scatters (`zoo.cp`,
zoo.parallel.context), which count as `cp comm` whatever collective they use.
A moment of a step counts once, for the first kind that covers it in PRIORITY order (an
all-reduce inside the backward pass is communication, not backward); what no range covers
is idle. Under pipeline parallelism a blocking receive is the wait for the neighbour stage,
so the bubble shows as send/recv.

A multi-rank window is bounded by two barriers (`zoo.sync`, zoo.observe.profiler): a step's
time is the window's, from the end of the first to the end of the last, over its steps, the
same on ranks that run in lockstep (pipeline stages), what lies between the steps and the
wait at the closing barrier counted as idle. A window without them (one rank) is the sum of
its `zoo.step` ranges.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Span = Tuple[float, float]

COMM_KINDS = {
    "cp comm": (),  # zoo.parallel.context's ranges, not a call name
    "all-reduce": ("all_reduce", "all_reduce_coalesced", "reduce"),
    "all-gather": ("all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced",
                   "all_gather_object", "all_gather_single", "gather", "gather_object"),
    "reduce-scatter": ("reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single",
                       "scatter"),
    "send/recv": ("send", "recv", "isend", "irecv", "batch_isend_irecv"),
    "broadcast": ("broadcast", "broadcast_object_list"),
    "other comm": ("barrier", "all_to_all", "all_to_all_single", "wait"),
}
COMPUTE = ("forward", "backward", "optimizer")
# The pipeline's point-to-point instructions first (DeepSpeed may send by broadcast), then
# each collective kind, the data wait, and compute from the innermost outwards.
PRIORITY = ("send/recv", "cp comm", "all-reduce", "all-gather", "reduce-scatter", "broadcast", "other comm", "data",
            "optimizer", "backward", "forward")
KINDS = (*COMPUTE, *(k for k in COMM_KINDS), "data", "idle")
_BY_CALL = {call: kind for kind, calls in COMM_KINDS.items() for call in calls}


def kind_of(name: str) -> str | None:
    """The breakdown kind of a profiler range name, or None for a range it does not count."""
    if name == "zoo.cp":
        return "cp comm"
    if name.startswith("zoo.comm:"):
        return _BY_CALL.get(name[len("zoo.comm:"):], "other comm")
    if name.startswith("zoo.") and name[4:] in (*COMPUTE, "data", "send/recv"):
        return name[4:]
    return None


def merged(spans: Iterable[Span]) -> List[Span]:
    out: List[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def length(spans: Sequence[Span]) -> float:
    return sum(b - a for a, b in spans)


def minus(spans: Sequence[Span], cut: Sequence[Span]) -> List[Span]:
    """The parts of merged `spans` outside merged `cut`."""
    out, j = [], 0
    for a, b in spans:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k, start = j, a
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def step_breakdown(ranges: Iterable[Tuple[str, float, float]]) -> Dict[str, object]:
    """{"steps": n, "step_ms": mean step, "ms": {kind: ms per step}} of (name, start_us,
    end_us) ranges of one thread: the `zoo.step` ranges and what lies inside them."""
    ranges = list(ranges)
    count = sum(1 for n, _, _ in ranges if n == "zoo.step")
    steps = merged((a, b) for n, a, b in ranges if n == "zoo.step")
    syncs = sorted(b for n, _, b in ranges if n == "zoo.sync")
    if len(syncs) >= 2 and steps:  # the barriers' window (module docstring)
        steps = [(syncs[0], syncs[-1])]
    if not count:
        return {"steps": 0, "step_ms": 0.0, "ms": {k: 0.0 for k in KINDS}}
    by_kind: Dict[str, List[Span]] = {}
    for name, a, b in ranges:
        kind = kind_of(name)
        if kind is not None:
            by_kind.setdefault(kind, []).append((a, b))
    ms = {kind: length(own) / 1e3 / count for kind, own in owned(by_kind, steps).items()}
    total = length(steps) / 1e3 / count
    ms["idle"] = max(0.0, total - sum(ms.values()))
    return {"steps": count, "step_ms": total, "ms": {k: ms.get(k, 0.0) for k in KINDS}}


def owned(by_kind: Dict[str, List[Span]], within: Optional[Sequence[Span]] = None) -> Dict[str, List[Span]]:
    """{kind: its merged spans} where each moment counts once, for the first kind in PRIORITY
    that covers it (disjoint across kinds); `within`: only inside those merged spans."""
    covered: List[Span] = []
    out: Dict[str, List[Span]] = {}
    for kind in PRIORITY:
        spans = merged(by_kind.get(kind, []))
        own = minus(_clip(spans, within) if within is not None else spans, covered)
        out[kind] = own
        covered = merged([*covered, *own])
    return out


def _clip(spans: Sequence[Span], windows: Sequence[Span]) -> List[Span]:
    """The parts of merged `spans` inside merged `windows`."""
    return minus(spans, minus(_hull(spans, windows), windows))


def _hull(*groups: Sequence[Span]) -> List[Span]:
    points = [p for g in groups for s in g for p in s]
    return [(min(points), max(points))] if points else []

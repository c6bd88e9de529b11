"""The tp x cp x pp x dp rank grid.

Ranks are laid out with DeepSpeed's `ProcessTopology` on axes (data, pipe, model), with
context parallelism (data, pipe, context, model): the tensor-parallel ("model") coordinate
varies fastest, so a tp group is adjacent ranks on one node, the context-parallel group next
to it (inside the node too while tp x cp fits one), and data parallelism is outermost, across
nodes: the heaviest communication stays inside the node. DeepSpeed's `PipelineParallelGrid`
builds the process groups from it and is handed to the engine as its mpu; with cp it also
answers DeepSpeed's sequence-parallel questions (`ContextGrid`): gradients are summed over the
cp group and averaged over dp, and ZeRO partitions over dp x cp. Nothing here is global.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Sequence


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero_stage: int = 0
    cp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def name(self) -> str:
        context = f"-cp{self.cp}" if self.cp > 1 else ""
        return f"tp{self.tp}{context}-pp{self.pp}-dp{self.dp}_zero{self.zero_stage}"


def build_topology(layout: Layout):
    """DeepSpeed's ProcessTopology of the layout (imported here: the layout itself, which
    validation and the planner use, needs no DeepSpeed)."""
    from deepspeed.runtime.pipe.topology import ProcessTopology

    if layout.cp > 1:
        return ProcessTopology(axes=["data", "pipe", "context", "model"], dims=[layout.dp, layout.pp, layout.cp, layout.tp])
    return ProcessTopology(axes=["data", "pipe", "model"], dims=[layout.dp, layout.pp, layout.tp])


def group_lists(topo) -> dict:
    """Global ranks of every TP, CP (with context parallelism), PP and DP group."""
    out = {"TP": topo.get_axis_comm_lists("model")}
    if "context" in topo.get_axis_names():
        out["CP"] = topo.get_axis_comm_lists("context")
    return {**out, "PP": topo.get_axis_comm_lists("pipe"), "DP": topo.get_axis_comm_lists("data")}


def _natural_key(name: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def compress_hosts(names) -> str:
    """Host names in natural order with numbered runs compressed as Slurm writes them:
    node1, node2, node3, node7, gpu-a -> `gpu-a,node[1-3,7]` (node2 before node10)."""
    by_prefix: Dict[str, List[tuple]] = {}
    for name in set(names):
        m = re.fullmatch(r"(.*?)(\d+)", name)
        prefix, number = (m.group(1), m.group(2)) if m else (name, None)
        by_prefix.setdefault(prefix, []).append((number, name))
    out = []
    for prefix in sorted(by_prefix, key=_natural_key):
        items = by_prefix[prefix]
        plain = [name for number, name in items if number is None]
        numbered = sorted((int(n), n) for n, _ in items if n is not None)
        out += plain
        if len(numbered) == 1:
            out.append(prefix + numbered[0][1])
        elif numbered:
            runs, start, prev = [], numbered[0], numbered[0]
            for cur in numbered[1:] + [None]:
                unpadded = cur is not None and cur[1] == str(cur[0]) and prev[1] == str(prev[0])
                if cur is not None and cur[0] == prev[0] + 1 and (unpadded or len(cur[1]) == len(prev[1])):
                    prev = cur
                    continue
                runs.append(start[1] if start == prev else f"{start[1]}-{prev[1]}")
                start = prev = cur
            out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(out)


def describe_grid(layout: Layout, hosts: Sequence[str], devices: Sequence[str] = ()) -> str:
    """The device topology diagram: each rank's coordinates, host and device, then every group
    (a group whose ranks sit on more than one host is marked)."""
    topo = build_topology(layout)
    cp = layout.cp > 1
    lines: List[str] = [f"layout {layout.name}: world {layout.world_size} = "
                        f"tp {layout.tp} x {f'cp {layout.cp} x ' if cp else ''}pp {layout.pp} x dp {layout.dp}",
                        f"rank  dp  pp  {'cp  ' if cp else ''}tp  host" + ("  device" if devices else "")]
    for rank in range(layout.world_size):
        c = topo.get_coord(rank)
        host = hosts[rank] if rank < len(hosts) else "?"
        device = f"  {devices[rank]}" if rank < len(devices) else ""
        context = f"{c.context:>2}  " if cp else ""
        lines.append(f"{rank:>4}  {c.data:>2}  {c.pipe:>2}  {context}{c.model:>2}  {host}{device}")
    for kind, groups in group_lists(topo).items():
        for g in groups:
            on = {hosts[r] for r in g if r < len(hosts)}
            crosses = "  (crosses hosts)" if len(on) > 1 else ""
            lines.append(f"{kind} group: {list(g)}  hosts {compress_hosts(on)}{crosses}")
    return "\n".join(lines) + "\n"


def build_grid(layout: Layout):
    """DeepSpeed's grid for this layout (needs torch.distributed initialised); with cp > 1 the
    grid that also holds the context-parallel groups (zoo.parallel.context_grid)."""
    if layout.cp > 1:
        from zoo.parallel.context_grid import ContextGrid

        return ContextGrid(topology=build_topology(layout))
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid

    return PipelineParallelGrid(topology=build_topology(layout))


def replica_coords(grid) -> tuple:
    """(rank, size) among the ranks that hold the same parameters (tp rank and stage alike):
    the data-parallel group, with context parallelism dp x cp. The ranks that split writing
    what they all hold, and the group ZeRO partitions over."""
    if hasattr(grid, "get_sequence_data_parallel_rank"):
        return grid.get_sequence_data_parallel_rank(), grid.get_sequence_data_parallel_world_size()
    return grid.get_data_parallel_rank(), grid.get_data_parallel_world_size()


def replica_group(grid):
    """The process group of `replica_coords`."""
    if hasattr(grid, "get_sequence_data_parallel_group"):
        return grid.get_sequence_data_parallel_group()
    return grid.get_data_parallel_group()


def tp_group(grid):
    """The tensor-parallel process group of this rank (None when tp == 1)."""
    return grid.get_slice_parallel_group() if grid.get_slice_parallel_world_size() > 1 else None

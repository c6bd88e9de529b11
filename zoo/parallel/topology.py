"""The tp x pp x dp rank grid.

Ranks are laid out with DeepSpeed's `ProcessTopology` on axes (data, pipe, model): the
tensor-parallel ("model") coordinate varies fastest, so a tp group is adjacent ranks on
one node, and data parallelism is outermost, across nodes: the heaviest communication
stays inside the node. DeepSpeed's `PipelineParallelGrid` builds the process groups from
it and is handed to the engine as its mpu; nothing here is global.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    zero_stage: int = 0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def name(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-dp{self.dp}_zero{self.zero_stage}"


def build_topology(layout: Layout):
    """DeepSpeed's ProcessTopology of the layout (imported here: the layout itself, which
    validation and the planner use, needs no DeepSpeed)."""
    from deepspeed.runtime.pipe.topology import ProcessTopology

    return ProcessTopology(axes=["data", "pipe", "model"], dims=[layout.dp, layout.pp, layout.tp])


def group_lists(topo) -> dict:
    """Global ranks of every TP, PP and DP group."""
    return {"TP": topo.get_axis_comm_lists("model"), "PP": topo.get_axis_comm_lists("pipe"),
            "DP": topo.get_axis_comm_lists("data")}


def describe_grid(layout: Layout, hosts: Sequence[str]) -> str:
    """The device topology diagram: each rank's coordinates and host, then every group."""
    topo = build_topology(layout)
    lines: List[str] = [f"layout {layout.name}: world {layout.world_size} = "
                        f"tp {layout.tp} x pp {layout.pp} x dp {layout.dp}",
                        "rank  dp  pp  tp  host"]
    for rank in range(layout.world_size):
        c = topo.get_coord(rank)
        lines.append(f"{rank:>4}  {c.data:>2}  {c.pipe:>2}  {c.model:>2}  {hosts[rank] if rank < len(hosts) else '?'}")
    for kind, groups in group_lists(topo).items():
        for g in groups:
            lines.append(f"{kind} group: {list(g)}  hosts {sorted({hosts[r] for r in g if r < len(hosts)})}")
    return "\n".join(lines) + "\n"


def build_grid(layout: Layout):
    """DeepSpeed's grid for this layout (needs torch.distributed initialised)."""
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid

    return PipelineParallelGrid(topology=build_topology(layout))


def tp_group(grid):
    """The tensor-parallel process group of this rank (None when tp == 1)."""
    return grid.get_slice_parallel_group() if grid.get_slice_parallel_world_size() > 1 else None

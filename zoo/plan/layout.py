"""One training layout as the planner scores it: the rank grid plus the per-rank batch choices."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:  # the topology module imports DeepSpeed; the estimates do not need it
    from zoo.parallel.topology import Layout


@dataclass(frozen=True)
class PlanLayout:
    """A complete layout: tp x cp x pp x dp ranks, ZeRO stage and how a step's batch is cut."""

    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline stages."""
    dp: int
    """Data-parallel replicas."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage over the dp group."""
    micro_batch_size: int = 1
    """Samples per forward/backward on one rank."""
    grad_accum: int = 1
    """Micro-batches per rank per step (the pipeline's micro-batches when pp > 1)."""
    activation_checkpointing: bool = False
    """Full recomputation at layer boundaries."""
    cp: int = 1
    """Context-parallel size: ranks sharing each sequence (zoo.parallel.context)."""

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def replicas(self) -> int:
        """Ranks holding the same parameters, which ZeRO partitions over and gradients are reduced
        over: dp x cp."""
        return self.dp * self.cp

    @property
    def grid(self) -> "Layout":
        """The rank grid, as `zoo.parallel.topology` builds it."""
        from zoo.parallel.topology import Layout

        return Layout(tp=self.tp, pp=self.pp, dp=self.dp, zero_stage=self.zero_stage, cp=self.cp)


def stage_layer_counts(n_layer: int, pp: int) -> List[int]:
    """Layers per pipeline stage, contiguous and as even as possible (the first stages take
    the remainder): 96 layers over 16 stages is 6 each, 12 over 5 is [3, 3, 2, 2, 2]."""
    assert 1 <= pp <= n_layer, f"pp={pp} must be in [1, {n_layer}]"
    base, extra = divmod(n_layer, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]

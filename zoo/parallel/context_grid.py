"""DeepSpeed's grid with a context-parallel axis: the groups cp adds, as DeepSpeed asks for them.

The topology's axes are (data, pipe, context, model) (zoo.parallel.topology). DeepSpeed's
`PipelineParallelGrid` builds the tp, pp and dp groups from it as before; this adds

- the context-parallel group (ranks that differ only in their context coordinate): each holds
  a share of every sequence, and their attention gathers keys and values over it;
- the sequence-data-parallel group (dp x cp: ranks that differ in data or context): what
  DeepSpeed's engine reduces gradients over (summed over cp, averaged over dp: its
  sequence-parallel contract, the same as for Ulysses) and ZeRO partitions over;
- the model-parallel group without cp (tp x pp): DeepSpeed sums the squares of a gradient norm
  over it, so the cp ranks' equal copies of a parameter must not all be counted.

The data-parallel group stays the pure dp one: the data each replica reads, and DeepSpeed's
batch arithmetic (micro-batch x accumulation x dp) are unchanged by cp.
"""
from __future__ import annotations

import torch.distributed as dist
from deepspeed.runtime.pipe.topology import PipelineParallelGrid


class ContextGrid(PipelineParallelGrid):
    def __init__(self, topology):
        super().__init__(topology=topology)
        topo, me = self._topo, self._topo.get_coord(self.global_rank)
        self.context_parallel_size = topo.get_dim("context")
        self.context_rank = me.context
        self.cp_proc_group, self.cp_ranks = self._mine(topo.get_axis_comm_lists("context"))
        pairs = [(p, m) for p in range(topo.get_dim("pipe")) for m in range(topo.get_dim("model"))]
        self.seq_dp_proc_group, self.seq_dp_ranks = self._mine(
            [sorted(topo.filter_match(pipe=p, model=m)) for p, m in pairs])
        replicas = [(d, c) for d in range(topo.get_dim("data")) for c in range(topo.get_dim("context"))]
        self.mp_proc_group, self.mp_ranks = self._mine(
            [sorted(topo.filter_match(data=d, context=c)) for d, c in replicas])

    def _mine(self, lists):
        """Every rank creates every group (in the same order); this rank's and its ranks."""
        mine = None
        for ranks in lists:
            group = dist.new_group(ranks=ranks)
            if self.global_rank in ranks:
                mine = (group, ranks)
        assert mine is not None
        return mine

    # DeepSpeed's sequence-parallel questions (deepspeed.utils.groups)
    def get_sequence_parallel_group(self):
        return self.cp_proc_group

    def get_sequence_parallel_world_size(self) -> int:
        return self.context_parallel_size

    def get_sequence_parallel_rank(self) -> int:
        return self.context_rank

    def get_sequence_data_parallel_group(self):
        return self.seq_dp_proc_group

    def get_sequence_data_parallel_world_size(self) -> int:
        return len(self.seq_dp_ranks)

    def get_sequence_data_parallel_rank(self) -> int:
        return self.seq_dp_ranks.index(self.global_rank)

    # the model-parallel group without cp (gradient norms, overflow checks)
    def get_model_parallel_group(self):
        return self.mp_proc_group

    def get_model_parallel_world_size(self) -> int:
        return len(self.mp_ranks)

    def get_model_parallel_rank(self) -> int:
        return self.mp_ranks.index(self.global_rank)

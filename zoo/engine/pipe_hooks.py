"""DeepSpeed's pipeline engine as zoo uses it: a PipelineModule whose partitioner reads the
model's own layer list (its private hooks `_find_layer_type` and `_count_layer_params`,
answered from the meta model, so no layer is built to be counted), whose grid may be a
subclass of DeepSpeed's (context parallelism's), whose tied-weight groups are built for every
axis of the topology (DeepSpeed's loop knows data and model only), and the pipeline engine's
instruction table, which the profiler wraps to mark each instruction by its kind."""
from __future__ import annotations

import contextlib
import itertools
import re
from typing import Callable, Dict, List, Optional

import torch.nn as nn
from deepspeed import comm as dist
from deepspeed.pipe import PipelineModule, TiedLayerSpec


def _unique_parameters(modules) -> List[nn.Parameter]:
    return list({id(p): p for m in modules for p in m.parameters()}.values())


class LayerListPipelineModule(PipelineModule):
    """A PipelineModule whose specs each take the meta model as their first argument (zoo's
    StageLayer); the partitioner's names and weights come from that model's layer list.
    `grid_class`: the grid DeepSpeed's constructor builds instead of its PipelineParallelGrid
    (which it names inside its own module, so it is swapped there while the module is built)."""

    def __init__(self, *args, grid_class: Optional[type] = None, **kwargs):
        if grid_class is None:
            super().__init__(*args, **kwargs)
            return
        from deepspeed.runtime.pipe import module as ds_module

        plain = ds_module.PipelineParallelGrid
        ds_module.PipelineParallelGrid = lambda process_group=None, topology=None: grid_class(topology=topology)
        try:
            super().__init__(*args, **kwargs)
        finally:
            ds_module.PipelineParallelGrid = plain

    def _index_tied_modules(self):
        """DeepSpeed's tied-weight groups (the stages holding a tied layer, one group for every
        coordinate of the other axes), built over every axis of the topology: DeepSpeed's loop
        takes the data and model coordinates and this rank's own for the rest, so under context
        parallelism each rank created other groups than its peers at the same call."""
        tied_comms = {}
        topo = self._topo
        if topo.get_dim("pipe") == 1:
            return tied_comms
        others = [axis for axis in topo.get_axis_names() if axis != "pipe"]
        for key in sorted({s.key for s in self._layer_specs if isinstance(s, TiedLayerSpec)}):
            stages = sorted({self.stage_owner(i) for i, s in enumerate(self._layer_specs)
                             if isinstance(s, TiedLayerSpec) and s.key == key})
            for coords in itertools.product(*(range(topo.get_dim(axis)) for axis in others)):
                at = dict(zip(others, coords))
                ranks = [topo.get_rank(pipe=stage, **at) for stage in stages]
                group = dist.new_group(ranks=ranks)
                if self.global_rank in ranks:
                    tied_comms[key] = {"ranks": ranks, "group": group, "weight_attr": self.tied_weight_attrs[key],
                                       "module": self.tied_modules[key]}
                    if self.global_rank != ranks[0]:  # counted once in a gradient norm
                        for p in self.tied_modules[key].parameters():
                            p.ds_pipe_replicated = True
        return tied_comms

    def meta_model(self) -> nn.Module:
        return self._layer_specs[0].module_args[0]

    def layer_names(self) -> List[str]:
        """Each pipeline layer by the classes of its parts (`Block`, `Embedding+Linear`): what
        partition_method=type:REGEX matches (every spec's own class is StageLayer)."""
        meta = self.meta_model()
        return ["+".join(type(meta.get_submodule(path)).__name__ for path in layer.paths)
                for layer in meta.pipeline_layers()]

    def _find_layer_type(self, layername):
        from zoo.run.errors import ConfigError

        names = self.layer_names()
        found = [i for i, name in enumerate(names) if re.search(layername, name, re.IGNORECASE)]
        if not found:
            kinds = list(dict.fromkeys(names))
            common = max(kinds, key=names.count)  # the repeated layer (a transformer block)
            raise ConfigError(f"parallel.partition_method=type:{layername} matches none of the pipeline's layers "
                              f"({', '.join(kinds)}); give a regular expression that matches the ones to balance, "
                              f"e.g. type:{common}")
        return found

    def _count_layer_params(self):
        """The partitioner's weights, counted on the meta model (no layer is built)."""
        meta = self.meta_model()
        return [sum(p.numel() for p in _unique_parameters(meta.get_submodule(path) for path in layer.paths))
                for layer in meta.pipeline_layers()]


@contextlib.contextmanager
def whole_sequence_shapes(engine):
    """Inside, a pipeline under context parallelism sends whole sequences between its stages
    (zoo.models.documents.whole_sequences: the in-loop tasks) where training sends a cp rank's
    share: the engine's cached activation shapes and buffers are dropped on entry and on exit,
    on every stage. Nothing changes for another engine or without cp."""
    reset = getattr(engine, "reset_activation_shape", None)
    if reset is None or getattr(engine.module, "context", None) is None:
        yield
        return
    reset()
    try:
        yield
    finally:
        reset()


def instruction_kinds() -> Dict[type, str]:
    """The pipeline schedule's instruction classes by the part of a step each is."""
    from deepspeed.runtime.pipe import schedule as s

    return {s.ForwardPass: "forward", s.BackwardPass: "backward", s.OptimizerStep: "optimizer",
            s.ReduceGrads: "optimizer", s.ReduceTiedGrads: "optimizer", s.LoadMicroBatch: "data",
            s.SendActivation: "send/recv", s.RecvActivation: "send/recv", s.SendGrad: "send/recv",
            s.RecvGrad: "send/recv"}


def wrap_instructions(engine, wrap: Callable[[Callable, str], Callable]) -> None:
    """From now on this pipeline engine runs each known instruction through `wrap(fn, kind)`."""
    base, kinds = type(engine)._INSTRUCTION_MAP, instruction_kinds()
    engine._INSTRUCTION_MAP = {k: wrap(fn, kinds[k]) if k in kinds else fn for k, fn in base.items()}


def unwrap_instructions(engine) -> None:
    """Back to the class's own instruction table (a no-op where it was not wrapped)."""
    with contextlib.suppress(KeyError):
        del vars(engine)["_INSTRUCTION_MAP"]

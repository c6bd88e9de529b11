"""DeepSpeed's pipeline engine as zoo uses it: a PipelineModule whose partitioner reads the
model's own layer list (its private hooks `_find_layer_type` and `_count_layer_params`,
answered from the meta model, so no layer is built to be counted), and the pipeline
engine's instruction table, which the profiler wraps to mark each instruction by its kind."""
from __future__ import annotations

import contextlib
import re
from typing import Callable, Dict, List

import torch.nn as nn
from deepspeed.pipe import PipelineModule


def _unique_parameters(modules) -> List[nn.Parameter]:
    return list({id(p): p for m in modules for p in m.parameters()}.values())


class LayerListPipelineModule(PipelineModule):
    """A PipelineModule whose specs each take the meta model as their first argument (zoo's
    StageLayer); the partitioner's names and weights come from that model's layer list."""

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

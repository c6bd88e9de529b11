"""A model's forward as a flat list of layers: what a pipeline cuts into stages.

Each model lists its layers in order (`pipeline_layers()`): the submodules a layer uses,
named by their paths in the full model, and what it computes from the previous layer's
output. The single-device forward runs that same list (`run_layers`), and
`zoo.parallel.pipeline` builds each stage's layers from it, so no forward pass is written
twice. Layers that share a weight across the model (the input embedding and the output
head) carry the same `tie` key.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn


@dataclass(frozen=True)
class PipeLayer:
    """One layer of a model's forward."""

    paths: Tuple[str, ...]
    """The submodules it uses, by their path in the full model (`h.3`, `embed.wte`)."""
    run: Optional[Callable[[nn.Module, Any], Any]] = None
    """(root, x) -> y, where root holds the submodules at `paths`; None: the one submodule's forward."""
    tie: Optional[str] = None
    """Layers with the same key share `tied_weight` (in a pipeline: a DeepSpeed TiedLayerSpec)."""
    tied_weight: Optional[str] = None
    """The shared parameter's path, e.g. `embed.wte.weight`."""
    checkpointable: bool = False
    """Recomputed in backward under activation checkpointing (the repeated blocks)."""

    def __call__(self, root: nn.Module, x: Any) -> Any:
        if self.run is None:
            return root.get_submodule(self.paths[0])(x)
        return self.run(root, x)


def run_layers(root: nn.Module, layers: Sequence[PipeLayer], x: Any, *, activation_checkpointing: bool = False) -> Any:
    """The forward of `root` through its layers, recomputing the checkpointable ones in
    backward when activation checkpointing is on (and the model is training)."""
    recompute = activation_checkpointing and root.training
    for layer in layers:
        if recompute and layer.checkpointable:
            x = torch.utils.checkpoint.checkpoint(layer, root, x, use_reentrant=False)
        else:
            x = layer(root, x)
    return x

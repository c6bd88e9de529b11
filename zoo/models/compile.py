"""`model.compile=true`: torch.compile of each rank's model, and the time it takes.

The rank's whole module (the model, or its pipeline stage) is compiled in place with
`nn.Module.compile`, so parameter names, checkpoints, the TP shards and the pipeline's
stages are the eager model's. The whole model, not each block: measured on 2 CPU cores
(tiny GPT, 4 layers d256, batch 8 x 256, one process), compiling each block ran a step in
871 ms against 832 eager, the whole model in 705 (the head's logits and the loss fuse).
The TP collectives are traced (zoo.parallel.mappings.all_reduce). Where dynamo cannot
trace a call (ZeRO-3's parameter hooks) it breaks the graph there and runs that call
eagerly: slower than one graph, never wrong.

Compilation happens lazily, at the first forward and backward of each graph (and again
for a new input shape or for evaluation's no-grad mode). Its wall time is collected from
dynamo's compile callbacks (`compile_seconds`), which the trainer subtracts from step
times: tokens/s and MFU count the training only, and the log and summary.json report the
compile time itself (`compile_s`).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from typing import Iterator, Optional

import torch.nn as nn

_lock = threading.Lock()
_state = {"installed": False, "seconds": 0.0, "started": None}


def c_compiler() -> Optional[str]:
    """The C++ compiler inductor uses on Linux CPUs ($CXX, else g++: torch._inductor.config.cpp.cxx),
    its path, or None if it is not an executable."""
    return shutil.which(os.environ.get("CXX") or "g++")


def _on_start(_args) -> None:
    with _lock:
        _state["started"] = time.perf_counter()


def _on_end(_args) -> None:
    with _lock:
        if _state["started"] is not None:
            _state["seconds"] += time.perf_counter() - _state["started"]
            _state["started"] = None


def _install_callbacks() -> None:
    """Dynamo's compile callbacks are per process (so is its code cache): installed once."""
    with _lock:
        if _state["installed"]:
            return
        import torch._dynamo

        torch._dynamo.callback.on_compile_start(_on_start)
        torch._dynamo.callback.on_compile_end(_on_end)
        _state["installed"] = True


def compile_seconds() -> float:
    """Wall seconds this process has spent compiling (dynamo tracing, AOT autograd, inductor)
    since the first `compile_model`; 0.0 before."""
    with _lock:
        return _state["seconds"]


def compile_model(module: nn.Module) -> int:
    """Compile this rank's model in place; the number of modules compiled. The whole model;
    under pipeline parallelism the module of each of the stage's layers that is a module's
    own forward or a block (the layers' wrapper, StageLayer.forward, is one function for
    every kind of layer: compiled, it recompiled per layer kind and grad mode until dynamo's
    limit sent it back to eager, 0.23x eager measured)."""
    from zoo.parallel.pipeline import StageLayer

    _install_callbacks()
    stage_layers = [m for m in module.modules() if isinstance(m, StageLayer)]
    if not stage_layers:
        module.compile()
        return 1
    # a layer that is its module's own forward (a GPT block, a ResNet block) or a checkpointable block
    blocks = [layer.get_submodule(layer.layer.paths[0]) for layer in stage_layers
              if layer.layer.checkpointable or layer.layer.run is None]
    for block in blocks:
        block.compile()
    return len(blocks)


@contextlib.contextmanager
def eager(module: nn.Module) -> Iterator[None]:
    """`module` and its submodules run their eager forward until the block ends (a compiled
    one's compiled call set aside): decoding and the evaluation's tally change the forward's
    inputs and attributes at every call, which would recompile it each time."""
    compiled = [(m, m._compiled_call_impl) for m in module.modules() if getattr(m, "_compiled_call_impl", None)]
    for m, _ in compiled:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, call in compiled:
            m._compiled_call_impl = call

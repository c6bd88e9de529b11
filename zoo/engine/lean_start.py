"""What a training start skips: DeepSpeed's shared-memory communication op and its op probe,
and the import of DeepSpeed's Muon optimizer.

DeepSpeed's torch backend builds `deepspeed_shm_comm` with gcc when it starts (~47 s on a
fresh machine, loading the built .so after that) for its inference all-reduce only; training
never calls it. The backend asks `deepspeed.ops.__compatible_ops__` first, a table DeepSpeed
fills on first access by probing every op it knows (compiling a test program against libaio
with gcc and printing the commands, at every start). The table is set before that access
with the one entry that is read on the training path (comm/torch.py `build_shm_op`): off.
Where the table was already probed, only that entry is switched off.

Every ZeRO engine (its sanity check, the ZeRO-1/2 and ZeRO-3 optimizers, the bf16 optimizer)
imports `deepspeed.runtime.zero.muon.muon_optimizer` to ask `isinstance(optimizer,
MuonWithAuxAdam)`. That module decorates its kernels with torch.compile at import, which
imports torch._inductor: ~3.7 s of every rank's start on 2 cores, for an optimizer zoo never
builds (it hands DeepSpeed torch's AdamW or SGD). Unless the raw `deepspeed:` config asks for
Muon, the module (and its kernels' module, which ZeRO-1/2 imports on the step path too) is
registered as a stand-in whose MuonWithAuxAdam no optimizer is an instance of, so every one of
those checks answers no without the import.

(torch._dynamo, which torch.optim's methods import at their first call, is skipped by handing
DeepSpeed zoo.engine.optimizers' subclasses of torch's AdamW and SGD instead.)
"""
from __future__ import annotations

from zoo.engine.versions import MUON_MODULES


def skip_shm_comm_op() -> None:
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        return
    if "__compatible_ops__" in vars(deepspeed.ops):  # probed already
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
    else:
        deepspeed.ops.__compatible_ops__ = {builder.NAME: False}


MUON = MUON_MODULES


class MuonWithAuxAdam:
    """The stand-in's class: never instantiated, so `isinstance(optimizer, it)` is False."""


def _not_used(*_args, **_kwargs):
    raise RuntimeError("zoo.engine.lean_start: DeepSpeed's Muon was skipped at start (zoo builds no Muon optimizer)")


def skip_muon_import(raw_deepspeed: dict) -> bool:
    """Register stand-ins for DeepSpeed's Muon modules (see above): the optimizer module and
    the kernels module, which ZeRO-1/2 also imports on the step path before it asks whether a
    group is Muon's. False where the raw config names a Muon optimizer or they are imported."""
    import sys
    import types

    kind = str((raw_deepspeed.get("optimizer") or {}).get("type", ""))
    if "muon" in kind.lower() or any(name in sys.modules for name in MUON):
        return False
    for name in MUON:
        stand_in = types.ModuleType(name, "zoo.engine.lean_start's stand-in: zoo builds no Muon optimizer")
        stand_in.MuonWithAuxAdam = MuonWithAuxAdam
        stand_in.muon_update = stand_in.adam_update = _not_used
        sys.modules[name] = stand_in
    return True

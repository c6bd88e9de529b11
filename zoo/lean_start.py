"""What a training start skips: DeepSpeed's shared-memory communication op and its op probe.

DeepSpeed's torch backend builds `deepspeed_shm_comm` with gcc when it starts (~47 s on a
fresh machine, loading the built .so after that) for its inference all-reduce only; training
never calls it. The backend asks `deepspeed.ops.__compatible_ops__` first, a table DeepSpeed
fills on first access by probing every op it knows (compiling a test program against libaio
with gcc and printing the commands, at every start). The table is set before that access
with the one entry that is read on the training path (comm/torch.py `build_shm_op`): off.
Where the table was already probed, only that entry is switched off.

(torch._dynamo cannot be skipped the same way: torch.optim's step imports it at every call,
torch/optim/optimizer.py `_use_grad`.)
"""
from __future__ import annotations


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

"""What a training start skips: DeepSpeed's shared-memory communication op.

DeepSpeed's torch backend builds `deepspeed_shm_comm` with gcc when it starts (~47 s on a
fresh machine, loading the built .so after that) for its inference all-reduce only; training
never calls it. The backend builds it only where `deepspeed.ops.__compatible_ops__` says it
can, so that entry is set off before `deepspeed.init_distributed`.

(torch._dynamo cannot be skipped the same way: torch.optim's step imports it at every call,
torch/optim/optimizer.py `_use_grad`.)
"""
from __future__ import annotations


def skip_shm_comm_op() -> None:
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False

"""DeepSpeed's communication backend: the collective functions its torch backend took from
torch.distributed when it was created (so patching torch.distributed does not reach them),
for the monitor's communication timer (zoo.observe.comm_timer)."""
from __future__ import annotations

from typing import Callable, List, Tuple


def backend_functions() -> List[Tuple[object, str, Callable]]:
    """(object, attribute, torch.distributed's function now) for each collective DeepSpeed's
    backend holds, to set it to; empty where DeepSpeed's communication is not set up."""
    try:
        from deepspeed.comm import comm as ds_comm
    except ImportError:
        return []
    cdb = ds_comm.cdb
    if cdb is None or not hasattr(cdb, "all_gather_function"):
        return []
    return [(cdb, "all_gather_function", cdb.get_all_gather_function()),
            (cdb, "reduce_scatter_function", cdb.get_reduce_scatter_function())]

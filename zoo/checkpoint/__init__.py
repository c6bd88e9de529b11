"""Checkpoints and weights in and out: the layout-free checkpoint directory (`layout_free`:
save under one layout, resume under any; each rank's shard in `sharded`, synchronously or in
the background), the earlier format's reader (`format1`), the run's final weights (`final`),
full weights of small models (`consolidate`, `weights`) and Hugging Face transformers
directories (`hf`, `export`). DeepSpeed's own per-rank files are zoo.engine.native."""
from zoo.checkpoint.layout_free import (
    FORMAT,
    PendingSave,
    check_compatible,
    finish,
    load,
    read_state,
    resolve,
    save,
)
from zoo.run.errors import CheckpointError

__all__ = ["FORMAT", "CheckpointError", "PendingSave", "check_compatible", "finish", "load", "read_state", "resolve",
           "save"]

"""Checkpoints and weights in and out: the layout-free format (`layout_free`: save under
one layout, resume under any), DeepSpeed's own per-rank files for same-layout resumes
(`native`), the consolidated weights of a run (`consolidate`, `weights`) and Hugging Face
transformers directories (`hf`, `export`)."""
from zoo.checkpoint.layout_free import (
    FORMAT,
    check_compatible,
    load,
    read_state,
    resolve,
    save,
)
from zoo.errors import CheckpointError

__all__ = ["FORMAT", "CheckpointError", "check_compatible", "load", "read_state", "resolve", "save"]

"""The consolidated weights of a finished run: `model.safetensors` (the plain model's full
state dict, the family and shape in its metadata, which export reads), and loading them into
the plain model."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def save_weights(state: dict, path: Path, meta: dict) -> None:
    """Write consolidated weights atomically as safetensors, the model's family and shape
    in the metadata (what export needs)."""
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file(state, str(tmp), metadata={"family": meta["family"], "shape": json.dumps(meta["shape"])})
    tmp.replace(path)


def load_plain(model: torch.nn.Module, state: dict) -> None:
    """Load consolidated weights (tied parameters appear once) into the plain model."""
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - tied or unexpected:
        raise ValueError(f"weights do not match the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")

"""Loading a run's consolidated weights (`model.safetensors`, written by zoo.checkpoint.final)
into the plain model."""
from __future__ import annotations

import torch


def load_plain(model: torch.nn.Module, state: dict) -> None:
    """Load consolidated weights (tied parameters appear once) into the plain model."""
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if set(missing) - tied or unexpected:
        raise ValueError(f"weights do not match the model: missing {sorted(set(missing) - tied)}, "
                         f"unexpected {sorted(unexpected)}")

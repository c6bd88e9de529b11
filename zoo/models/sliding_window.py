"""Sliding-window attention (Mistral): a query at position p attends to the keys at p - window + 1
.. p only, on top of the causal or document mask. An additive mask (0 or -inf) over this
forward's queries and keys, built once a forward for all layers: a plain causal one is cached by
its sizes, a document mask carries its windowed copy (as zoo.models.documents keeps the mask on
its positions). Where the keys are no more than the window, nothing changes (None)."""
from __future__ import annotations

import functools
from typing import Optional

import torch


def _band(T: int, L: int, start: int, window: int, causal: bool, device) -> torch.Tensor:
    """(T, L) bool: query i (at position start + i) sees key j."""
    q = torch.arange(start, start + T, device=device)[:, None]
    k = torch.arange(L, device=device)[None, :]
    seen = (q - k) < window
    return seen & (k <= q) if causal else seen


@functools.lru_cache(maxsize=4)
def _causal_window(T: int, L: int, start: int, window: int, dtype: torch.dtype, device) -> torch.Tensor:
    allowed = _band(T, L, start, window, True, device)
    return torch.zeros(T, L, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


def windowed_mask(mask: Optional[torch.Tensor], causal: bool, T: int, L: int, start: int, window: Optional[int],
                  dtype: torch.dtype, device) -> Optional[torch.Tensor]:
    """The additive mask with the window applied, or None where the window cuts nothing (L keys
    <= window). `mask`: the document mask (additive, (B, 1, T, L)) or None; `causal`: whether
    the call is causal (a prompt or training), else every key so far is seen (a decoded token)."""
    if window is None or L <= window:
        return None
    if mask is None:
        if torch.compiler.is_compiling():
            return _causal_window.__wrapped__(T, L, start, window, dtype, device)
        return _causal_window(T, L, start, window, dtype, device)
    kept = getattr(mask, "_zoo_window_mask", None)
    if kept is None or kept[0] != (start, window):
        band = _band(T, L, start, window, False, device)
        kept = ((start, window), mask.masked_fill(~band, float("-inf")))
        if not torch.compiler.is_compiling():
            mask._zoo_window_mask = kept
    return kept[1]

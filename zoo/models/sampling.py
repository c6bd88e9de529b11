"""Sampling text from a plain causal language model (`model(idx)` -> logits (B, T, V))."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, *, block_size: int, temperature: float = 0.8,
             top_k: int = 40, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Sample continuations (top-k, temperature), feeding at most `block_size` tokens back."""
    for _ in range(max_new_tokens):
        ctx = idx[:, -block_size:]
        logits = model(ctx)[:, -1, :] / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = F.softmax(logits.float(), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator)
        idx = torch.cat([idx, nxt], dim=1)
    return idx

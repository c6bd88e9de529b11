"""What the decoder-only language models share: a base module whose forward runs the model's
own layer list (`pipeline_layers()`, zoo.models.stages) to logits or to the mean token loss,
and sampling from it."""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.documents import ReadsContext, whole_sequences
from zoo.models.kv_cache import DecodeCache, decoding
from zoo.models.losses import cross_entropy_per_token, masked_mean
from zoo.models.stages import run_layers


class HeadLogits:
    """The output head's layer: `root.lm_head(x)`, (B, T, V) logits, vocab-sharded under
    tensor parallelism. With `vocab_real` (an imported vocabulary padded for the split) the
    pad tokens' logits are the dtype's lowest value: softmax, loss and sampling never see
    them, and their rows get no gradient. A finite value, not -inf, so a shard of pad alone
    stays finite in the vocab-parallel max."""

    def __init__(self, vocab_real: Optional[int] = None):
        self.vocab_real = vocab_real

    def __call__(self, root: nn.Module, x: torch.Tensor) -> torch.Tensor:
        head = root.lm_head
        logits = head(x)
        if self.vocab_real is None:
            return logits
        width = logits.shape[-1]
        start = 0 if getattr(head, "gather_output", True) else getattr(head, "output_start", 0)
        if start + width <= self.vocab_real:
            return logits
        pad = torch.arange(start, start + width, device=logits.device) >= self.vocab_real
        return logits.masked_fill(pad, torch.finfo(logits.dtype).min)


class CausalLM(ReadsContext, nn.Module):
    """`forward(idx)` gives logits (B, T, V); `forward(idx, targets)` the mean loss over the
    positions whose target is not -100. Subclasses build their modules and list them."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        # Replaced by the vocab-parallel loss when the head is sharded.
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy_per_token
        self.activation_checkpointing = False
        self.document_end: Optional[int] = None
        """The end-of-text token id with `data.document_mask` (zoo.models.documents): attention
        and positions stay inside each document. Set before `pipeline_layers()` is read."""
        # Under context parallelism (`context`, ReadsContext) the forward takes the whole block,
        # runs this rank's share of it and returns its logits, or the block's mean loss (the same
        # on every rank of the group).

    def pipeline_layers(self):
        raise NotImplementedError

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        T = idx.shape[1]
        assert T <= self.shape.block_size, f"sequence length {T} > block_size {self.shape.block_size}"
        logits = run_layers(self, self.pipeline_layers(), idx, activation_checkpointing=self.activation_checkpointing)
        if targets is None:
            return logits
        shard = self.sharded()
        if shard is not None:
            return shard.mean_loss(self.loss_fn(logits, shard.take(targets)), targets)
        return masked_mean(self.loss_fn(logits, targets), targets)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, **sampling) -> torch.Tensor:
        with whole_sequences(self):  # decoding runs whole sequences
            return generate(self, idx, max_new_tokens, block_size=self.shape.block_size, **sampling)


def pick_tokens(logits: torch.Tensor, *, temperature: float, top_k: int,
                generator: Optional[torch.Generator]) -> torch.Tensor:
    """(B, V) logits of the next position -> (B, 1) tokens: the most likely with temperature
    0, else sampled from the top-k at that temperature (in float32)."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def decode(run: Callable[[torch.Tensor], object], choose: Callable[[object], torch.Tensor], idx: torch.Tensor,
           max_new_tokens: int, *, block_size: int, cache: Optional[DecodeCache], stop: Optional[int] = None) -> torch.Tensor:
    """The decoding loop: `run(tokens)` is the model's forward of the tokens not yet run (all of
    the context the first time, then the last token; with no `cache` the whole context each
    time), `choose(out)` the (B, 1) next tokens from its output. At most `block_size` tokens
    are fed back; once the context is longer, every position moves and each step runs the
    last `block_size` tokens afresh (the cache cleared: they are a new prompt). `stop`: a token
    that ends the decoding once every row has chosen it (a chat turn's end)."""
    for _ in range(max_new_tokens):
        if cache is not None and idx.shape[1] <= block_size:
            new = idx[:, cache.length:]
        else:
            new = idx[:, -block_size:]
            if cache is not None:
                cache.clear()
        out = run(new)
        if cache is not None:
            cache.advance(new.shape[1])
        chosen = choose(out).to(idx.device)
        idx = torch.cat([idx, chosen], dim=1)
        if stop is not None and bool((chosen == stop).all()):
            break
    return idx


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, *, block_size: int, temperature: float = 0.8,
             top_k: int = 40, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Sample continuations (top-k, temperature; 0: greedy) with a decode cache, feeding at
    most `block_size` tokens back."""
    def choose(logits):
        return pick_tokens(logits[:, -1, :], temperature=temperature, top_k=top_k, generator=generator)

    if model.document_end is not None:  # document masking computes positions from the tokens: no cache
        return decode(model, choose, idx, max_new_tokens, block_size=block_size, cache=None)
    with decoding(model, block_size) as cache:
        return decode(model, choose, idx, max_new_tokens, block_size=block_size, cache=cache)

"""Sampling from the distributed model in place (the end-of-run sample): every rank runs its
share of the forward as in training, and no rank builds or holds the whole model.

Tensor-parallel ranks run their heads and vocabulary shard, and the last position's logits are
gathered over tp (V floats, not the model); pipeline stages pass the hidden state of the new
tokens from stage to stage point to point (the same coordinates on the next stage); under
ZeRO-3 every data-parallel rank runs the forward, which gathers the parameters piece by piece
as in training; other data-parallel replicas only take the tokens. One rank (the last stage's,
tp 0, dp 0) picks each token and broadcasts it to every rank. A decode cache
(zoo.models.kv_cache) keeps each rank's own heads' keys and values of its own layers, so a
token costs one position's forward; sequence parallelism (which splits the sequence over tp)
and document masking (positions from the tokens) run the whole context each time instead,
right-padded to a multiple of tp under sequence parallelism (causal: the padding changes no
earlier position).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from zoo.models.causal_lm import decode, pick_tokens
from zoo.models.documents import whole_sequences
from zoo.models.kv_cache import decoding
from zoo.parallel.context import context_zero
from zoo.parallel.topology import Layout, tp_group

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.float64]
_HEADER = 24  # int64 slots: tensors, then (dtype, ndim, *shape) of each


def _send(payload, dst: int, device: torch.device) -> None:
    tensors = payload if isinstance(payload, (tuple, list)) else (payload,)
    header = [len(tensors)]
    for t in tensors:
        header += [_DTYPES.index(t.dtype), t.dim(), *t.shape]
    if len(header) > _HEADER:
        raise ValueError(f"a stage's output of {len(tensors)} tensors does not fit the {_HEADER}-slot header")
    dist.send(torch.tensor(header + [0] * (_HEADER - len(header)), dtype=torch.int64, device=device), dst)
    for t in tensors:
        dist.send(t.contiguous(), dst)


def _recv(src: int, device: torch.device):
    header = torch.empty(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src)
    header, at, tensors = header.tolist(), 1, []
    for _ in range(header[0]):
        dtype, ndim = _DTYPES[header[at]], header[at + 1]
        t = torch.empty(header[at + 2:at + 2 + ndim], dtype=dtype, device=device)
        dist.recv(t, src)
        tensors.append(t)
        at += 2 + ndim
    return tensors[0] if len(tensors) == 1 else tuple(tensors)


@dataclass
class Sampling:
    """What a sample asks for: the prompt's token ids and how to continue it."""

    prompt: Sequence[int]
    max_new_tokens: int
    block_size: int
    temperature: float = 0.8
    top_k: int = 40
    seed: int = 0
    document_mask: bool = False
    """The model attends within documents (positions from the tokens): decoded without a cache."""
    stop: Optional[int] = None
    """A token that ends the sample once chosen (a chat turn's end); None: max_new_tokens always."""


class InPlaceDecoder:
    """The model's distributed forward for decoding: `logits(tokens)` runs this rank's share of
    it on (1, T) token ids and returns the last real position's full-vocabulary logits (1, V)
    on the ranks of the last stage, None elsewhere."""

    def __init__(self, module: nn.Module, grid, layout: Layout, device: torch.device, *,
                 sequence_parallel: bool, document_mask: bool):
        self.module, self.grid, self.layout, self.device = module, grid, layout, device
        self.tp_group = tp_group(grid)
        self.stage, self.last_stage = grid.get_stage_id(), layout.pp - 1
        self.sequence_parallel = sequence_parallel and layout.tp > 1
        self.cached = not (self.sequence_parallel or document_mask)
        dp_rank = grid.get_data_parallel_rank()
        # ZeRO-3's forward gathers each piece over dp: every replica runs it. Else replica 0 only.
        self.runs = dp_rank == 0 or layout.zero_stage == 3
        self.chooser = grid.stage_to_global(self.last_stage, data=0, model=0, **context_zero(grid))
        head = _head(module)  # a vocab-sharded head's logits are gathered over tp (found once, not per token)
        self.gathers = self.tp_group is not None and head is not None and not getattr(head, "gather_output", True)

    def logits(self, tokens: torch.Tensor) -> Optional[torch.Tensor]:
        T = tokens.shape[1]
        if self.sequence_parallel and T % self.layout.tp:  # right-padded: causal, no earlier position changes
            tokens = torch.cat([tokens, tokens.new_zeros(1, self.layout.tp - T % self.layout.tp)], dim=1)
        x = tokens.to(self.device)
        if self.layout.pp > 1 and self.stage > 0:
            x = _recv(self.grid.stage_to_global(self.stage - 1), self.device)
        with whole_sequences(self.module):  # a cp rank decodes whole sequences too
            out = self.module(x)
        if self.stage < self.last_stage:
            _send(out, self.grid.stage_to_global(self.stage + 1), self.device)
            return None
        return self._gathered(out[:, T - 1, :])

    def _gathered(self, last: torch.Tensor) -> torch.Tensor:
        """The vocab-sharded head's shards, in tp order (each rank's `output_start` follows)."""
        if not self.gathers:
            return last
        parts = [torch.empty_like(last) for _ in range(self.layout.tp)]
        dist.all_gather(parts, last.contiguous(), group=self.tp_group)
        return torch.cat(parts, dim=-1)


def _head(module: nn.Module) -> Optional[nn.Module]:
    """The output head (`lm_head`) of a plain model or of the last pipeline stage."""
    found = [m for name, m in module.named_modules() if name == "lm_head" or name.endswith(".lm_head")]
    return found[-1] if found else None


@torch.no_grad()
def sample_in_place(decoder: InPlaceDecoder, want: Sampling) -> List[int]:
    """The prompt and its continuation, the same list on every rank (collective: every rank
    of the job calls it)."""
    module, rank = decoder.module, dist.get_rank()
    generator = torch.Generator().manual_seed(want.seed)
    was_training = module.training
    module.eval()

    def run(tokens: torch.Tensor):
        return decoder.logits(tokens) if decoder.runs else None

    def choose(logits: Optional[torch.Tensor]) -> torch.Tensor:
        token = torch.zeros(1, 1, dtype=torch.int64, device=decoder.device)
        if rank == decoder.chooser:
            token[:] = pick_tokens(logits, temperature=want.temperature, top_k=want.top_k, generator=generator)
        dist.broadcast(token, src=decoder.chooser)
        return token.cpu()

    idx = torch.tensor([list(want.prompt)], dtype=torch.int64)
    try:
        with decoding(module, want.block_size) if decoder.cached else contextlib.nullcontext() as cache:
            idx = decode(run, choose, idx, want.max_new_tokens, block_size=want.block_size, cache=cache, stop=want.stop)
    finally:
        module.train(was_training)
    return idx[0].tolist()

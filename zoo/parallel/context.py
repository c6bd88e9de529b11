"""Context parallelism (`parallel.cp`): each rank of a cp group holds a share of every sequence.

The block is cut into 2 x cp chunks and rank i holds chunks i and 2cp-1-i (Megatron's and
torchtitan's load balancing: under causal attention a late chunk attends to more keys than an
early one, and the pair evens the work: every rank's queries see (2cp+1) chunks of keys). Every
operation but attention is per token and runs on the rank's share alone; attention all-gathers
the keys and values over the group (the Llama 3 paper's choice: one collective per layer on the
key/value heads, which grouped-query attention makes a fraction of the hidden size, and no
online-softmax merge; a ring's send/receive of the blocks overlaps its transfers with compute,
which matters on a GPU interconnect more than on gloo) and runs each local chunk against the
keys up to its own end, causal among its own positions. The gather's backward is a reduce-
scatter: every rank's queries contributed to the gradient of each rank's keys and values.

Every rank of the group is handed the whole block (token ids are small): the first layer
computes the global positions (or the document positions under `data.document_mask`, a
document may span ranks) on the whole block and keeps its share, and the loss is this rank's
targets' sum over the block's target count, summed over the group (an all-reduce forward, an
identity backward): the global mean on every rank, and each rank's gradient its share of it,
which DeepSpeed sums over cp and averages over dp (zoo.parallel.context_grid).

The parallelize step hands the shard to the model and its attention layers (their `context`,
zoo.models.documents.ReadsContext); what a forward's block holds (its document positions, the
masks built from them) is kept on the shard for that forward, not on a tensor: ZeRO-3's module
hooks hand layers new tensor objects. `zoo.models.documents.whole_sequences` turns it off for
decoding and the in-loop tasks.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from zoo.parallel.mappings import _gather, _reduce_scatter, reduce_from_tp_region

HEAD_DIM_SEQUENCE = 2  # attention's (B, heads, T, head_dim)
PROFILE_RANGE = "zoo.cp"  # the profiler's breakdown counts what it covers as cp communication (zoo.observe.breakdown)


class ContextShard:
    """This rank's share of every sequence in a cp group of `size` ranks."""

    def __init__(self, group, rank: int, size: int, recompute: bool = False):
        self.group, self.rank, self.size = group, rank, size
        self.recompute = recompute  # parallel.cp_recompute: the gather and attention again in the backward
        self.enabled = True  # off inside whole_sequences
        self._block: Optional[torch.Tensor] = None  # the forward's block's document positions (None: none)
        self._masks: Optional[list] = None  # the forward's chunk masks, built by its first attention
        self._window: Optional[int] = None  # the sliding window they were built for
        self.unbuilt_causal: Optional[bool] = None  # causal_lower_right, not a built mask (None: on CUDA)

    @property
    def chunks(self) -> Tuple[int, int]:
        """The global chunks this rank holds, of 2 x size."""
        return self.rank, 2 * self.size - 1 - self.rank

    def take(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's two chunks of `x` along `dim`, the earlier first."""
        T = x.shape[dim]
        if T % (2 * self.size):
            raise ValueError(f"a sequence of {T} tokens does not split into 2 x parallel.cp = {2 * self.size} "
                             f"equal chunks; use a block size divisible by {2 * self.size}")
        c = T // (2 * self.size)
        return torch.cat([x.narrow(dim, i * c, c) for i in self.chunks], dim=dim)

    def share(self, idx: torch.Tensor, positions: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(this rank's token ids, their positions) of the whole block's ids, at the start of a
        forward; `positions`: the block's document positions, None for 0..T-1 (kept for the
        masks of this forward's attention layers, and of their recomputation in its backward)."""
        B, T = idx.shape
        self._block, self._masks = positions, None
        full = torch.arange(T, device=idx.device).expand(B, T) if positions is None else positions
        return self.take(idx), self.take(full).contiguous()

    def enter(self, block: torch.Tensor) -> None:
        """A layer of a forward whose block's document positions `share` took (carried to every
        pipeline stage beside the hidden states): its masks are that block's. A stage runs other
        micro-batches' forwards between a micro-batch's forward and its recomputation."""
        if block is not self._block:
            self._block, self._masks = block, None

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """(B, heads, T/cp, d) of this rank's chunks -> (B, heads, T, d) in global order."""
        return _GatherContext.apply(t, self)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attend: Callable,
                  window: Optional[int] = None) -> torch.Tensor:
        """Attention of this rank's queries over the whole sequence's keys and values:
        `attend(q, k, v, mask)` the layer's own SDPA call with the chunk's mask (`window`: a
        query sees only the keys fewer than that many positions back, Mistral's sliding
        window). With `recompute` the backward gathers and attends again (torch's non-reentrant
        checkpoint: it keeps this rank's q, k, v and the masks, not the gathered keys and values)."""
        c = q.shape[HEAD_DIM_SEQUENCE] // 2
        masks = self.masks(c, q.dtype, q.device, window)  # outside: kept once, not rebuilt
        if self.recompute and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._attention, q, k, v, masks, attend, use_reentrant=False)
        return self._attention(q, k, v, masks, attend)

    def _attention(self, q, k, v, masks, attend) -> torch.Tensor:
        k, v = self.gather(k), self.gather(v)
        c = q.shape[HEAD_DIM_SEQUENCE] // 2
        out = []
        for j, (g, mask) in enumerate(zip(self.chunks, masks)):
            n = (g + 1) * c  # the keys up to this chunk's end
            out.append(attend(q.narrow(HEAD_DIM_SEQUENCE, j * c, c), k.narrow(HEAD_DIM_SEQUENCE, 0, n),
                              v.narrow(HEAD_DIM_SEQUENCE, 0, n), mask))
        return torch.cat(out, dim=HEAD_DIM_SEQUENCE)

    def masks(self, c: int, dtype: torch.dtype, device: torch.device, window: Optional[int] = None) -> list:
        """Each chunk's mask over the keys before its end: causal, bottom-right aligned (with
        `window`, also no key `window` or more positions before its query). On CUDA
        torch's `causal_lower_right`, which the flash and memory-efficient kernels take without
        building it; elsewhere (the CPU's kernels build it in every call, and keep it for the
        backward: a layer's c x keys floats) a (c, keys) mask built once per forward and kept for
        its other layers. Where the block has documents, a (B, 1, c, keys) mask that also keeps
        each query inside its document, likewise built once. Boolean (a byte an element) where
        the attention is recomputed in the backward, or not differentiated: SDPA's float copy
        of it is then a transient of one call; additive in `dtype` (0 or -inf) where each layer's
        SDPA keeps its mask for the backward, so that the layers keep this one, not a copy each."""
        unbuilt = device.type == "cuda" if self.unbuilt_causal is None else self.unbuilt_causal
        if window is not None and window >= 2 * self.size * c:
            window = None  # no query has keys that far back
        if self._block is None and unbuilt and window is None:
            from torch.nn.attention.bias import causal_lower_right

            return [causal_lower_right(c, (g + 1) * c) for g in self.chunks]
        additive = torch.is_grad_enabled() and not self.recompute
        if not additive:
            dtype = torch.bool
        if self._masks is not None and (self._masks[0].dtype, self._window) == (dtype, window):
            return self._masks
        doc = None if self._block is None else (self._block == 0).cumsum(dim=1)  # each token's document
        masks = []
        for g in self.chunks:
            n = (g + 1) * c
            allowed = torch.ones(c, n, dtype=torch.bool, device=device).tril(diagonal=n - c)
            if window is not None:  # query g*c + i, key j: i + g*c - j < window
                back = torch.arange(g * c, n, device=device)[:, None] - torch.arange(n, device=device)[None, :]
                allowed &= back < window
            if doc is not None:
                allowed = (allowed & (doc[:, g * c:n, None] == doc[:, None, :n]))[:, None]
            masks.append(torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
                         if additive else allowed)
        if not torch.compiler.is_compiling():
            self._masks, self._window = masks, window
        return masks

    def mean_loss(self, per_token: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The block's mean loss on every rank of the group: `per_token` (B, T/cp) this rank's
        losses, `targets` (B, T) the whole block's (-100: no target)."""
        mask = (self.take(targets) != -100).to(per_token.dtype)
        count = (targets != -100).sum().clamp_min(1).to(per_token.dtype)
        return reduce_from_tp_region((per_token * mask).sum() / count, self.group)


def context_shard(grid, recompute: bool = False) -> Optional[ContextShard]:
    """This rank's shard under the grid's context parallelism (None without)."""
    if not hasattr(grid, "get_sequence_parallel_group"):
        return None
    return ContextShard(grid.get_sequence_parallel_group(), grid.get_sequence_parallel_rank(),
                        grid.get_sequence_parallel_world_size(), recompute=recompute)


def context_rank(grid) -> int:
    """This rank's place in its cp group (0 without context parallelism)."""
    return grid.get_sequence_parallel_rank() if hasattr(grid, "get_sequence_parallel_rank") else 0


def context_zero(grid) -> dict:
    """The coordinate of a cp group's first rank, for `grid.stage_to_global` (none without cp)."""
    return {"context": 0} if hasattr(grid, "get_sequence_parallel_rank") else {}


def _global_order(x: torch.Tensor, size: int) -> torch.Tensor:
    """Rank order (rank r's chunks r, 2size-1-r, then rank r+1's) -> chunks 0..2size-1."""
    c = x.shape[HEAD_DIM_SEQUENCE] // (2 * size)
    slot = [2 * g if g < size else 2 * (2 * size - 1 - g) + 1 for g in range(2 * size)]
    return torch.cat([x.narrow(HEAD_DIM_SEQUENCE, s * c, c) for s in slot], dim=HEAD_DIM_SEQUENCE)


def _rank_order(x: torch.Tensor, size: int) -> torch.Tensor:
    c = x.shape[HEAD_DIM_SEQUENCE] // (2 * size)
    chunks = [g for r in range(size) for g in (r, 2 * size - 1 - r)]
    return torch.cat([x.narrow(HEAD_DIM_SEQUENCE, g * c, c) for g in chunks], dim=HEAD_DIM_SEQUENCE)


class _GatherContext(torch.autograd.Function):
    """All-gather the cp group's chunks into global order; the backward reduce-scatters."""

    @staticmethod
    def forward(ctx, t, shard: ContextShard):
        ctx.shard = shard
        with torch.profiler.record_function(PROFILE_RANGE):
            return _global_order(_gather(t, HEAD_DIM_SEQUENCE, shard.group), shard.size)

    @staticmethod
    def backward(ctx, grad):
        shard = ctx.shard
        with torch.profiler.record_function(PROFILE_RANGE):
            return _reduce_scatter(_rank_order(grad.contiguous(), shard.size), HEAD_DIM_SEQUENCE, shard.group), None

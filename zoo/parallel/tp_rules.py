"""Tensor-parallel rules as data, and the one function that applies them.

A model family's `TPRules` (its spec in `zoo.families` holds it) is a table of (module-name
pattern, style), the parameters tied across the swap and what sequence parallelism touches. `column`
splits a Linear's outputs, `column_qkv` splits a fused [q; k; v] projection so each rank
holds whole heads, `row` splits a Linear's inputs and all-reduces its output, `vocab`
splits an embedding's rows, and `head` is the output layer tied to the vocab-parallel
embedding (its logits stay vocab-sharded and go into the vocab-parallel loss). A
`KVHeads` style is a grouped-query key or value projection: split like `column` when tp
divides its heads, else replicated on every rank (`ReplicatedHeadsLinear`). Attention
is split by heads, the MLP by columns then rows: two all-reduces per layer in forward and
two in backward.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn

from zoo.parallel.cross_entropy import vocab_parallel_cross_entropy
from zoo.parallel.layers import (
    ColumnParallelLinear,
    ReplicatedHeadsLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from zoo.parallel.mappings import (
    group_size,
    reduce_from_tp_region,
    scatter_to_sequence_parallel_region,
)

Plan = Sequence[Tuple[str, str]]


@dataclass(frozen=True)
class KVHeads:
    """The style of a grouped-query key or value projection of `n_kv_head` heads serving
    `n_head` query heads."""

    n_head: int
    n_kv_head: int


@dataclass(frozen=True)
class TPRules:
    """How one model family is split over a tensor-parallel group."""

    layers: Plan
    """(module-name pattern, style) in the full model's names; the first match wins."""
    ties: Tuple[Tuple[str, str], ...] = ()
    """(parameter, the parameter it is tied to): tied again wherever a module holds both,
    after a swap or after materialising (which unties them)."""
    embedding: Optional[str] = None
    """The module whose output sequence parallelism splits along the sequence; None: this
    family has no sequence parallelism."""
    sequence_parallel_norms: Tuple[str, ...] = ()
    """Replicated modules that see a sequence shard under sequence parallelism."""
    head_norms: Tuple[str, ...] = ()
    """Replicated modules applied to each of this rank's heads (Qwen3's q/k norms): their
    gradients are this rank's heads' share, summed over the tp group whenever tp > 1."""


def _replacement(module: nn.Module, style, tp_group, sequence_parallel: bool, device) -> nn.Module:
    if isinstance(style, KVHeads):
        if style.n_kv_head % group_size(tp_group) == 0:
            style = "column"
        else:
            return ReplicatedHeadsLinear(module.in_features, module.out_features, tp_group, n_head=style.n_head,
                                         n_kv_head=style.n_kv_head, sequence_parallel=sequence_parallel,
                                         bias=module.bias is not None, device=device)
    if style == "vocab":
        return VocabParallelEmbedding(module.num_embeddings, module.embedding_dim, tp_group, device=device)
    if style in ("column", "column_qkv", "head"):
        return ColumnParallelLinear(module.in_features, module.out_features, tp_group,
                                    bias=module.bias is not None, sequence_parallel=sequence_parallel,
                                    chunks=3 if style == "column_qkv" else 1, device=device)
    if style == "row":
        return RowParallelLinear(module.in_features, module.out_features, tp_group,
                                 bias=module.bias is not None, sequence_parallel=sequence_parallel, device=device)
    raise ValueError(f"unknown tensor-parallel style {style!r}; use column, column_qkv, row, vocab or head")


def _set_submodule(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


def _sum_grad_over(group):
    return lambda grad: reduce_from_tp_region(grad, group)


def _find_submodule(root: nn.Module, name: str) -> Optional[nn.Module]:
    try:
        return root.get_submodule(name)
    except AttributeError:
        return None


def _find_parameter(root: nn.Module, name: str) -> Optional[nn.Parameter]:
    try:
        return root.get_parameter(name)
    except AttributeError:
        return None


def tie_parameters(module: nn.Module, rules: TPRules) -> None:
    """Tie each of the rules's tied pairs that `module` holds both ends of."""
    for name, source in rules.ties:
        target, tied_to = _find_parameter(module, name), _find_parameter(module, source)
        if target is not None and tied_to is not None:
            owner, _, attr = name.rpartition(".")
            setattr(module.get_submodule(owner), attr, tied_to)


def apply_tp_rules(model: nn.Module, tp_group, *, rules: TPRules,
                  sequence_parallel: bool = False, device: torch.device = torch.device("cpu"),
                  prefix: str = "") -> nn.Module:
    """Swap the rules's submodules of `model` (names relative to the full model via `prefix`)
    for this rank's tensor-parallel shards, in place."""
    if sequence_parallel and rules.embedding is None:
        raise ValueError("this model family has no sequence-parallel rules; set parallel.sequence_parallel=false")
    names = [(n, m) for n, m in model.named_modules() if n]
    for name, module in names:
        full = prefix + name
        style = next((s for pattern, s in rules.layers if fnmatch(full, pattern)), None)
        if style is not None:
            _set_submodule(model, name, _replacement(module, style, tp_group, sequence_parallel, device))
    tie_parameters(model, rules)  # the tie survives the swap
    if hasattr(model, "loss_fn"):
        model.loss_fn = functools.partial(vocab_parallel_cross_entropy, tp_group=tp_group)
    embedding = _find_submodule(model, rules.embedding) if sequence_parallel else None
    if embedding is not None:  # this module (or pipeline stage) holds the embedding
        embedding.register_forward_hook(
            lambda _m, _i, out: scatter_to_sequence_parallel_region(out, tp_group))
    return model


def sum_replicated_grads(model: nn.Module, tp_group, rules: TPRules, *, sequence_parallel: bool,
                         prefix: str = "") -> None:
    """Sum over the tp group the gradients of the replicated parameters each rank computes only a
    share of: the rules's head norms, and with sequence parallelism its norms. Call after the
    parameters are materialised: hooks live on the tensors."""
    patterns = tuple(rules.head_norms) + (tuple(rules.sequence_parallel_norms) if sequence_parallel else ())
    if tp_group is None or group_size(tp_group) == 1 or not patterns:
        return
    for name, module in model.named_modules():
        if any(fnmatch(prefix + name, pattern) for pattern in patterns):
            for p in module.parameters():
                p.sequence_parallel = True
                p.register_hook(_sum_grad_over(tp_group))

"""Building one rank's model: the single-device module (or, under pipeline parallelism,
only this stage's pieces of it) is built on the meta device, the parallelize step swaps in
this rank's tensor-parallel shards, then every parameter is materialised on the device and
filled by the layout-free initialisation. A sharded rank never holds the full model.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.gpt import GPT, Block, Embeddings, GPTShape, gpt_init_std
from zoo.models.init import init_parameters
from zoo.parallel.mappings import copy_to_tp_region, gather_from_sequence_parallel_region
from zoo.parallel.parallelize import parallelize
from zoo.parallel.plans import sum_sequence_parallel_norm_grads


def count_parameters(shape: GPTShape) -> int:
    """Parameters of the full (unsharded) model, counted on the meta device."""
    with torch.device("meta"):
        model = GPT(shape)
    return sum(p.numel() for p in model.parameters())


def _materialise(module: nn.Module, shape: GPTShape, *, seed: int, device: torch.device, tp_group,
                 sequence_parallel: bool) -> None:
    """Parallelize a meta-device module in place, allocate it on `device` and initialise it.
    Its parameter names must be the full model's (e.g. `h.3.attn.c_attn.weight`)."""
    parallelize(module, tp_group=tp_group, sequence_parallel=sequence_parallel, device=device)
    module.to_empty(device=device)
    if isinstance(module, GPT):
        module.lm_head.weight = module.embed.wte.weight  # materialising untied them
    init_parameters(module, seed, lambda name: gpt_init_std(name, shape))
    if sequence_parallel and tp_group is not None:
        sum_sequence_parallel_norm_grads(module, tp_group)


def build_gpt(shape: GPTShape, *, seed: int, device: torch.device, tp_group=None,
              sequence_parallel: bool = False, activation_checkpointing: bool = False) -> GPT:
    with torch.device("meta"):
        model = GPT(shape)
    _materialise(model, shape, seed=seed, device=device, tp_group=tp_group, sequence_parallel=sequence_parallel)
    model.activation_checkpointing = activation_checkpointing
    return model


class GPTPiece(nn.Module):
    """One pipeline layer of GPT: the embeddings, block `index` or the final LayerNorm,
    held under its full-model path (`embed`, `h.<index>`, `ln_f`) so that plan patterns,
    init seeds and checkpoint names are the plain model's. Built only on its own stage."""

    def __init__(self, shape: GPTShape, part: str, index: int = 0, *, seed: int, device: torch.device,
                 tp_group=None, sequence_parallel: bool = False):
        super().__init__()
        self.part, self.tp_group, self.sequence_parallel = part, tp_group, sequence_parallel
        with torch.device("meta"):
            if part == "embed":
                self.embed = Embeddings(shape)
            elif part == "block":
                self.h = nn.ModuleDict({str(index): Block(shape)})
            elif part == "ln_f":
                self.ln_f = nn.LayerNorm(shape.n_embd, eps=1e-5)
            else:
                raise ValueError(f"unknown GPT piece {part!r}")
        _materialise(self, shape, seed=seed, device=device, tp_group=tp_group, sequence_parallel=sequence_parallel)

    @staticmethod
    def parameter_count(shape: GPTShape, part: str, index: int = 0, **_) -> int:
        """Parameters of this piece (full, on the meta device): the partitioner's weights."""
        with torch.device("meta"):
            module = {"embed": lambda: Embeddings(shape), "block": lambda: Block(shape),
                      "ln_f": lambda: nn.LayerNorm(shape.n_embd)}[part]()
        return sum(p.numel() for p in module.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.part == "embed":
            return self.embed(x)
        if self.part == "block":
            return next(iter(self.h.values()))(x)
        return self.ln_f(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The output head tied to the (vocab-parallel) token embedding: vocab-sharded logits."""
        if self.tp_group is not None:
            x = (gather_from_sequence_parallel_region if self.sequence_parallel else copy_to_tp_region)(x, self.tp_group)
        return F.linear(x, self.embed.wte.weight)

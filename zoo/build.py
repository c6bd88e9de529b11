"""Building one rank's model: the single-device module (or, under pipeline parallelism,
only this stage's pieces of it) is built on the meta device, the parallelize step swaps in
this rank's tensor-parallel shards (and data-parallel BatchNorms), then every parameter is
materialised on the device and filled by the layout-free initialisation. A sharded rank
never holds the full model.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.bert import BertEmbeddings, BertForMaskedLM, BertLayer, BertPredictionHeadTransform, BertShape, \
    bert_init_std, padding_mask
from zoo.models.cnn import CNNShape, ResNet, Stem, classify, cnn_init_std, make_block
from zoo.models.gpt import GPT, Block, Embeddings, GPTShape, gpt_init_std
from zoo.models.init import init_parameters
from zoo.parallel.mappings import copy_to_tp_region, gather_from_sequence_parallel_region
from zoo.parallel.parallelize import parallelize
from zoo.parallel.plans import TP_PLANS, sum_sequence_parallel_norm_grads, tie_parameters

MODELS = {GPTShape: (GPT, "gpt"), BertShape: (BertForMaskedLM, "bert"), CNNShape: (ResNet, "cnn")}


def count_parameters(shape) -> int:
    """Parameters of the full (unsharded) model, counted on the meta device."""
    with torch.device("meta"):
        model = MODELS[type(shape)][0](shape)
    return sum(p.numel() for p in model.parameters())


def init_std(shape, meta_module: nn.Module) -> Callable[[str], Optional[float]]:
    """The family's init std by full parameter name (the CNN's depends on the tensor's shape)."""
    if isinstance(shape, GPTShape):
        return lambda name: gpt_init_std(name, shape)
    if isinstance(shape, BertShape):
        return lambda name: bert_init_std(name, shape)
    shapes = {n: tuple(p.shape) for n, p in meta_module.named_parameters()}
    return lambda name: cnn_init_std(name, shape, shapes[name])


def _materialise(module: nn.Module, shape, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                 sequence_parallel: bool = False, unheld: Sequence[str] = ()) -> None:
    """Parallelize a meta-device module in place, allocate it on `device` and initialise it.
    Its parameter names must be the full model's (e.g. `h.3.attn.c_attn.weight`); `unheld`
    names parameters the module must not hold (one a pipeline takes from a tied layer)."""
    std_of = init_std(shape, module)
    family = MODELS[type(shape)][1]
    parallelize(module, family=family, tp_group=tp_group, dp_group=dp_group,
                sequence_parallel=sequence_parallel, device=device)
    for name in unheld:
        owner, _, attr = name.rpartition(".")
        setattr(module.get_submodule(owner), attr, None)
    module.to_empty(device=device)
    if family in TP_PLANS:
        tie_parameters(module, TP_PLANS[family])  # materialising untied them
    init_parameters(module, seed, std_of)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()  # buffers: to_empty left them uninitialised
    if sequence_parallel and tp_group is not None:
        sum_sequence_parallel_norm_grads(module, tp_group, norms=TP_PLANS[family].sequence_parallel_norms)


def build_model(shape, *, seed: int, device: torch.device, tp_group=None, dp_group=None,
                sequence_parallel: bool = False, activation_checkpointing: bool = False) -> nn.Module:
    """This rank's whole model (no pipeline): GPT, BertForMaskedLM or ResNet by `shape`."""
    with torch.device("meta"):
        model = MODELS[type(shape)][0](shape)
    _materialise(model, shape, seed=seed, device=device, tp_group=tp_group, dp_group=dp_group,
                 sequence_parallel=sequence_parallel)
    model.activation_checkpointing = activation_checkpointing
    return model


def build_gpt(shape: GPTShape, *, seed: int, device: torch.device, tp_group=None,
              sequence_parallel: bool = False, activation_checkpointing: bool = False) -> GPT:
    return build_model(shape, seed=seed, device=device, tp_group=tp_group, sequence_parallel=sequence_parallel,
                       activation_checkpointing=activation_checkpointing)


# -- pipeline pieces ----------------------------------------------------------------------
def _hold(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put `module` at dotted `path` under `root`, creating empty containers on the way."""
    *parents, leaf = path.split(".")
    for name in parents:
        if not hasattr(root, name):
            root.add_module(name, nn.Module())
        root = getattr(root, name)
    root.add_module(leaf, module)


def _without(module: nn.Module, name: str) -> nn.Module:
    delattr(module, name)
    return module


class Piece(nn.Module):
    """One pipeline layer: some of the full model's submodules, held under their full-model
    paths (`h.3`, `bert.encoder.layer.3`, `layer2.0`) so that plan patterns, init seeds and
    checkpoint names are the plain model's. Built only on the stage that owns it.

    A family's subclass lists, per part, the submodules it holds (`parts`) and the forward."""

    unheld: Dict[str, Sequence[str]] = {}

    @staticmethod
    def parts(shape, part: str, index) -> Dict[str, Callable[[], nn.Module]]:
        raise NotImplementedError

    def __init__(self, shape, part: str, index=0, *, seed: int, device: torch.device, tp_group=None,
                 dp_group=None, sequence_parallel: bool = False):
        super().__init__()
        self.part, self.index, self.tp_group, self.sequence_parallel = part, index, tp_group, sequence_parallel
        with torch.device("meta"):
            for path, make in self.parts(shape, part, index).items():
                _hold(self, path, make())
        _materialise(self, shape, seed=seed, device=device, tp_group=tp_group, dp_group=dp_group,
                     sequence_parallel=sequence_parallel, unheld=self.unheld.get(part, ()))

    @classmethod
    def parameter_count(cls, shape, part: str, index=0, **_) -> int:
        """Parameters of this piece (full, on the meta device): the partitioner's weights."""
        holder, unheld = nn.Module(), cls.unheld.get(part, ())
        with torch.device("meta"):
            for path, make in cls.parts(shape, part, index).items():
                _hold(holder, path, make())
        return sum(p.numel() for n, p in holder.named_parameters() if n not in unheld)

    def tied_logits(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ (vocab-parallel) embedding^T: vocab-sharded logits under tensor parallelism."""
        if self.tp_group is not None:
            x = (gather_from_sequence_parallel_region if self.sequence_parallel else copy_to_tp_region)(x, self.tp_group)
        return F.linear(x, weight)


class GPTPiece(Piece):
    """GPT's pieces: `embed` (token + position embeddings), `block` i, `ln_f`, and `wte` (the
    token embedding alone: the output head's tied weight on the last stage)."""

    @staticmethod
    def parts(shape: GPTShape, part: str, index=0):
        return {"embed": {"embed": lambda: Embeddings(shape)},
                "wte": {"embed.wte": lambda: nn.Embedding(shape.vocab_size, shape.n_embd)},
                "block": {f"h.{index}": lambda: Block(shape)},
                "ln_f": {"ln_f": lambda: nn.LayerNorm(shape.n_embd, eps=1e-5)}}[part]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.part == "embed":
            return self.embed(x)
        if self.part == "block":
            return self.h.get_submodule(str(self.index))(x)
        return self.ln_f(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.tied_logits(x, self.embed.wte.weight)


class BertPiece(Piece):
    """BERT's pieces, each passing (hidden, inputs) on so every layer can see the padding:
    `word_embeddings` (the tied layer: the lookup on the first stage, the decoder's weight on
    the last), `embeddings` (positions, token types, LayerNorm), `layer` i, `transform` (the
    MLM head's dense + GELU + LayerNorm) and `decoder_bias` (the decoder's own bias)."""

    unheld = {"decoder_bias": ("cls.predictions.decoder.weight",)}

    @staticmethod
    def parts(shape: BertShape, part: str, index=0):
        return {"word_embeddings": {"bert.embeddings.word_embeddings": lambda: nn.Embedding(shape.vocab_size,
                                                                                            shape.n_embd)},
                "embeddings": {"bert.embeddings": lambda: _without(BertEmbeddings(shape), "word_embeddings")},
                "layer": {f"bert.encoder.layer.{index}": lambda: BertLayer(shape)},
                "transform": {"cls.predictions.transform": lambda: BertPredictionHeadTransform(shape)},
                "decoder_bias": {"cls.predictions.decoder": lambda: nn.Linear(shape.n_embd, shape.vocab_size)}}[part]

    def __init__(self, shape: BertShape, part: str, index=0, **build):
        super().__init__(shape, part, index, **build)
        self.pad_token_id = shape.pad_token_id

    def forward(self, x):
        if self.part == "word_embeddings":  # x: inputs (B, 2, T)
            return self.bert.embeddings.word_embeddings(x[:, 0]), x
        if self.part == "decoder_bias":  # x: (vocab-sharded) logits
            return x + self.cls.predictions.decoder.bias
        hidden, inputs = x
        if self.part == "embeddings":
            return self.bert.embeddings.combine(hidden, inputs[:, 1]), inputs
        if self.part == "layer":
            layer = self.bert.encoder.layer.get_submodule(str(self.index))
            return layer(hidden, padding_mask(inputs, self.pad_token_id)), inputs
        return self.cls.predictions.transform(hidden)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.tied_logits(x, self.bert.embeddings.word_embeddings.weight)


class CNNPiece(Piece):
    """The ResNet's pieces: `stem`, `block` (stage, index) and `head` (pool, classifier)."""

    @staticmethod
    def parts(shape: CNNShape, part: str, index=0):
        if part == "block":
            stage, i = index
            cin, width, stride = next((c, w, st) for s, j, c, w, st in shape.blocks() if (s, j) == (stage, i))
            return {f"layer{stage}.{i}": lambda: make_block(shape, cin, width, stride)}
        return {"stem": {"stem": lambda: Stem(shape)},
                "head": {"fc": lambda: nn.Linear(shape.widths[-1] * shape.expansion, shape.num_classes)}}[part]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.part == "stem":
            return self.stem(x)
        if self.part == "block":
            stage, i = self.index
            return getattr(self, f"layer{stage}").get_submodule(str(i))(x)
        return classify(self.fc, x)

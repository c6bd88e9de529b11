"""What a model family must provide: one `FamilySpec`, registered in `zoo.families`.

The trainer, validation, the planner, the monitor and export ask the spec and never the
family's name. A spec holds the family's plain model and how its dimensions come from the
config, its initialisation, tensor-parallel rules and pipeline loss, its task (data,
batches, metrics), its part of validation, its Hugging Face converter and what the planner
needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Tuple


@dataclass(frozen=True)
class HFConverter:
    """The family's Hugging Face transformers counterpart, tensor by tensor (an import reads
    and an export writes one slice or one tensor at a time: zoo.checkpoint.hf_weights)."""

    model_types: Tuple[str, ...]
    """config.json `model_type` values this family imports (`gpt2`)."""
    loads_as: str
    """The transformers class an export loads with (`GPT2LMHeadModel`)."""
    meta_from_config: Callable[[dict], dict]
    """A transformers config.json -> the family's shape fields."""
    config: Callable[..., Any]
    """(shape fields, eos_token_id=, pad_token_id=) -> the transformers config an export writes."""
    hf_keys: Callable[[str], List[str]]
    """A plain parameter name -> the transformers keys an import looks for it under, in order."""
    export_keys: Callable[[str], List[str]]
    """A plain parameter name -> the transformers keys an export writes it under (none: tied)."""
    transposed: Callable[[str], bool]
    """Whether transformers stores the parameter transposed (GPT-2's Conv1D projections)."""
    vocab_rows: Tuple[str, ...] = ()
    """The plain state's tensors with one row per token (embedding, untied head). With
    these named, an import whose vocabulary the tensor-parallel split cannot divide is padded
    (zero rows, their logits masked: shape field `vocab_real`) and an export strips the pad;
    without, the vocabulary must divide as it is."""

    @classmethod
    def of(cls, module, **fields) -> "HFConverter":
        """The converter whose functions are `module`'s (a family's hf.py)."""
        names = ("meta_from_config", "config", "hf_keys", "export_keys", "transposed")
        return cls(**{name: getattr(module, name) for name in names}, **fields)


@dataclass(frozen=True)
class FamilySpec:
    """Everything one model family owns."""

    name: str
    """`model.family`."""
    model: type
    """The plain single-device `nn.Module`, built from a shape; it lists its layers for the
    pipeline (`pipeline_layers()`, see `zoo.models.stages`)."""
    shape_type: type
    """The dataclass of its resolved dimensions (one per family: the registry's key by shape)."""
    shape: Optional[Callable[..., Any]]
    """(model config, vocab_size or None, pad_token_id=0) -> its shape from the config alone;
    None where the shape depends on the data (the CNN's on the images)."""
    task: type
    """Its `zoo.families.base_task.Task` subclass: data, batches, model for the layout, metrics."""
    init_std: Callable[[Any, Any], Callable[[str], Optional[float]]]
    """(shape, meta module) -> (full parameter name -> normal std, or None for zeros/ones)."""
    check: Callable[[Any, Any, List[str]], Tuple[int, str]]
    """The family's part of validation: (cfg, layout, warnings) -> (layers pipeline stages
    split, how to name them); raises ConfigError."""
    data_sources: Tuple[str, ...]
    """`data.name` values it reads; the first is its default."""
    reads: str
    """What its data is (`text`, `images`), for the message when data.name does not fit."""
    sizes: Tuple[str, ...]
    """Its `model.size` presets."""
    data_keys: Mapping[str, Tuple[str, ...]]
    """`data.*` key -> the `data.name` values that read it, for the keys some source ignores
    (`zoo.families.data_keys`); a key set for a source not listed is refused."""
    pipeline_loss: Callable[[Any], Callable]
    """tp_group (or None) -> the loss of the pipeline's last stage on (logits, targets)."""
    flops_per_sample: Callable[[Any], Tuple[Optional[float], str]]
    """task -> (training FLOPs of one sample, how they were counted), for MFU."""
    tp_rules: Optional[Any] = None
    """Its `zoo.parallel.tp_rules.TPRules`; None: tensor parallelism is refused."""
    tp_rules_of: Optional[Callable[[Any], Any]] = None
    """shape -> the rules for that shape, where they depend on it (Llama: tied embeddings and
    grouped-query heads); None: `tp_rules` for every shape."""
    hf: Optional[HFConverter] = None
    """Import (`model.init_from`) and `zoo.export`; None: neither."""
    mix_sources: Tuple[str, ...] = ()
    """The sources a `data.mix` entry may name (GPT and Llama: prepared directories too, mixed by
    tokens; BERT: text sources, mixed by characters); empty: no data.mix."""
    generates_text: bool = False
    """Samples text at the end (`trainer.sample_tokens`)."""
    context_parallel: bool = False
    """Runs under `parallel.cp` > 1 (a causal decoder's layer list takes a ContextShard)."""
    planner: Optional[Callable[[Any, int], Any]] = None
    """(model config, tokenizer vocabulary) -> `zoo.plan.model_desc.ModelDesc`; None: not planned."""
    published: Mapping[str, Tuple[int, int]] = field(default_factory=dict)
    """A preset that is a published model -> (its vocabulary, its parameter count), sources cited
    beside the table: the planner plans a preset with its own vocabulary (a run's model takes
    its tokenizer's), and a unit test holds the count the model builds against the figure."""

    def new_task(self, cfg, device, layout):
        """Its task for this run (`task` given the spec, so the family's code never looks a
        family up in the registry)."""
        return self.task(self, cfg, device, layout)

    def tp_rules_for(self, shape):
        """The tensor-parallel rules that split a model of `shape`."""
        return self.tp_rules_of(shape) if self.tp_rules_of is not None else self.tp_rules

    @property
    def sequence_parallel(self) -> bool:
        return self.tp_rules is not None and self.tp_rules.embedding is not None

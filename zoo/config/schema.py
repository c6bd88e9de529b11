"""Typed schemas for every config section.

Hydra composes `conf/` on top of these dataclasses, so a misspelled key or a value of
the wrong type fails at composition time, naming the key. Cross-key rules (divisibility,
layout against world size, ...) live in `zoo.config.validate`, which runs once before any
process group exists.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from zoo.families.bert.keys import MaskingDataKeys
from zoo.families.causal_keys import DocumentDataKeys
from zoo.families.cnn.keys import ImageDataKeys
from zoo.families.llama.keys import LlamaModelKeys


@dataclass
class ModelDims:
    """The model keys every family reads (ModelConfig adds the families' own after them)."""

    family: str = MISSING
    """Model family: `gpt`, `llama`, `bert` or `cnn` (zoo.families)."""
    size: str = "tiny"
    """Named size preset of the family (GPT: tiny, small, medium, large, xl, gpt3-125m ... gpt3-175b;
    Llama: tiny, smollm-135m, tinyllama-1.1b, llama2-7b, llama3-8b, llama2-70b, and its variants
    qwen2-tiny, qwen2.5-0.5b, qwen3-tiny, qwen3-0.6b, mistral-tiny, mistral-7b; BERT: tiny, base,
    large; CNN: tiny, resnet18, resnet50). Ignored with model.init_from (the import's own)."""
    n_layer: Optional[int] = None
    """Override the preset's number of transformer layers."""
    n_head: Optional[int] = None
    """Override the preset's number of attention heads."""
    n_embd: Optional[int] = None
    """Override the preset's hidden size."""


@dataclass
class ModelConfig(LlamaModelKeys, ModelDims):
    """`model.*`: the keys every family reads, the Llama family's own (zoo/families/llama/keys.py),
    then the rest."""

    ffn_mult: int = 4
    """FFN width as a multiple of the hidden size."""
    block_size: Optional[int] = None
    """Context length (tokens). None: the preset's."""
    vocab_size: Optional[int] = None
    """Vocabulary size. None: the tokenizer's, padded up to a multiple of `vocab_pad_multiple`."""
    vocab_pad_multiple: int = 128
    """The tokenizer's vocabulary is padded to a multiple of this (fixed, so every layout
    builds the same model); tp must divide the padded size."""
    dropout: float = 0.0
    """Dropout on embeddings, attention and residual branches."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of storing them."""
    compile: bool = False
    """torch.compile the model (zoo.models.compile): the whole model, or under pp each layer's module.
    The compile time is logged and in summary.json (`compile_s`), not counted in tokens/s.
    Inductor needs a C++ compiler on CPU (Triton on GPU)."""
    init_from: Optional[str] = None
    """A local Hugging Face directory (or Hub name) to initialise the weights from."""

    @property
    def label(self) -> str:
        """How a run names its model: `gpt-tiny`; an import by its directory (`llama-SmolLM2`),
        whose dimensions are its own, not model.size's."""
        if self.init_from:
            return f"{self.family}-{self.init_from.rstrip('/').rsplit('/', 1)[-1]}"
        return f"{self.family}-{self.size}"


@dataclass
class ParallelConfig:
    tp: int = 1
    """Tensor-parallel size (ranks sharing each layer; keep inside a node)."""
    pp: int = 1
    """Pipeline-parallel size (stages)."""
    cp: int = 1
    """Context-parallel size (GPT, Llama): each rank of a cp group holds 2 of 2 x cp chunks of
    every sequence, attention all-gathers keys and values over the group (zoo.parallel.context).
    For sequences whose activations one device cannot hold; ranks = tp x cp x pp x dp."""
    cp_recompute: bool = True
    """With cp > 1: each layer's key/value gather and attention are recomputed in the backward
    instead of keeping the whole sequence's keys and values (a layer's 2 x kv width x T, cp times
    its own share's): a rank keeps near 1/cp of a sequence's activations, for one more gather and
    attention forward a layer. false: keep them (faster, more memory). Under
    model.activation_checkpointing the whole layer is recomputed anyway."""
    dp: Optional[int] = None
    """Data-parallel replicas. Local run: how many to start (None: 1). Under torchrun,
    the deepspeed launcher or srun: derived from the world size (a set value must match)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3 over the data-parallel group."""
    sequence_parallel: bool = False
    """Shard LayerNorm/dropout activations along the sequence across the tp group."""
    auto: bool = False
    """Plan the layout at start for the ranks there are (`parallel=auto`, zoo.plan.auto): tp, pp,
    dp, the ZeRO stage, the micro-batch and accumulation (the global batch stays), sequence
    parallelism and activation checkpointing; those set on the command line are kept. A resume
    plans again for its own ranks."""
    world_size: Optional[int] = None
    """With parallel.auto on zoo's own launcher: the ranks to start. None: one per GPU, else one
    per CPU core. Under torchrun, srun or the deepspeed launcher: theirs."""
    num_microbatches: Optional[int] = None
    """Micro-batches per step per pipeline. None: derived from the global batch."""
    partition_method: str = "parameters"
    """How DeepSpeed splits layers into pipeline stages: parameters, uniform, type:REGEX."""
    backend: Optional[str] = None
    """torch.distributed backend. None: nccl on CUDA, gloo on CPU."""
    timeout_s: int = 300
    """Collective timeout: a rank that hangs or dies ends the whole job after this long."""


@dataclass
class DataSource:
    """The data keys every family reads (DataConfig adds the families' own after them)."""

    name: str = "pydoc"
    """Data source: `pydoc` (the Python docs inside CPython), `digits` (scikit-learn), `files`, `hub`."""
    path: Optional[str] = None
    """For `files`: a file, a directory or a glob. For `hub`: the dataset name or a local dataset directory."""
    text_column: str = "text"
    """Column holding the text in jsonl/parquet/csv/hub sources."""
    eval_path: Optional[str] = None
    """A held-out source in data.path's forms (a file, directory or glob; with data=hub a dataset
    name or directory): evaluation reads it instead of a data.eval_fraction split (GPT, Llama)."""
    mix: List[Dict[str, Any]] = field(default_factory=list)
    """Weighted sources, e.g. [{name: files, path: a.jsonl, weight: 3}, {name: pydoc, weight: 1}];
    when set it replaces data.name/data.path. GPT and Llama: also {name: prepared, path: DIR}
    entries, and the weights are shares of the tokens (each source's blocks repeated or cut);
    BERT: text sources, shares of the characters."""


@dataclass
class DataConfig(DocumentDataKeys, MaskingDataKeys, ImageDataKeys, DataSource):
    """`data.*`: the source, the CNN's image keys (zoo/families/cnn/keys.py), BERT's masking
    (zoo/families/bert/keys.py), GPT's and Llama's document masking (zoo/families/causal_keys.py),
    then the tokenizer's and the split's keys."""

    tokenizer: Optional[str] = None
    """None: train one on the source (cached). Else a local directory holding tokenizer.json
    (save_pretrained's output; save a Hub tokenizer to a directory first)."""
    vocab_size: int = 4096
    """Vocabulary size of a tokenizer trained here."""
    eval_fraction: float = 0.05
    """Share of the source held out for evaluation."""
    num_proc: Optional[int] = None
    """GPT and Llama: processes tokenizing a text source into the cache (data_pipelines.prepare's
    --workers: the source streamed, the same tokens for any number), forked from a fresh
    interpreter that the rank building the cache starts and waits for. None: one per core."""
    num_workers: int = 0
    """DataLoader worker processes per rank preparing the next step's batches; 0: one
    background thread."""
    cache_dir: Optional[str] = None
    """Where tokenizers and tokenized datasets are cached. None: $ZOO_CACHE or ~/.cache/zoo."""


@dataclass
class OptimConfig:
    name: str = "adamw"
    """`adamw` (torch's AdamW) or `sgd` (torch's SGD with momentum), both through DeepSpeed's
    optimizer config (`optim=adamw` / `optim=sgd` pick a preset)."""
    lr: float = 1e-3
    """Peak learning rate."""
    schedule: str = "cosine"
    """After the linear warmup: `cosine` (to min_lr), `linear` (to min_lr), `constant`, or
    `wsd` (warmup-stable-decay: constant, then linear to min_lr over the last decay_fraction)."""
    min_lr: float = 1e-4
    """Learning rate at the end of the schedule (cosine, linear, wsd)."""
    decay_fraction: float = 0.1
    """wsd: the share of the schedule's steps its final decay takes."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    decay_steps: Optional[int] = None
    """Length of the warmup + cosine schedule in steps. None: trainer.max_steps. Set it when
    one schedule is spread over runs that stop early (each with its own max_steps)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    momentum: float = 0.9
    """SGD momentum (0: none)."""
    nesterov: bool = False
    """SGD: Nesterov momentum (needs momentum > 0)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""


@dataclass
class PrecisionConfig:
    dtype: str = "fp32"
    """fp32, bf16 or fp16 (fp16: dynamic loss scaling, DeepSpeed's; on a CPU where torch computes fp16)."""
    loss_scale: float = 0.0
    """fp16: a static loss scale; 0: dynamic."""
    initial_scale_power: int = 16
    """fp16: initial loss scale 2**this."""
    loss_scale_window: int = 1000
    """fp16: steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """fp16, ZeRO 1-3: overflows in a row before the scale halves."""
    min_loss_scale: float = 1.0
    """fp16: the dynamic scale never falls below this."""


@dataclass
class LoggerConfig:
    kind: str = "none"
    """`wandb` or `none`."""
    project: str = "zoo"
    """wandb project."""
    entity: Optional[str] = None
    """wandb entity (team or user)."""
    group: Optional[str] = None
    """wandb group; None: the experiment name."""
    name: Optional[str] = None
    """Run name; None: model-size_tpX-ppY-dpZ_zeroN."""
    tags: List[str] = field(default_factory=list)
    """wandb tags."""
    mode: Optional[str] = None
    """online/offline; None: online when credentials are configured, else offline."""


@dataclass
class EarlyStopConfig:
    patience: int = 0
    """Stop after this many evaluations in a row without a better eval loss (0: never; needs
    trainer.eval_every)."""
    min_delta: float = 0.0
    """An eval loss counts as better when it is below the best by more than this."""


@dataclass
class ProfileConfig:
    start: int = 0
    """Profile steps start .. start + steps - 1 with torch.profiler on every rank (steps count
    from 1; 0: no profiling). Traces, the time breakdown and the load balance go to
    RUN_DIR/profile (zoo/observe/profiler.py)."""
    steps: int = 3
    """Steps in the profiled window."""
    with_stack: bool = False
    """Record the Python stack of every op (larger traces, more overhead)."""
    memory: bool = False
    """CUDA: record the allocator's history over the window and dump it to
    RUN_DIR/profile/memory_rank{r}.pickle (pytorch.org/memory_viz), also on running out of
    memory. Without CUDA a warning: the trace's memory view is what the CPU has."""
    dir: Optional[str] = None
    """Where the traces and summary.json go; None: RUN_DIR/profile."""


@dataclass
class TrainerConfig:
    max_steps: int = 200
    """Optimizer steps to run."""
    global_batch_size: int = 32
    """Samples per optimizer step, across all data-parallel replicas."""
    micro_batch_size: Any = 8
    """Samples per forward/backward on one rank; accumulation is derived. `auto` (CUDA): the
    largest that keeps measured peak memory within 80% of the device (zoo/plan/batch_finder.py).
    Typed Any only because OmegaConf has no int-or-"auto" type: validation checks it."""
    seed: int = 1234
    """Seed for init, data order and dropout."""
    log_every: int = 10
    """Log metrics every this many steps."""
    eval_batches: Optional[int] = None
    """How much of the held-out split an evaluation scores, in global batches
    (trainer.global_batch_size samples each): the first N x global batch samples, the same on
    every layout. None: the whole split, at most 20 global batches; 0: no evaluation. An
    empty held-out split is refused before training, one smaller than a set value is warned
    about."""
    sample_tokens: int = 48
    """Tokens generated at the end of a language-model run (0: none), on the distributed model
    in place (every rank takes part, with a decode cache; zoo.parallel.generate)."""
    sample_temperature: float = 0.8
    """The sample's temperature; 0: greedy (the most likely token each time)."""
    sample_top_k: int = 40
    """The sample draws from the top-k tokens (0: all of them)."""
    eval_every: int = 0
    """Evaluate on the held-out split every this many steps (0: only at the end)."""
    early_stop: EarlyStopConfig = field(default_factory=EarlyStopConfig)
    eval_tasks: List[str] = field(default_factory=list)
    """Downstream tasks scored at every evaluation, on the distributed model in place (GPT and
    Llama): task files (JSON Lines of {context, choices, gold} or {context, continuation};
    `python -m zoo.evaluate.tasks convert` makes them from HellaSwag, ARC, PIQA, LAMBADA) or
    built-in names (python_keywords). Each adds TASK/acc and TASK/acc_norm (multiple choice) or
    TASK/acc and TASK/ppl (continuation) to the evaluation's record and the summary."""
    eval_task_shots: int = 0
    """Few-shot examples before each scored context (the harness's num_fewshot): drawn from the
    task's own train split (TASK.train.jsonl beside the task file; the built-ins have theirs),
    each shot's context and right choice then a blank line, seeded per example."""
    eval_metric: str = "eval_loss"
    """What checkpoint.best and trainer.early_stop follow: eval_loss (lower is better) or a
    task's metric from trainer.eval_tasks (TASK/acc, TASK/acc_norm: higher is better; TASK/ppl:
    lower)."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    sample_prompt: Optional[str] = None
    """The prompt of that sample; default: the first words of the first held-out document."""
    progress: bool = True
    """Progress bar on rank 0."""
    dry_run: bool = False
    """Validate and plan the run (layout, batch, memory per device against the device, the data
    and its size), print it and exit: no rank starts, nothing is written. `--dry-run` sets it."""
    max_nonfinite_steps: int = 3
    """Stop the run after this many consecutive steps with a non-finite loss (no checkpoint
    is written over the last good one meanwhile). fp16 overflows are skipped by the engine."""


@dataclass
class CheckpointConfig:
    every: Any = 0
    """Save every this many steps (0: only on request, e.g. signals), or `auto`: every as many
    steps as Young's interval sqrt(2 x a save's cost x run.mtbf_hours) takes, measured from a
    first save two steps into each start and again at every save (zoo/run/checkpoint_interval.py)."""
    keep: int = 2
    """Checkpoints kept in the run directory."""
    best: bool = False
    """Keep checkpoints/best: the checkpoint of the best eval loss so far (needs
    trainer.eval_every; layout-free, resumable and exportable like the others)."""
    save_final: bool = True
    """Write the consolidated, layout-free weights to model.safetensors at the end."""
    async_save: bool = False
    """Periodic checkpoints (checkpoint.every) are copied to host memory and written in the
    background while training goes on (the step stalls only for the copy; each rank holds its
    share of the checkpoint once more until it is written). A second save waits for the first;
    a failed background write stops the run at the next step, `latest` untouched. (`async` is
    Python's keyword: hence the name.)"""
    native: Optional[bool] = None
    """Also write DeepSpeed's per-rank files in each checkpoint, and resume from them when the
    layout is the one that wrote them. None: only under ZeRO-3, the one stage where that was
    measured faster than the layout-free files (benchmarks/checkpoint_resume.py)."""


@dataclass
class RunConfig:
    """`run.*`: facts about the job as a whole."""

    mtbf_hours: Optional[float] = None
    """The job's mean time between failures, in hours (a node's MTBF over the job's nodes):
    checkpoint.every=auto sets the interval from it."""
    max_restarts: int = 0
    """zoo's own launcher: when a rank fails (killed, or an error), start the ranks again this many
    times in the same job, each attempt resuming the newest intact checkpoint (resume=auto) and
    saying what the restart lost; a config error, a diverged loss, a signal or an out-of-memory kill
    is not restarted. Under torchrun its --max-restarts does the same, under Slurm the sbatch
    scripts read it (slurm/srun_ranks.sh: srun again on the nodes that still answer); see
    zoo/run/attempts.py."""
    cpu_allocator: str = "auto"
    """The malloc of CPU ranks that zoo's launcher (and slurm/srun_ranks.sh) starts: auto
    (tcmalloc, else jemalloc, else glibc's own), tcmalloc, jemalloc or glibc. glibc keeps much of
    what a step frees (a TinyLlama-1.1B rank: 5.5 GB against tcmalloc's 4.2); the planner counts
    the one the ranks get (zoo/run/allocator.py). GPU ranks: unused."""


@dataclass
class MeasureConfig:
    measure: Optional[int] = None
    """Run the planner's top this many layouts that fit for plan.measure_steps steps each on this
    machine (python -m zoo.train, zoo.plan.measure). `python -m zoo.plan` prints predicted against
    measured step time and peak memory and ranks them by measurement (the cluster must be this
    machine, e.g. cluster=cpu); training with parallel=auto trains with the fastest measured
    (zoo's own launcher: the ranks start on this machine). None: the estimate alone."""
    measure_steps: int = 6
    """Steps of each measured run; the first (its warm-up) is not timed."""


@dataclass
class TrainPlanConfig(MeasureConfig):
    """Training's `plan` section: plan.measure with parallel=auto, and whether to start a layout
    the planner predicts not to fit."""

    allow_over: bool = False
    """Start even where the planner's memory estimate per device is above plan.mem_fraction
    (80%) of the device (on a CPU: of this host's RAM over its ranks). False: such a run is
    refused before launch with the estimate and the fixes (an out-of-memory kill loses more)."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    plan: TrainPlanConfig = field(default_factory=TrainPlanConfig)
    experiment: Optional[str] = None
    """Name of the pinned experiment (set by `experiment/` files; the wandb group)."""
    resume: Optional[str] = None
    """`auto` (latest checkpoint in the run directory) or a checkpoint path."""
    deepspeed: Dict[str, Any] = field(default_factory=dict)
    """Raw DeepSpeed config keys merged verbatim over the generated config."""
    verbose: bool = False
    """Full output: tracebacks for user errors, every rank's and DeepSpeed's console lines
    (`debug=true` on the command line means the same; `debug=` itself is the preset group)."""


SECTIONS = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "precision": PrecisionConfig,
    "logger": LoggerConfig,
}


def register_configs() -> None:
    """Register the schema so that conf/config.yaml can name it in its defaults (the whole config
    only: a section's schema stored in its group would be a choice, `data=data_schema`, and
    listed by --help)."""
    ConfigStore.instance().store(name="zoo_schema", node=Config)


def config_from_yaml(text: str) -> Config:
    """The typed config from its resolved YAML (`zoo.train` types Hydra's composition so, once)."""
    schema = OmegaConf.structured(Config)
    return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.create(text)))


def with_model_shape(cfg: Config, shape) -> Config:
    """A copy of `cfg` whose model section states the model's real dimensions where the config
    left them to the size preset (None): what the run directory's config.yaml, wandb's config
    and `zoo.compare` show. The preset stays visible as model.size; the copy builds the same model."""
    import dataclasses

    if shape is None:
        return cfg
    dims = {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)
            if hasattr(cfg.model, f.name) and getattr(cfg.model, f.name) is None}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **dims))


def recorded(cfg: Config, shape, unread_data=()) -> Dict[str, Any]:
    """The run's config as config.yaml and wandb record it: the model's real dimensions stated
    (with_model_shape) and the `data.*` keys the run does not read (zoo.families.data_keys.unread)
    left out. A resume reads it back; a key left out takes its default, which the run ignores."""
    out = OmegaConf.to_container(OmegaConf.structured(with_model_shape(cfg, shape)))
    for key in unread_data:
        out["data"].pop(key, None)
    return out


def to_yaml(cfg) -> str:
    """A Config, or a recorded one (a dict), as YAML."""
    return OmegaConf.to_yaml(cfg if isinstance(cfg, dict) else OmegaConf.structured(cfg))

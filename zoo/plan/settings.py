"""Typed schemas of the planner's config (`conf/plan.yaml`) and their checks.

`python -m zoo.plan` composes `conf/plan.yaml`: the training config's `model`, `precision`
and `trainer` sections (the same schemas as `zoo.config.schema`), a `cluster` from
`conf/cluster/`, and the `plan` section below. Composition checks keys and types; the
cross-key checks here raise ValueError with the numbers and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from zoo.config.schema import MeasureConfig, ModelConfig, OptimConfig, PrecisionConfig, TrainerConfig

FORMATS = ("text", "json")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CLUSTERS = Path(__file__).resolve().parents[2] / "conf" / "cluster"


@dataclass
class ClusterConfig:
    name: str = MISSING
    """Name of the preset, printed with the plan."""
    nodes: int = 1
    """Number of nodes."""
    gpus_per_node: int = 8
    """Accelerators per node (the tensor-parallel group stays inside one node)."""
    device: str = "GPU"
    """What one of them is, as the plan's reasons and tables name it (`GPU`; the cpu preset's
    `CPU rank`: a gloo rank whose share of the host's RAM is its memory)."""
    gpu_mem_gb: float = 80.0
    """Memory of one accelerator, GB (1e9 bytes)."""
    runtime_gb: float = 0.0
    """Memory of one rank that no model takes, GB, added to every layout's estimate: on CPU,
    where a rank's resident memory is its device memory, the interpreter with torch, DeepSpeed
    and zoo imported, its process group and engine (the cpu preset's value is measured); on a
    GPU the CUDA context, outside torch's allocator (not measured yet: 0)."""
    builds_causal_masks: bool = False
    """The attention kernels take no unbuilt bottom-right causal mask (the CPU's), so context
    parallelism builds its chunks' masks, c x (2cp+1)c elements a micro-batch (zoo.parallel.context);
    on CUDA torch's causal_lower_right needs none."""
    resident_on_write: bool = False
    """The devices' memory becomes resident only where written (the CPU's: torch.empty maps
    pages that count once touched), so DeepSpeed's reduce bucket takes only what the gradients
    fill of it; on a GPU the caching allocator holds the whole bucket (false)."""
    host_mem_gb: float = 1024.0
    """Host memory (RAM) of one node, GB: checkpoint transitions pass through it (zoo.plan.memory.host_memory)."""
    peak_tflops: float = 312.0
    """Dense 16-bit (bf16/fp16) peak of one accelerator, TFLOP/s."""
    fp32_tflops: Optional[float] = None
    """Peak for fp32 training (TF32 tensor cores on NVIDIA), TFLOP/s. None: half of peak_tflops."""
    hbm_gbps: float = 2039.0
    """Memory bandwidth of one accelerator, GB/s: bounds the speed of narrow matrix multiplies."""
    intra_node_gbps: float = 300.0
    """Bandwidth between two accelerators of one node, per direction, in gigaBYTES per second
    (NVLink; the tensor-parallel all-reduces use it)."""
    inter_node_gbps: float = 200.0
    """Network bandwidth out of one node, all its NICs together, per direction, in gigaBYTES
    per second (8 x 200 Gb/s InfiniBand = 200 GB/s); each accelerator gets 1/gpus_per_node of it."""
    mfu: float = 0.5
    """Assumed model FLOPs utilisation: the fraction of peak that large matrix multiplies reach."""
    comm_efficiency: float = 0.7
    """Fraction of the link bandwidth that collectives reach (NCCL bus bandwidth / link bandwidth)."""
    micro_batch_overhead_ms: float = 0.0
    """Milliseconds a pipeline stage spends on each micro-batch whatever its size, outside its
    layers (forward and backward: the engine's dispatch, the embedding's and the loss's
    operator launches): more micro-batches of fewer samples cost this each. 0 unless a preset
    sets it (the cpu preset's is measured; not measured on a GPU yet)."""
    layer_overhead_ms: float = 0.0
    """The same per layer and micro-batch (operator dispatch and kernel launches, the latency
    of the layer's tensor-parallel collectives); a recomputed forward adds a third of it."""
    engine_bytes_per_param: List[List[float]] = field(default_factory=lambda: [[0.0, 0.0]] * 4)
    """What the engine's step holds beyond the model states, the buffers and the activations,
    bytes a parameter of a rank's tp/pp share, for ZeRO stages 0-3: [a, b] is a + b / dp
    (DeepSpeed's flat gradient partitions and their fp32 copies, gradients before their
    reduce-scatter, the allocator). Measured by benchmarks/step_memory.py; 0 unless a preset
    sets it (the cpu preset's is measured; not measured on a GPU yet). On CPU with the malloc
    zoo's launcher preloads (run.cpu_allocator: tcmalloc or jemalloc)."""
    engine_bytes_per_param_glibc: Optional[List[List[float]]] = None
    """The same where CPU ranks run on glibc's malloc, which keeps much of what a step frees
    (zoo/run/allocator.py); None: engine_bytes_per_param."""
    measured: Optional[str] = None
    """Where and when runtime_gb and the two overheads were measured (the date and the device,
    e.g. `2026-12-05, the 2-core CPU machine`); None: not measured, so they are 0 and the plan
    says its estimates leave them out."""


@dataclass
class PlanConfig(MeasureConfig):
    """What to search and how to print it; plan.measure and plan.measure_steps as training has them."""

    format: str = "text"
    """`text` (the recommendation, its reasons, the best candidates and the topology
    diagram) or `json` (only a JSON object with every candidate and the recommended one)."""
    mem_fraction: float = 0.8
    """A layout fits when its estimate is at most this fraction of device memory; the rest is
    headroom for what the estimate does not see (allocator fragmentation, CUDA context, kernels' workspaces)."""
    vocab_size: Optional[int] = None
    """Tokenizer vocabulary assumed when model.vocab_size is null; padded to
    model.vocab_pad_multiple as training pads it. None: the size preset's published one
    (llama3-8b: 128,256; llama2-7b: 32,000; GPT-2 and GPT-3: 50,257), else GPT-2's 50,257."""
    micro_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    """Micro-batch sizes to try (each must divide the global batch with dp)."""
    zero_stages: List[int] = field(default_factory=lambda: [0, 1, 2, 3])
    """ZeRO stages to try (2 and 3 only without pipeline parallelism)."""
    tp: Optional[List[int]] = None
    """Restrict tensor-parallel sizes to these (None: every one the model and node allow)."""
    pp: Optional[List[int]] = None
    """Restrict pipeline sizes to these (None: every one up to the number of layers)."""
    cp: Optional[List[int]] = None
    """Restrict context-parallel sizes to these (None: every one the node, the sequence and the
    family allow; GPT and Llama, without a pipeline)."""
    cp_recompute: bool = True
    """As parallel.cp_recompute: under cp each layer's key/value gather and attention run again in
    the backward instead of keeping the whole sequence's keys and values."""
    activation_checkpointing: List[bool] = field(default_factory=lambda: [False, True])
    """Full recomputation at layer boundaries: off, on, or both tried."""
    sequence_parallel: bool = True
    """Assume sequence parallelism with tp > 1 (parallel.sequence_parallel=true): LayerNorm and
    dropout activations are split over the tp group too."""
    document_mask: bool = False
    """Plan for data.document_mask=true (attention within documents): each pipeline stage keeps
    one (micro-batch, 1, T, T) attention mask in the training dtype for every micro-batch in
    flight, whole on every tensor-parallel rank (at 8,192 tokens, 134 MB a sample in bf16).
    parallel=auto sets it from data.document_mask."""
    zero_bucket_elems: int = 500_000_000
    """Elements of DeepSpeed's gradient reduce bucket (zero_optimization.reduce_bucket_size,
    default kept by zoo's engine); ZeRO allocates a buffer this size whatever the model."""
    prefer_simpler_within: float = 0.02
    """The estimates are not more precise than a few percent: a pure data-parallel layout
    (tp = cp = pp = 1) within this fraction of the fastest is recommended over it (data
    parallelism while the model fits), and so is a layout without cp over a faster one with it
    (cp where the sequence needs it)."""
    top: int = 8
    """Candidates listed in the text output."""
    verbose: bool = False
    """The text output's full topology diagram (every rank and group); default: a summary."""
    diagram_ranks: int = 64
    """The text output's topology diagram lists at most this many ranks and groups of each kind."""
    topology: Optional[str] = None
    """Also draw the recommended layout's device topology into this PNG file (hosts node0,
    node1, ... of cluster.gpus_per_node GPUs each, as Slurm would place the ranks)."""


@dataclass
class PlanRunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model, exactly as training configures it (`conf/model/`)."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The machines (`conf/cluster/`)."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Training precision (`conf/precision/`): bytes of parameters, gradients and activations."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Only trainer.global_batch_size is read: the samples per optimizer step to reach."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimizer (`conf/optim/`): only optim.name and optim.momentum are read, for the bytes of
    its state a parameter (AdamW 8, SGD with momentum 4)."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    """What to search and how to print it."""


def register_plan_configs() -> None:
    """Register the planner's schema so that `conf/plan.yaml` can name it (not a cluster choice)."""
    ConfigStore.instance().store(name="zoo_plan_schema", node=PlanRunConfig)


def _positive(value: float, key: str, fix: str) -> None:
    if not value > 0:
        raise ValueError(f"{key}={value} must be positive; {fix}")


def check_cluster(c: ClusterConfig) -> None:
    """Raise ValueError naming the first impossible cluster value."""
    _positive(c.nodes, "cluster.nodes", "a cluster has at least one node")
    _positive(c.gpus_per_node, "cluster.gpus_per_node", "set the accelerators of one node, e.g. cluster.gpus_per_node=8")
    _positive(c.gpu_mem_gb, "cluster.gpu_mem_gb", "set one accelerator's memory in GB, e.g. cluster.gpu_mem_gb=80")
    _positive(c.host_mem_gb, "cluster.host_mem_gb", "set one node's RAM in GB, e.g. cluster.host_mem_gb=2048")
    if not c.runtime_gb >= 0:
        raise ValueError(f"cluster.runtime_gb={c.runtime_gb} must be at least 0; set the memory one rank takes "
                         f"before any model, e.g. cluster.runtime_gb=0.5")
    _positive(c.peak_tflops, "cluster.peak_tflops", "set the dense bf16 peak, e.g. 312 for an A100")
    if c.fp32_tflops is not None:
        _positive(c.fp32_tflops, "cluster.fp32_tflops", "set it, or null for half of cluster.peak_tflops")
    _positive(c.hbm_gbps, "cluster.hbm_gbps", "set the memory bandwidth in GB/s, e.g. 2039 for an A100 80GB")
    _positive(c.intra_node_gbps, "cluster.intra_node_gbps", "set the NVLink bandwidth in GB/s, e.g. 300")
    _positive(c.inter_node_gbps, "cluster.inter_node_gbps", "set the node's network bandwidth in GB/s, e.g. 200")
    for key in ("mfu", "comm_efficiency"):
        value = getattr(c, key)
        if not 0 < value <= 1:
            raise ValueError(f"cluster.{key}={value} must be in (0, 1]: it is a fraction of the peak, e.g. 0.5")


def check_plan(cfg: PlanRunConfig) -> None:
    """Raise ValueError naming the first impossible plan, precision or batch value."""
    p = cfg.plan
    check_cluster(cfg.cluster)
    if p.format not in FORMATS:
        raise ValueError(f"plan.format={p.format!r} is unknown; choose one of {list(FORMATS)}")
    if cfg.precision.dtype not in DTYPE_BYTES:
        raise ValueError(f"precision.dtype={cfg.precision.dtype!r} is unknown; choose one of {list(DTYPE_BYTES)}")
    if not 0 < p.mem_fraction <= 1:
        raise ValueError(f"plan.mem_fraction={p.mem_fraction} must be in (0, 1], e.g. 0.8 for 20% headroom")
    _positive(cfg.trainer.global_batch_size, "trainer.global_batch_size", "set the samples per step, e.g. 1536")
    from zoo.config.ranges import RANGES, message

    if not RANGES["optim.momentum"].holds(cfg.optim.momentum):  # read for SGD's state (zoo.plan.memory.moment_bytes)
        raise ValueError(message("optim.momentum", cfg.optim.momentum))  # training's own range and words
    if p.vocab_size is not None:
        _positive(p.vocab_size, "plan.vocab_size", "set the tokenizer's vocabulary, e.g. 50257")
    for key in ("micro_batch_sizes", "tp", "pp", "cp"):
        values = getattr(p, key)
        if values is not None and (not values or min(values) < 1):
            raise ValueError(f"plan.{key}={list(values)} must be a non-empty list of positive sizes, e.g. [1, 2, 4]")
    if not p.zero_stages or not set(p.zero_stages) <= {0, 1, 2, 3}:
        raise ValueError(f"plan.zero_stages={list(p.zero_stages)} must be a non-empty subset of [0, 1, 2, 3]")
    if not p.activation_checkpointing:
        raise ValueError("plan.activation_checkpointing=[] tries nothing; use [false], [true] or [false, true]")
    _positive(p.top, "plan.top", "list at least one candidate")
    if not 0 <= p.prefer_simpler_within < 1:
        raise ValueError(f"plan.prefer_simpler_within={p.prefer_simpler_within} must be in [0, 1), e.g. 0.02 for 2%")
    _positive(p.zero_bucket_elems, "plan.zero_bucket_elems", "DeepSpeed's default is 500000000")


def machine_preset(cuda: bool, allocator: str = "tcmalloc"):
    """This machine's cluster preset (a ClusterConfig): the cpu preset (this machine's measured
    speeds and fixed costs) on CPU, the h200 preset on CUDA; its engine term the one measured
    with the ranks' malloc (`allocator`, zoo.run.allocator.planned)."""
    preset = OmegaConf.load(CLUSTERS / ("h200.yaml" if cuda else "cpu.yaml"))
    out = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ClusterConfig), preset))
    if allocator == "glibc" and out.engine_bytes_per_param_glibc is not None:
        out.engine_bytes_per_param = out.engine_bytes_per_param_glibc
    return out

"""Enumerate the layouts a cluster allows, estimate each, rank them, recommend one.

tp: the divisors of the node's accelerators that divide every size the model lists
(heads, FFN width, padded vocabulary); a tp group never leaves a node. pp: 1 up to the
number of layers, where tp*pp divides the world (the layers need not divide evenly: the
first stages take one more). cp (GPT, Llama): the sizes whose tp x cp group
stays inside a node and whose 2 x cp chunks divide the sequence (with sequence parallelism, tp
dividing a cp rank's share too). dp: the rest. ZeRO 0-3 when dp > 1, only 0-1 with pp > 1
(DeepSpeed's pipeline engine supports ZeRO-1 at most). Micro-batch sizes whose product
with dp divides the global batch; the accumulation is global / (micro * dp), at least pp
with a pipeline (zoo.config.validate: a micro-batch per stage in flight). Activation
checkpointing off and on. What fits in mem_fraction of the device is ranked by step time;
equal times go to the simpler layout (fewer model-parallel ranks, lower ZeRO stage, no
recomputation, larger micro-batch). The recommendation is the fastest, or a pure
data-parallel layout when one is within plan.prefer_simpler_within of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional

from zoo.config.schema import ModelConfig
from zoo.plan.describe import describe_model
from zoo.plan.layout import PlanLayout
from zoo.plan.memory import ADAM_MOMENT_BYTES, MemoryEstimate, layout_memory, moment_bytes
from zoo.plan.model_desc import ModelDesc
from zoo.plan.settings import ClusterConfig, PlanConfig, PlanRunConfig, check_plan
from zoo.plan.step_time import StepTime, step_time

GB = 1e9


@dataclass(frozen=True)
class Candidate:
    """One layout with its estimates."""

    layout: PlanLayout
    """The layout."""
    mem: MemoryEstimate
    """Bytes on its heaviest accelerator."""
    time: StepTime
    """Seconds per optimizer step."""
    fits: bool
    """mem.total <= plan.mem_fraction of the accelerator's memory."""
    tokens_per_s: float
    """Global batch tokens / step time."""

    def as_dict(self) -> dict:
        lay = self.layout
        return {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp, "zero_stage": lay.zero_stage,
                "micro_batch_size": lay.micro_batch_size, "grad_accum": lay.grad_accum,
                "activation_checkpointing": lay.activation_checkpointing, "mem_bytes": self.mem.as_dict(),
                "fits": self.fits, "step_time_s": self.time.total, "step_time_parts_s": self.time.as_dict(),
                "tokens_per_s": self.tokens_per_s}


def estimate(desc: ModelDesc, layout: PlanLayout, cluster: ClusterConfig, *, dtype: str = "bf16",
             plan: Optional[PlanConfig] = None, moments: int = ADAM_MOMENT_BYTES) -> Candidate:
    """Memory and step time of `layout` on `cluster` (plan: sequence parallelism, headroom, bucket;
    moments: the optimizer's state bytes a parameter, zoo.plan.memory.moment_bytes)."""
    plan = plan or PlanConfig()
    mem = layout_memory(desc, layout, dtype=dtype, sequence_parallel=plan.sequence_parallel,
                        bucket_elems=plan.zero_bucket_elems, runtime_bytes=cluster.runtime_gb * GB,
                        resident_on_write=cluster.resident_on_write, document_mask=plan.document_mask,
                        engine_bytes_per_param=cluster.engine_bytes_per_param, moments=moments,
                        builds_causal_masks=cluster.builds_causal_masks, cp_recompute=plan.cp_recompute)
    time = step_time(desc, layout, cluster, dtype=dtype, sequence_parallel=plan.sequence_parallel, moments=moments,
                     cp_recompute=plan.cp_recompute)
    tokens = layout.dp * layout.micro_batch_size * layout.grad_accum * desc.tokens_per_sample
    return Candidate(layout=layout, mem=mem, time=time, fits=mem.total <= plan.mem_fraction * cluster.gpu_mem_gb * GB,
                     tokens_per_s=tokens / time.total)


def tp_sizes(desc: ModelDesc, gpus_per_node: int) -> List[int]:
    """Tensor-parallel sizes that divide the node and every size the model lists."""
    return [t for t in range(1, gpus_per_node + 1)
            if gpus_per_node % t == 0 and all(size % t == 0 for size in desc.tp_divides.values())]


def cp_sizes(desc: ModelDesc, gpus_per_node: int, tp: int, plan: PlanConfig) -> List[int]:
    """Context-parallel sizes beside `tp`: the tp x cp group inside a node, 2 x cp chunks of the
    sequence (zoo.parallel.context), tp dividing a cp rank's share under sequence parallelism; 1
    for a family without context parallelism (kv_width 0)."""
    T = desc.tokens_per_sample
    out = [c for c in range(1, gpus_per_node // tp + 1)
           if c == 1 or (desc.kv_width and gpus_per_node % (tp * c) == 0 and T % (2 * c) == 0
                         and not (plan.sequence_parallel and tp > 1 and (T // c) % tp))]
    return [c for c in out if plan.cp is None or c in plan.cp]


def _grids(desc: ModelDesc, cluster: ClusterConfig, plan: PlanConfig) -> Iterator[tuple]:
    world = cluster.nodes * cluster.gpus_per_node
    for tp in tp_sizes(desc, cluster.gpus_per_node):
        if plan.tp is not None and tp not in plan.tp:
            continue
        for cp in cp_sizes(desc, cluster.gpus_per_node, tp, plan):
            for pp in range(1, min(desc.n_layer, world // (tp * cp)) + 1):
                if world % (tp * cp * pp) == 0 and (plan.pp is None or pp in plan.pp):
                    yield tp, cp, pp, world // (tp * cp * pp)


def layouts(desc: ModelDesc, cluster: ClusterConfig, global_batch_size: int, plan: PlanConfig) -> List[PlanLayout]:
    """Every layout to score; ValueError with the fix when the global batch allows none."""
    out, dps, batched = [], set(), []  # batched: the grids some micro-batch takes the global batch on
    for tp, cp, pp, dp in _grids(desc, cluster, plan):
        dps.add(dp)
        stages = [z for z in plan.zero_stages if (dp * cp > 1 or z == 0) and (pp == 1 or z <= 1)]
        for micro in plan.micro_batch_sizes:
            # zoo's pipeline runs at least pp micro-batches per step (zoo.config.validate)
            if global_batch_size % (micro * dp) or (pp > 1 and global_batch_size // (micro * dp) < pp):
                continue
            batched.append((tp, pp, dp))
            out.extend(PlanLayout(tp=tp, pp=pp, dp=dp, zero_stage=z, micro_batch_size=micro,
                                  grad_accum=global_batch_size // (micro * dp), activation_checkpointing=ckpt, cp=cp)
                       for z in stages for ckpt in plan.activation_checkpointing)
    if not dps:
        raise ValueError(f"no tp x pp grid fits {cluster.nodes} node(s) x {cluster.gpus_per_node} GPUs with "
                         f"plan.tp={plan.tp} and plan.pp={plan.pp}; tp must be among "
                         f"{tp_sizes(desc, cluster.gpus_per_node)} and pp at most {desc.n_layer}, with tp*pp "
                         f"dividing {cluster.nodes * cluster.gpus_per_node}")
    if not out and batched:  # the batch fits some grid: the ZeRO stages allowed there are none
        grids = ", ".join(f"tp={tp} pp={pp} dp={dp}" for tp, pp, dp in dict.fromkeys(batched))
        raise ValueError(f"ZeRO stage(s) {list(plan.zero_stages)} admit no layout on "
                         f"{cluster.nodes * cluster.gpus_per_node} GPUs: ZeRO partitions over data-parallel ranks "
                         f"(stages 1-3 need dp > 1) and a pipeline takes stage 0 or 1, and the grids that take "
                         f"this batch are {grids}; allow stage 0 (parallel.zero_stage=0, or leave the stage to the "
                         f"plan)")
    if not out:
        raise ValueError(_no_layout_message(desc, cluster, global_batch_size, plan))
    return out


def _no_layout_message(desc: ModelDesc, cluster: ClusterConfig, global_batch_size: int, plan: PlanConfig) -> str:
    """Why no layout takes this global batch, and the smallest one that some layout takes:
    per grid the batch must be a multiple of micro-batch x dp, and a pipeline needs at least
    pp micro-batches per step."""
    micro = min(plan.micro_batch_sizes)
    best = None  # (smallest admissible global batch, cp, tp, pp, dp): without cp where the batch is the same
    for tp, cp, pp, dp in _grids(desc, cluster, plan):
        unit = micro * dp
        need = max(global_batch_size, unit * (pp if pp > 1 else 1))
        batch = -(-need // unit) * unit
        best = min(best, (batch, cp, tp, pp, dp)) if best else (batch, cp, tp, pp, dp)
    batch, cp, tp, pp, dp = best
    world = cluster.nodes * cluster.gpus_per_node
    need = f"micro-batch {micro} x dp {dp}" + (f" x {pp} micro-batches (at least pp per step)" if pp > 1 else "")
    return (f"trainer.global_batch_size={global_batch_size} admits no layout on {world} GPUs: each tp x pp x dp "
            f"grid needs a multiple of micro-batch x dp, and a pipeline at least pp micro-batches per step; the "
            f"smallest global batch any grid takes is {batch} (tp={tp} {f'cp={cp} ' if cp > 1 else ''}pp={pp} dp={dp}: "
            f"{need}): set "
            f"trainer.global_batch_size={batch} or more (the plan then says whether it fits), or use fewer GPUs "
            f"(cluster.nodes)")


def rank_key(c: Candidate) -> tuple:
    lay = c.layout
    return (not c.fits, c.time.total if c.fits else c.mem.total, lay.tp * lay.cp * lay.pp, lay.zero_stage,
            lay.activation_checkpointing, -lay.micro_batch_size)


def enumerate_layouts(desc: ModelDesc, cluster: ClusterConfig, global_batch_size: int, *, dtype: str = "bf16",
                      plan: Optional[PlanConfig] = None, moments: int = ADAM_MOMENT_BYTES) -> List[Candidate]:
    """Every layout, estimated: those that fit first, fastest first; then the rest, smallest first."""
    plan = plan or PlanConfig()
    found = [estimate(desc, lay, cluster, dtype=dtype, plan=plan, moments=moments)
             for lay in layouts(desc, cluster, global_batch_size, plan)]
    return sorted(found, key=rank_key)


def recommend(candidates: List[Candidate], within: float = 0.02) -> Optional[Candidate]:
    """The fastest layout that fits, unless a pure data-parallel one (tp = cp = pp = 1) is within
    `within` of it: then that one; else, where the fastest splits sequences (cp > 1), the
    fastest that does not, if it is within `within`: cp is for the sequences that need it (at
    GPT-3 175B's 2,048 tokens cp2 x tp4 was estimated 1.1% faster than tp8, closer than the
    estimates are precise). None when nothing fits."""
    fitting = sorted((c for c in candidates if c.fits), key=rank_key)
    if not fitting:
        return None
    fastest = fitting[0].time.total * (1 + within)
    replica = next((c for c in fitting if c.layout.tp == c.layout.cp == c.layout.pp == 1), None)
    if replica is not None and replica.time.total <= fastest:
        return replica
    whole = next((c for c in fitting if c.layout.cp == 1), None)
    if fitting[0].layout.cp > 1 and whole is not None and whole.time.total <= fastest:
        return whole
    return fitting[0]


@dataclass(frozen=True)
class Plan:
    """Everything one planner run found."""

    desc: ModelDesc
    """The model."""
    cluster: ClusterConfig
    """The machines."""
    dtype: str
    """Training precision."""
    global_batch_size: int
    """Samples per optimizer step."""
    plan: PlanConfig
    """Search and output settings."""
    candidates: List[Candidate]
    """Every layout, ranked (fitting ones first, fastest first)."""
    model: Optional[ModelConfig] = None
    """The model section as given (for the training command that reproduces the plan)."""
    vocab_size: Optional[int] = None
    """The tokenizer vocabulary planned for (before padding)."""
    moments: int = ADAM_MOMENT_BYTES
    """The optimizer's state bytes a parameter (zoo.plan.memory.moment_bytes of the optim section)."""

    @property
    def recommended(self) -> Optional[Candidate]:
        return recommend(self.candidates, self.plan.prefer_simpler_within)

    @property
    def usable_bytes(self) -> float:
        return self.plan.mem_fraction * self.cluster.gpu_mem_gb * GB


def make_plan(cfg: PlanRunConfig) -> Plan:
    """Check the config, describe the model, estimate every layout."""
    from zoo.families.registry import check_size, family
    from zoo.plan.fit import GPT2_VOCAB
    from zoo.run.errors import ConfigError

    check_plan(cfg)
    try:
        check_size(cfg.model.family, cfg.model.size)
    except ConfigError as err:
        raise ValueError(str(err)) from None
    published = family(cfg.model.family).published.get(cfg.model.size)
    vocab = cfg.plan.vocab_size or (published[0] if published else GPT2_VOCAB)
    desc = describe_model(cfg.model, vocab)
    moments = moment_bytes(cfg.optim.name, cfg.optim.momentum)
    cands = enumerate_layouts(desc, cfg.cluster, cfg.trainer.global_batch_size, dtype=cfg.precision.dtype, plan=cfg.plan,
                              moments=moments)
    return Plan(desc=desc, cluster=cfg.cluster, dtype=cfg.precision.dtype,
                global_batch_size=cfg.trainer.global_batch_size, plan=cfg.plan, candidates=cands, model=cfg.model,
                vocab_size=vocab, moments=moments)

"""Per-accelerator memory of a layout: model states by ZeRO stage, activations, buffers.

Model states follow Rajbhandari et al. 2020 (ZeRO, section 5) for Adam: with mixed
precision 2 bytes of parameters, 2 of gradients and K = 12 of optimizer states (fp32
master weights, momentum, variance) per parameter; stage 1 partitions the optimizer
states over dp, stage 2 also the gradients, stage 3 also the parameters. With fp32
training the bytes are 4 + 4 + 8 without ZeRO, but DeepSpeed's ZeRO optimizers clone this
rank's partition as fp32 master weights even when the parameters already are fp32, so
K = 12 with ZeRO 1-3 (ZeRO-3 has a branch meant to reuse the partition, but it compares a
device name string with a torch.device and never takes it); tests/plan measures this.

Activations follow Korthikanti et al. 2022 per token of each piece (`zoo.plan.model_desc`),
times the tokens of a micro-batch and the micro-batches in flight: with 1F1B, stage i of p
holds min(p - i, m) of them, so the first stage holds up to p. With activation
checkpointing a layer keeps only its input, and backward recomputes one layer at a time.
Backward's largest transient joins them: a recomputed layer's full set, or the loss's backward
(the gradients of its float32 log-softmax and of the logits, beside the log-softmax it keeps).

Context parallelism (cp ranks share each sequence, zoo.parallel.context) divides the tokens of
a micro-batch by cp; each layer then keeps the whole sequence's keys and values (the gathered
tensors attention saves, kv_width a token) in place of its own share's, and the chunks' masks
where they are built (documents; the CPU's kernels: c x (2cp+1)c of them, c = T / 2cp), unless
the gather and attention are recomputed in the backward (parallel.cp_recompute, or activation
checkpointing): then one layer's gathered keys and values are a transient of the backward and
the masks are boolean. Kept, a layer also keeps `ModelDesc.cp_kept_extra` a local token. The
model states are partitioned over dp x cp.

Buffers are DeepSpeed's: the gradient reduce bucket of ZeRO 1-3 (allocated at its full
size; on a cluster whose memory is resident only where written, the CPU's, as much of it as
the stage's gradients fill), the flattened all-reduce chunks of stage 0, the gathered parameters of two layers
under ZeRO-3 (one computing, one prefetched) and the pipeline's receive buffers.

Host memory (`host_memory`) is what the transitions around the step add on a node: a
sharded checkpoint's save and load hold at most one tensor's piece at a time on each rank
(zoo.checkpoint.sharded: bounded here by the largest tensor, the embedding, in fp32), the
final weights pass one whole tensor at a time through rank 0 (zoo.checkpoint.final), and an
asynchronous save would first copy each rank's whole share (its fp32 master partition and
optimizer states, what it writes) to host memory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Sequence

from zoo.plan.layout import PlanLayout, stage_layer_counts
from zoo.plan.model_desc import ModelDesc, Piece
from zoo.plan.settings import DTYPE_BYTES


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one accelerator."""

    params: float = 0
    """Parameters (this rank's tp shard of its stage, divided by dp under ZeRO-3)."""
    grads: float = 0
    """Gradients (divided by dp from ZeRO-2)."""
    optimizer: float = 0
    """fp32 master weights and the optimizer's moments (divided by dp from ZeRO-1)."""
    activations: float = 0
    """Activations kept for backward, plus recomputation's working set."""
    buffers: float = 0
    """Communication buffers (reduce bucket, gathered ZeRO-3 parameters, pipeline receives)."""
    runtime: float = 0
    """What a rank takes before any model (the cluster's runtime_gb): on CPU the resident runtime."""
    engine: float = 0
    """What the engine's step holds beyond the states and buffers above (DeepSpeed's flat gradient
    partitions and their fp32 copies, gradients before their reduce-scatter, the allocator): the
    cluster's measured engine_bytes_per_param (a + b / dp bytes a parameter of the rank's share,
    by ZeRO stage; benchmarks/step_memory.py), 0 where not measured."""

    @property
    def total(self) -> float:
        return (self.params + self.grads + self.optimizer + self.activations + self.buffers + self.runtime
                + self.engine)

    def as_dict(self) -> Dict[str, int]:
        out = {k: int(round(v)) for k, v in asdict(self).items()}
        out["total"] = int(round(self.total))
        return out


ADAM_MOMENT_BYTES = 8
"""AdamW's fp32 momentum and variance, bytes a parameter."""


def moment_bytes(optimizer: str, momentum: float = 0.0) -> int:
    """Bytes a parameter of the optimizer's own fp32 state (optim.name, optim.momentum): AdamW's two
    moments 8; torch's SGD keeps one momentum buffer (4), none without momentum (0)."""
    if optimizer == "adamw":
        return ADAM_MOMENT_BYTES
    if optimizer == "sgd":
        return 4 if momentum > 0 else 0
    raise ValueError(f"optim.name={optimizer!r}: the planner knows adamw and sgd")


def model_state_bytes(n_params: float, dp: int, zero_stage: int, dtype: str,
                      moments: int = ADAM_MOMENT_BYTES) -> MemoryEstimate:
    """Parameters, gradients and optimizer states of `n_params` parameters on one of `dp` ranks;
    `moments`: the optimizer's own state, bytes a parameter (moment_bytes)."""
    mixed = dtype != "fp32"
    weight_bytes = DTYPE_BYTES[dtype]
    master_bytes = 4 if mixed or zero_stage >= 1 else 0  # the fp32 copy the update writes
    optimizer_bytes = master_bytes + moments
    return MemoryEstimate(params=n_params * weight_bytes / (dp if zero_stage >= 3 else 1),
                          grads=n_params * weight_bytes / (dp if zero_stage >= 2 else 1),
                          optimizer=n_params * optimizer_bytes / (dp if zero_stage >= 1 else 1))


def stage_layers(desc: ModelDesc, pp: int, stage: int) -> List[Piece]:
    """The run of layers pipeline stage `stage` holds."""
    counts = stage_layer_counts(desc.n_layer, pp)
    start = sum(counts[:stage])
    return list(desc.layers[start:start + counts[stage]])


def stage_pieces(desc: ModelDesc, pp: int, stage: int) -> List[Piece]:
    """The pieces pipeline stage `stage` holds: its layers, and the ends at the ends."""
    pieces = stage_layers(desc, pp, stage)
    if stage == 0:
        pieces.insert(0, desc.embedding)
    if stage == pp - 1:
        pieces.append(desc.head)
    return pieces


def stage_params(desc: ModelDesc, pp: int, stage: int, tp: int) -> float:
    """Parameters one tp rank of `stage` holds; the last of several stages also holds its copy
    of a tied embedding's shared (vocab-sharded) weight, not the rest of the input end."""
    tied_copy = desc.embedding.params.sharded / tp if desc.head_ties_embedding and 0 < stage == pp - 1 else 0
    return sum(p.params.per_rank(tp) for p in stage_pieces(desc, pp, stage)) + tied_copy


def stage_memory(desc: ModelDesc, lay: PlanLayout, stage: int, *, dtype: str, sequence_parallel: bool,
                 bucket_elems: int, resident_on_write: bool = False, document_mask: bool = False,
                 engine_bytes_per_param: Sequence[Sequence[float]] = (),
                 moments: int = ADAM_MOMENT_BYTES, builds_causal_masks: bool = False,
                 cp_recompute: bool = True) -> MemoryEstimate:
    """Bytes on one accelerator of pipeline stage `stage` (`moments`: the optimizer's state bytes a
    parameter, moment_bytes); `resident_on_write`: memory counts
    where written (host memory), so the reduce bucket holds at most the stage's gradients;
    `document_mask`: a stage with layers keeps one (B, 1, T, T) attention mask in the dtype
    per micro-batch in flight (zoo.models.documents.attention_mask), not split by tp or sp;
    `engine_bytes_per_param`: (a, b) for ZeRO stages 0-3, the engine's measured working set of
    a + b / dp bytes a parameter of the stage's tp share (MemoryEstimate.engine); `builds_causal_masks`:
    context parallelism's causal chunk masks are built (the cluster's builds_causal_masks);
    `cp_recompute`: parallel.cp_recompute (the gathered keys and values not kept)."""
    elt, tp = DTYPE_BYTES[dtype], lay.tp
    sp = sequence_parallel and tp > 1
    pieces = stage_pieces(desc, lay.pp, stage)
    n = stage_params(desc, lay.pp, stage, tp)
    states = model_state_bytes(n, lay.replicas, lay.zero_stage, dtype, moments)

    tokens = lay.micro_batch_size * desc.tokens_per_sample / lay.cp  # this rank's share of each sequence
    kept = sum((p.checkpoint if lay.activation_checkpointing else p.activations).bytes_per_token(elt, tp, sp)
               for p in pieces)
    in_flight = min(lay.pp - stage, lay.grad_accum)
    activations = in_flight * tokens * kept
    layers = stage_layers(desc, lay.pp, stage)
    # cp's masks are boolean where its attention alone is recomputed (zoo.parallel.context.masks)
    mask_elt = 1 if lay.cp > 1 and cp_recompute and not lay.activation_checkpointing else elt
    if document_mask and layers:  # (B, 1, T, T); under cp each chunk's rows over the keys before its end
        activations += in_flight * lay.micro_batch_size * _mask_elems(desc.tokens_per_sample, lay.cp) * mask_elt
    if desc.windowed and lay.cp == 1 and layers:  # the window's additive mask (zoo.models.sliding_window)
        T = desc.tokens_per_sample  # one (T, T) for causal blocks, shared; a windowed copy of each document mask
        activations += (in_flight * lay.micro_batch_size if document_mask else 1) * T * T * elt
    elif (builds_causal_masks or desc.windowed) and lay.cp > 1 and layers and not document_mask:  # a (c, keys) a chunk
        activations += in_flight * _mask_elems(desc.tokens_per_sample, lay.cp) * mask_elt
    # cp: a layer keeps the gathered keys and values of the whole sequence (its own share is counted above)
    gathered = lay.micro_batch_size * desc.tokens_per_sample * (1 - 1 / lay.cp) * desc.kv_width / tp * elt
    regathered = lay.activation_checkpointing or cp_recompute  # in the backward, one layer at a time
    if not regathered:
        activations += in_flight * len(layers) * (gathered + tokens * desc.cp_kept_extra / tp * elt)
    # Transients of backward, one piece at a time: a recomputed layer's full set (activation
    # checkpointing), or what a piece's backward allocates beside what it keeps (the logits' gradient).
    transient = max([p.backward_extra.bytes_per_token(elt, tp, sp) for p in pieces]
                    + [p.activations.bytes_per_token(elt, tp, sp) for p in layers if lay.activation_checkpointing])
    activations += tokens * transient + (gathered if regathered and layers else 0)

    buffers = 0.0
    if lay.zero_stage == 0 and lay.dp > 1:  # gradients flattened into <= bucket-sized chunks to all-reduce
        buffers += min(n, bucket_elems) * elt
    if lay.zero_stage >= 1:
        buffers += (min(n, bucket_elems) if resident_on_write else bucket_elems) * elt
    if lay.zero_stage == 3 and layers:
        buffers += 2 * max(p.params.per_rank(tp) for p in layers) * elt
    if lay.pp > 1:  # receive buffers for the activation (forward) and its gradient (backward)
        buffers += 2 * tokens * desc.hidden_size * elt / (tp if sp else 1)
    engine = 0.0
    if lay.zero_stage < len(engine_bytes_per_param):
        a, b = engine_bytes_per_param[lay.zero_stage]
        engine = (a + b / lay.replicas) * n
    return MemoryEstimate(params=states.params, grads=states.grads, optimizer=states.optimizer,
                          activations=activations, buffers=buffers, engine=engine)


def _mask_elems(T: int, cp: int) -> float:
    """Elements of one sample's attention mask: T x T, or under cp a rank's two chunks' rows over
    the keys before each one's end, c x (2cp + 1) c with c = T / 2cp (the same on every rank)."""
    if cp == 1:
        return T * T
    c = T / (2 * cp)
    return c * (2 * cp + 1) * c


def layout_memory(desc: ModelDesc, lay: PlanLayout, *, dtype: str, sequence_parallel: bool = True,
                  bucket_elems: int = 500_000_000, runtime_bytes: float = 0.0,
                  resident_on_write: bool = False, document_mask: bool = False,
                  engine_bytes_per_param: Sequence[Sequence[float]] = (),
                  moments: int = ADAM_MOMENT_BYTES, builds_causal_masks: bool = False,
                  cp_recompute: bool = True) -> MemoryEstimate:
    """The heaviest accelerator of the layout: the first pipeline stage (most micro-batches in
    flight, the embedding) or the last (the output layer and its logits); with `runtime_bytes`
    (a rank's memory before any model) added."""
    stages = {0, lay.pp - 1}
    heaviest = max((stage_memory(desc, lay, s, dtype=dtype, sequence_parallel=sequence_parallel,
                                 bucket_elems=bucket_elems, resident_on_write=resident_on_write,
                                 document_mask=document_mask, engine_bytes_per_param=engine_bytes_per_param,
                                 moments=moments, builds_causal_masks=builds_causal_masks, cp_recompute=cp_recompute)
                    for s in stages),
                   key=lambda m: m.total)
    return replace(heaviest, runtime=runtime_bytes)


@dataclass(frozen=True)
class HostEstimate:
    """Host memory bytes on one node during checkpoint transitions."""

    per_rank_transient: float
    """What a rank's sharded save or load holds at once: one tensor's piece (the largest, fp32)."""
    final_weights: float
    """What rank 0 holds while writing the final weights: one whole tensor (the largest, fp32)."""
    async_staging: float
    """What one rank would stage for an asynchronous save: its share of the checkpoint."""
    ranks: int
    """Ranks on the node."""

    @property
    def sync(self) -> float:
        """The node's peak addition for a synchronous save (and any load)."""
        return self.ranks * self.per_rank_transient + self.final_weights

    @property
    def with_async(self) -> float:
        return self.ranks * (self.async_staging + self.per_rank_transient) + self.final_weights


def host_memory(desc: ModelDesc, lay: PlanLayout, ranks_per_node: int,
                moments: int = ADAM_MOMENT_BYTES) -> HostEstimate:
    """The host memory checkpoint transitions add on a node of `ranks_per_node` ranks (the
    heaviest pipeline stage's share: the first or the last; `moments` as in model_state_bytes)."""
    largest = 4 * max([desc.embedding.params.total, desc.head.params.total]
                      + [p.params.total / 4 for p in desc.layers])  # a layer's largest matrix: ~1/4 of it
    share = max(model_state_bytes(stage_params(desc, lay.pp, s, lay.tp), lay.replicas, 1, "fp32", moments).optimizer
                for s in {0, lay.pp - 1})  # the fp32 master and the optimizer's state of its partition
    return HostEstimate(per_rank_transient=largest, final_weights=largest, async_staging=share,
                        ranks=min(ranks_per_node, lay.world_size))

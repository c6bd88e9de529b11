"""Estimated time of one optimizer step of a layout.

- Compute: training FLOPs per token are 3x the forward's (backward is twice the forward),
  6N + 12*L*h*s for a GPT (N parameters in matrix multiplies, L layers, hidden h, context
  s); activation checkpointing adds one more forward of the layers (8N + 16*L*h*s). A
  rank's share runs at peak * mfu, lowered by the roofline when the narrowest matrix
  multiply (tokens x K x N/tp) is memory-bound: efficiency = mfu * min(1, intensity *
  hbm_bandwidth / peak).
- Tensor parallelism: each layer's all-reduces (2 forward, 2 backward, 2 more when
  recomputing) of tokens*h elements, as ring all-reduces, 2(t-1)/t of the bytes, over the
  NVLink bandwidth; with sequence parallelism the all-gather + reduce-scatter pairs move the same.
- Context parallelism: a rank computes its share of each sequence (T/cp tokens, the attention
  work balanced by the chunk pairing); each layer all-gathers the keys and values (kv_width a
  token) in forward (again when recomputing) and reduce-scatters their gradient in backward,
  (cp-1)/cp of the whole sequence's bytes each time, inside the node while tp x cp fits one;
  with parallel.cp_recompute the backward gathers again and reruns attention's forward (4hT
  FLOPs a token and layer).
  Gradients and ZeRO's partitions are over dp x cp.
- Pipeline: m micro-batches through p stages take (m + p - 1) slots of the slowest stage:
  the bubble is (p-1)/(m+p-1) of the pipeline time; each slot also sends an activation
  forward and receives its gradient (p2p, over the network when stages span nodes).
- Data parallelism, once per step unless said: all-reduce of the gradients (ZeRO 0/1:
  2(d-1)/d of the gradient bytes); ZeRO-2 reduce-scatters every micro-batch and all-gathers
  the parameters once; ZeRO-3 all-gathers parameters in forward and backward and
  reduce-scatters gradients every micro-batch, 1.5x the all-reduce's volume each time.
  Over the network (1/gpus_per_node of a node's bandwidth each) when the job spans nodes.
- Optimizer: reading and writing the model states of this rank's partition once (all of
  them without ZeRO, 1/dp of them with ZeRO 1-3), at memory bandwidth.
- Overhead: a fixed time per micro-batch on every stage (cluster.micro_batch_overhead_ms)
  and per layer of the stage (cluster.layer_overhead_ms, a third more when recomputing), whatever
  the micro-batch's size: what makes many small micro-batches slower than few large ones
  beyond the roofline (dispatch, launches, collectives' latency).
Nothing is assumed to overlap: communication adds to compute.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Tuple

from zoo.plan.layout import PlanLayout
from zoo.plan.memory import ADAM_MOMENT_BYTES, model_state_bytes, stage_layers, stage_params, stage_pieces
from zoo.plan.model_desc import ModelDesc, Piece
from zoo.plan.settings import DTYPE_BYTES, ClusterConfig


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step, by cause."""

    compute: float = 0
    """Forward, backward and recomputation of the micro-batches on the slowest stage."""
    tp_comm: float = 0
    """Tensor-parallel all-reduces."""
    cp_comm: float = 0
    """Context parallelism's key/value all-gathers and their gradients' reduce-scatters."""
    pp_comm: float = 0
    """Pipeline sends and receives."""
    bubble: float = 0
    """The pipeline's idle slots: (p-1) of the slowest stage's per-micro-batch time."""
    dp_comm: float = 0
    """Data-parallel gradient (and ZeRO-3 parameter) collectives."""
    optimizer: float = 0
    """The optimizer update over this rank's model states."""
    overhead: float = 0
    """The fixed cost of the micro-batches on the slowest stage (dispatch, launches, latency)."""

    @property
    def total(self) -> float:
        return (self.compute + self.tp_comm + self.cp_comm + self.pp_comm + self.bubble + self.dp_comm
                + self.optimizer + self.overhead)

    def as_dict(self) -> Dict[str, float]:
        return {**asdict(self), "total": self.total}


def training_flops_per_token(pieces: List[Piece], layers: List[Piece], checkpointing: bool) -> float:
    """Forward + backward (3x forward), plus the layers' recomputed forward with checkpointing."""
    return 3 * sum(p.fwd_flops_per_token for p in pieces) + (
        sum(p.fwd_flops_per_token for p in layers) if checkpointing else 0)


def peak_flops(cluster: ClusterConfig, dtype: str) -> float:
    tflops = cluster.peak_tflops if dtype != "fp32" else (cluster.fp32_tflops or cluster.peak_tflops / 2)
    return tflops * 1e12


def gemm_efficiency(desc: ModelDesc, tokens: int, tp: int, cluster: ClusterConfig, dtype: str) -> float:
    """mfu, lowered when the narrowest matrix multiply (tokens x K x N/tp) is memory-bound."""
    k, n = desc.gemm_shape[0], desc.gemm_shape[1] / tp
    elt = DTYPE_BYTES[dtype]
    intensity = 2 * tokens * k * n / (elt * (tokens * k + k * n + tokens * n))  # FLOPs per byte moved
    return cluster.mfu * min(1.0, intensity * cluster.hbm_gbps * 1e9 / peak_flops(cluster, dtype))


def ring_allreduce_s(nbytes: float, ranks: int, gbps: float, efficiency: float) -> float:
    """A ring all-reduce sends 2(n-1)/n of the buffer from every rank."""
    return 0.0 if ranks == 1 else 2 * (ranks - 1) / ranks * nbytes / (gbps * 1e9 * efficiency)


def spans_nodes(block: int, cluster: ClusterConfig) -> bool:
    """Whether some aligned block of `block` consecutive ranks (a model replica is tp*pp of
    them, the whole job is the world) has ranks on two nodes."""
    return block > cluster.gpus_per_node or cluster.gpus_per_node % block != 0


def network_gbps(cluster: ClusterConfig, crosses_nodes: bool) -> float:
    """Per-accelerator bandwidth: NVLink inside a node, a share of the node's NICs between nodes."""
    return cluster.inter_node_gbps / cluster.gpus_per_node if crosses_nodes else cluster.intra_node_gbps


def _stage_micro_times(desc: ModelDesc, lay: PlanLayout, stage: int, cluster: ClusterConfig, dtype: str,
                       sequence_parallel: bool, cp_recompute: bool = True) -> Tuple[float, float, float, float, float]:
    """(compute, tp communication, cp communication, pp communication, fixed overhead) seconds of
    one micro-batch on `stage`."""
    elt = DTYPE_BYTES[dtype]
    tokens = lay.micro_batch_size * desc.tokens_per_sample / lay.cp  # this rank's share
    pieces, layers = stage_pieces(desc, lay.pp, stage), stage_layers(desc, lay.pp, stage)
    ckpt = lay.activation_checkpointing
    flops = tokens * training_flops_per_token(pieces, layers, ckpt) / lay.tp
    recompute = lay.cp > 1 and cp_recompute and not ckpt  # attention's forward again (checkpointing: the layer's)
    if recompute:
        flops += tokens * len(layers) * 4 * desc.hidden_size * desc.tokens_per_sample / lay.tp
    compute = flops / (peak_flops(cluster, dtype) * gemm_efficiency(desc, tokens, lay.tp, cluster, dtype))
    allreduced = sum(p.tp_allreduce_elems_per_token for p in pieces) + (
        sum(p.tp_allreduce_elems_per_token for p in layers) / 2 if ckpt else 0)
    tp_comm = ring_allreduce_s(tokens * allreduced * elt, lay.tp, cluster.intra_node_gbps, cluster.comm_efficiency)
    pp_comm = 0.0
    if lay.pp > 1:
        p2p_bytes = tokens * desc.hidden_size * elt / (lay.tp if sequence_parallel and lay.tp > 1 else 1)
        gbps = network_gbps(cluster, spans_nodes(lay.tp * lay.pp, cluster))
        pp_comm = 2 * p2p_bytes / (gbps * 1e9 * cluster.comm_efficiency)
    cp_comm = 0.0
    if lay.cp > 1:  # per layer: the gather forward (again when recomputing), the reduce-scatter backward
        moved = lay.micro_batch_size * desc.tokens_per_sample * desc.kv_width / lay.tp * elt * (lay.cp - 1) / lay.cp
        gbps = network_gbps(cluster, spans_nodes(lay.tp * lay.cp, cluster))
        cp_comm = len(layers) * (3 if ckpt or recompute else 2) * moved / (gbps * 1e9 * cluster.comm_efficiency)
    overhead = (cluster.micro_batch_overhead_ms + len(layers) * cluster.layer_overhead_ms * (4 / 3 if ckpt else 1)) / 1e3
    return compute, tp_comm, cp_comm, pp_comm, overhead


def dp_comm_bytes(n_params: float, lay: PlanLayout, dtype: str) -> float:
    """Bytes a rank sends per step in the data-parallel collectives of its `n_params` parameters
    (over dp x cp: the cp ranks sum their gradients too)."""
    r = lay.replicas
    if r == 1:
        return 0.0
    share = (r - 1) / r * n_params * DTYPE_BYTES[dtype]  # one reduce-scatter or all-gather
    m = lay.grad_accum
    return {0: 2 * share, 1: 2 * share, 2: (m + 1) * share, 3: 3 * m * share}[lay.zero_stage]


def step_time(desc: ModelDesc, lay: PlanLayout, cluster: ClusterConfig, *, dtype: str,
              sequence_parallel: bool = True, moments: int = ADAM_MOMENT_BYTES, cp_recompute: bool = True) -> StepTime:
    """Seconds per optimizer step of the layout's slowest stage (`moments`: the optimizer's state
    bytes a parameter, zoo.plan.memory.moment_bytes)."""
    per_stage = [_stage_micro_times(desc, lay, s, cluster, dtype, sequence_parallel, cp_recompute)
                 for s in {0, lay.pp - 1}]
    compute, tp_comm, cp_comm, pp_comm, overhead = max(per_stage, key=sum)
    m = lay.grad_accum
    n = max(stage_params(desc, lay.pp, s, lay.tp) for s in {0, lay.pp - 1})
    dp_gbps = network_gbps(cluster, spans_nodes(lay.world_size, cluster))
    dp_comm = dp_comm_bytes(n, lay, dtype) / (dp_gbps * 1e9 * cluster.comm_efficiency)
    # The update reads and writes the states of this rank's partition (all of them without ZeRO).
    touched = model_state_bytes(n, lay.replicas, 3 if lay.zero_stage >= 1 else 0, dtype, moments).total
    optimizer = 2 * touched / (cluster.hbm_gbps * 1e9)
    return StepTime(compute=m * compute, tp_comm=m * tp_comm, cp_comm=m * cp_comm, pp_comm=m * pp_comm,
                    bubble=(lay.pp - 1) * (compute + tp_comm + pp_comm + overhead), dp_comm=dp_comm,
                    optimizer=optimizer, overhead=m * overhead)

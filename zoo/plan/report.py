"""The planner's output: the recommendation with its reasons, the best candidates, the
topology diagram (text), or one JSON object with every candidate (json)."""
from __future__ import annotations

import json
import textwrap
from typing import List, Optional

from zoo.plan.layout import stage_layer_counts
from zoo.plan.memory import model_state_bytes
from zoo.plan.search import GB, Candidate, Plan
from zoo.plan.step_time import spans_nodes

WIDTH = 110  # the text output's lines (the training command stays one line, to copy)


def _link(c) -> str:
    """What joins the devices of a node: NVLink between GPUs; loopback between CPU ranks."""
    return "NVLink" if c.device == "GPU" else "loopback"


def _best(cands: List[Candidate], pred) -> Optional[Candidate]:
    return next((c for c in cands if pred(c)), None)


def _split(lay) -> str:
    """How the model's ranks multiply: `tp x pp = 8`, with cp `tp x cp x pp = 8`."""
    if lay.cp > 1:
        return f"tp x cp x pp = {lay.tp * lay.cp * lay.pp}"
    return f"tp x pp = {lay.tp * lay.pp}"


def _model_split_reason(p: Plan, best: Candidate) -> str:
    lay, usable, gpu = best.layout, p.usable_bytes, p.cluster.device
    replica = model_state_bytes(p.desc.num_params, 1, 0, p.dtype, p.moments).total
    if lay.tp == lay.cp == lay.pp == 1 and replica > usable:
        states = best.mem.params + best.mem.grads + best.mem.optimizer
        return (f"Data parallelism with the model states partitioned: a whole replica ({replica / GB:.1f} GB of "
                f"parameters, gradients and optimizer states) is more than one {gpu}'s {usable / GB:.1f} GB usable, but "
                f"ZeRO-{lay.zero_stage} over dp={lay.dp} leaves each {gpu} {states / GB:.1f} GB of them, so tp=1, pp=1: "
                f"no model-parallel communication, ZeRO's gathers and reduce-scatters instead.")
    if lay.tp == lay.cp == lay.pp == 1:
        return (f"Data parallelism while the model fits: a whole replica ({replica / GB:.1f} GB of parameters, "
                f"gradients and optimizer states) fits one {gpu}'s {usable / GB:.1f} GB usable, so tp=1, pp=1 and every "
                f"{gpu} is a replica: no model-parallel communication at all.")
    replicas = [x for x in p.candidates if x.layout.tp == x.layout.cp == x.layout.pp == 1]
    pure_dp = _best(replicas, lambda x: x.fits)
    kept = [f"{k}={getattr(p.plan, k)}" for k in ("tp", "cp", "pp") if getattr(p.plan, k) and 1 not in getattr(p.plan, k)]
    if not replicas and kept:
        return (f"The model is split {_split(lay)} ways as the layout kept from the command line asks "
                f"(plan {', '.join(kept)}).")
    if not replicas:
        world = p.cluster.nodes * p.cluster.gpus_per_node
        return (f"Pure data parallelism is impossible: dp={world} with the smallest micro-batch does not divide the "
                f"global batch {p.global_batch_size}; the model is split {_split(lay)} ways instead.")
    if pure_dp is None:
        smallest = min(replicas, key=lambda x: x.mem.total)
        return (f"The model does not fit as a data-parallel replica: {replica / GB:.1f} GB of model states without "
                f"ZeRO, and the smallest pure data-parallel estimate is {smallest.mem.total / GB:.1f} GB "
                f"(ZeRO-{smallest.layout.zero_stage}, micro-batch {smallest.layout.micro_batch_size}) > "
                f"{usable / GB:.1f} GB usable; so it is split {_split(lay)} ways.")
    return (f"A pure data-parallel layout fits too (ZeRO-{pure_dp.layout.zero_stage}, {pure_dp.time.total:.3g} s/step) "
            f"but is {pure_dp.time.total / best.time.total - 1:.0%} slower: its data-parallel traffic "
            f"({pure_dp.time.dp_comm:.3g} s/step) costs more than splitting the model {_split(lay)} ways.")


def reasons(p: Plan) -> List[str]:
    """Why the recommended layout, rule by rule, with the numbers."""
    best, c = p.recommended, p.cluster
    assert best is not None, "reasons() needs a recommendation"
    lay, out = best.layout, [_model_split_reason(p, best)]
    fastest = p.candidates[0]
    if fastest is not best:
        fl = fastest.layout
        simpler = ("pure data parallelism wins" if lay.tp == lay.cp == lay.pp == 1
                   else "the fastest without cp wins (cp for the sequences that need it)")
        out.append(f"The fastest estimate (tp={fl.tp} {f'cp={fl.cp} ' if fl.cp > 1 else ''}pp={fl.pp} dp={fl.dp}, "
                   f"{fastest.time.total:.3g} s/step) is only {best.time.total / fastest.time.total - 1:.1%} faster, "
                   f"within the estimates' precision (plan.prefer_simpler_within={p.plan.prefer_simpler_within:g}): "
                   f"{simpler}.")
    if lay.tp > 1:
        out.append(f"Tensor parallelism inside a node: tp={lay.tp} of the {c.gpus_per_node} {c.device}s of a node; its 4 "
                   f"all-reduces per layer per micro-batch run over {_link(c)} at {c.intra_node_gbps:g} GB/s "
                   f"({best.time.tp_comm:.3g} s/step).")
    if lay.cp > 1:
        T = p.desc.tokens_per_sample
        where = "across nodes" if spans_nodes(lay.tp * lay.cp, c) else "inside the node, beside tp"
        out.append(f"Context parallelism {where}: cp={lay.cp} ranks share each sequence of {T} tokens ({T // lay.cp} "
                   f"a rank, in 2 x {lay.cp} chunks), so a {c.device} keeps 1/{lay.cp} of a sequence's activations "
                   f"({best.mem.activations / GB:.1f} GB here); each layer all-gathers the keys and values "
                   f"({best.time.cp_comm:.3g} s/step).")
    if lay.pp > 1:
        counts = stage_layer_counts(p.desc.n_layer, lay.pp)
        split = (f"{counts[0]} layers each" if len(set(counts)) == 1 else
                 f"{min(counts)}-{max(counts)} layers ({p.desc.n_layer} layers do not divide by {lay.pp}; the first "
                 f"stages take one more)")
        where = (f"across nodes: only the stage boundaries' activations, the lightest traffic, cross the "
                 f"{c.inter_node_gbps:g} GB/s network" if spans_nodes(lay.tp * lay.pp, c) else "inside the node")
        out.append(f"Pipeline parallelism {where}; pp={lay.pp} stages of {split}, p2p {best.time.pp_comm:.3g} s/step.")
    if lay.dp > 1:
        zero = {0: "no ZeRO partitioning is needed",
                1: "ZeRO-1 partitions the optimizer states over dp (no extra traffic)",
                2: "ZeRO-2 partitions optimizer states and gradients",
                3: "ZeRO-3 partitions parameters too (1.5x the traffic, every micro-batch)"}[lay.zero_stage]
        span = "across nodes" if spans_nodes(lay.world_size, c) else "inside the node"
        out.append(f"Data parallelism outermost: dp={lay.dp} replicas {span}, gradients reduced once per step "
                   f"({best.time.dp_comm:.3g} s/step); {zero}"
                   + ("; ZeRO-2/3 are not possible with pp > 1 (DeepSpeed's pipeline engine supports ZeRO-1)."
                      if lay.pp > 1 else "."))
    else:
        out.append(f"dp=1: the model-parallel ranks take every {c.device}, so there is no data parallelism.")
    m = lay.grad_accum
    if lay.pp > 1:
        ratio = m / lay.pp
        advice = "" if ratio >= 2 else " (fewer than 2x the stages: raise trainer.global_batch_size to shrink the bubble)"
        out.append(f"Micro-batches: {m} per step = {ratio:.1f}x the {lay.pp} stages (aim for at least 2-4x){advice}; "
                   f"bubble (p-1)/(m+p-1) = {(lay.pp - 1) / (m + lay.pp - 1):.1%} of the pipeline time.")
    out.append(f"Gradient accumulation {m} = global batch {p.global_batch_size} / (micro-batch {lay.micro_batch_size} "
               f"x dp {lay.dp}), reaching the global batch with {best.mem.activations / GB:.1f} GB of activations per {c.device}.")
    if lay.activation_checkpointing:
        out.append("Activation checkpointing on: without it nothing as fast fits; recomputation costs one more "
                   "forward of the layers (+1/3 of their compute).")
    else:
        out.append("Activation checkpointing off: the stored activations fit, so nothing is recomputed.")
    return out


def _row(rank: int, x: Candidate) -> str:
    lay, m = x.layout, x.mem
    return (f"{rank:>3} {lay.tp:>3} {lay.cp:>3} {lay.pp:>3} {lay.dp:>4} {lay.zero_stage:>4} {lay.micro_batch_size:>5} "
            f"{lay.grad_accum:>5} {'on' if lay.activation_checkpointing else 'off':>4} "
            f"{m.params / GB:>7.1f} {m.grads / GB:>6.1f} {m.optimizer / GB:>6.1f} {m.activations / GB:>6.1f} "
            f"{m.buffers / GB:>6.1f} {m.total / GB:>7.1f} {x.time.total:>8.3f} {x.tokens_per_s:>9.0f} {'yes' if x.fits else 'no':>4}")


HEADER = ("  # " + " tp  cp  pp   dp zero micro accum ckpt  params  grads  optim   acts   bufs   total   step_s  tokens/s fits")


def trimmed_diagram(text: str, max_items: int) -> str:
    """describe_grid's diagram with at most `max_items` rank lines and groups of each kind."""
    lines, kept, seen = text.rstrip("\n").split("\n"), [], {}
    for line in lines:
        kind = line.split(" ")[0] if " group:" in line else ("rank" if line[:4].strip().isdigit() else None)
        if kind is None:
            kept.append(line)
            continue
        seen[kind] = seen.get(kind, 0) + 1
        if seen[kind] <= max_items:
            kept.append(line)
        elif seen[kind] == max_items + 1:
            kept.append(f"... ({kind} lines after the first {max_items} left out)")
    return "\n".join(kept) + "\n"


# fp16 is planned as bf16: 2-byte weights, gradients and activations, fp32 master and moments
# (its loss scaler's state is a few numbers).
DTYPE_NOTES = {"fp16": " (as bf16)"}


def render_text(p: Plan) -> str:
    c, d = p.cluster, p.desc
    world = c.nodes * c.gpus_per_node
    out = [f"model {d.name}: {d.num_params / 1e9:.3f}B parameters, {d.n_layer} layers, hidden {d.hidden_size}, "
           f"context {d.tokens_per_sample}; {p.dtype}{DTYPE_NOTES.get(p.dtype, '')}, global batch "
           f"{p.global_batch_size}",
           f"cluster {c.name}: {c.nodes} node(s) x {c.gpus_per_node} {c.device}s = {world}, {c.gpu_mem_gb:g} GB each "
           f"({p.plan.mem_fraction:.0%} usable: {p.usable_bytes / GB:.1f} GB), {c.peak_tflops:g} TFLOP/s peak at "
           f"{c.mfu:.0%} MFU, {_link(c)} {c.intra_node_gbps:g} GB/s, network {c.inter_node_gbps:g} GB/s per node",
           f"{len(p.candidates)} layouts estimated, {sum(x.fits for x in p.candidates)} fit", ""]
    best = p.recommended
    if best is None:
        smallest = min(p.candidates, key=lambda x: x.mem.total)
        out += [f"NOTHING FITS: the smallest estimate is {smallest.mem.total / GB:.1f} GB per {c.device} "
                f"(tp={smallest.layout.tp}, pp={smallest.layout.pp}, ZeRO-{smallest.layout.zero_stage}, "
                f"micro-batch {smallest.layout.micro_batch_size}) > {p.usable_bytes / GB:.1f} GB usable; add nodes "
                f"(cluster.nodes), use larger {c.device}s, or allow more plan.micro_batch_sizes/zero_stages.", "", HEADER,
                _row(1, smallest)]
        return "\n".join(out) + "\n"
    lay = best.layout
    head = [f"RECOMMENDED: tp={lay.tp} {f'cp={lay.cp} ' if lay.cp > 1 else ''}pp={lay.pp} dp={lay.dp} "
            f"zero_stage={lay.zero_stage} "
            f"micro_batch_size={lay.micro_batch_size} grad_accum={lay.grad_accum} "
            f"activation_checkpointing={str(lay.activation_checkpointing).lower()}",
            f"  {best.mem.total / GB:.1f} GB per {c.device}, {best.time.total:.3f} s/step, {best.tokens_per_s:,.0f} tokens/s",
            "  step (s): " + ", ".join(f"{k} {v:.3f}" for k, v in best.time.as_dict().items()
                                          # overhead: where a preset has it; cp_comm: with cp
                                          if k != "total" and (v or k not in ("overhead", "cp_comm"))),
            "  train with: python -m zoo.train " + " ".join(train_overrides(p, best)),
            "  (add --dry-run to that command to check it where it will run: validated and planned, nothing "
            "started)"] + host_lines(p, best)
    # The recommendation leads; then its reasons, the setting it was planned for, the runners-up.
    why = [textwrap.fill(r, WIDTH, initial_indent="- ", subsequent_indent="  ") for r in reasons(p)]
    out = head + ["", "Why:"] + why + [""] + [textwrap.fill(line, WIDTH, subsequent_indent="  ") for line in out]
    out += [f"Best {min(p.plan.top, len(p.candidates))} of {len(p.candidates)} (memory in GB per {p.cluster.device}):", HEADER]
    out += [_row(i + 1, x) for i, x in enumerate(p.candidates[:p.plan.top])]
    if c.runtime_gb > 0:
        out.append(f"  (total includes {c.runtime_gb:g} GB a rank takes before any model: cluster.runtime_gb)")
    out.append(f"  {measured_note(c)}")
    out += ["", "Device topology of the recommended layout:"]
    if p.plan.verbose:
        from zoo.parallel.topology import describe_grid  # imports DeepSpeed: only the full diagram needs it

        hosts = [f"node{r // c.gpus_per_node}" for r in range(lay.world_size)]
        out.append(trimmed_diagram(describe_grid(lay.grid, hosts), p.plan.diagram_ranks).rstrip("\n"))
    else:
        out += topology_summary(lay, c) + ["  (plan.verbose=true lists every rank and group)"]
    return "\n".join(out) + "\n"


def host_lines(p: Plan, best: Candidate) -> List[str]:
    """The node's host memory at a checkpoint (and what an async save would stage), with a
    warning where it would not fit in plan.mem_fraction of cluster.host_mem_gb."""
    from zoo.plan.memory import host_memory

    c = p.cluster
    host = host_memory(p.desc, best.layout, c.gpus_per_node, p.moments)
    limit = p.plan.mem_fraction * c.host_mem_gb * GB
    out = [f"  host memory per node at a checkpoint: +{host.sync / GB:.1f} GB of {c.host_mem_gb:g} GB (each rank's "
           f"sharded save or load holds one tensor, {host.per_rank_transient / GB:.2f} GB at most; an async save "
           f"would stage each rank's {host.async_staging / GB:.1f} GB share: +{host.with_async / GB:.1f} GB)"]
    if host.sync > limit:
        out.append(f"  WARNING: a checkpoint needs {host.sync / GB:.1f} GB of host memory per node, more than "
                   f"{p.plan.mem_fraction:.0%} of the node's {c.host_mem_gb:g} GB: use nodes with more RAM or fewer "
                   f"ranks per node (cluster.host_mem_gb, cluster.gpus_per_node)")
    elif host.with_async > limit:
        out.append(f"  note: an async save would need {host.with_async / GB:.1f} GB of host memory per node, more than "
                   f"{p.plan.mem_fraction:.0%} of {c.host_mem_gb:g} GB: save synchronously on these nodes")
    return [textwrap.fill(line, WIDTH, subsequent_indent="    ") for line in out]


def measured_note(c) -> str:
    """Whether the preset's fixed costs (a rank's memory before any model, the time per
    micro-batch and per layer) were measured, and where; estimates leave them out otherwise."""
    if c.measured:
        return f"(cluster {c.name}: runtime memory and fixed overheads measured {c.measured})"
    return f"(cluster {c.name}: runtime memory and fixed overheads unmeasured, left out (0): benchmarks/gpu_check)"


def train_overrides(p: Plan, best: Candidate) -> List[str]:
    """The `python -m zoo.train` overrides that reproduce the planned run: the model as given
    (family, size and every changed key) with the vocabulary planned for, the precision planned for (training defaults to
    fp32), the layout and the batch, and data.document_mask where planned for."""
    from dataclasses import fields

    from zoo.config.schema import ModelConfig

    lay, model = best.layout, p.model
    out = []
    if model is not None:
        out += [f"model={model.family}", f"model.size={model.size}"]
        defaults = ModelConfig(family=model.family)
        out += [f"model.{f.name}={getattr(model, f.name)}" for f in fields(ModelConfig)
                if f.name not in ("family", "size", "activation_checkpointing")
                and getattr(model, f.name) != getattr(defaults, f.name)]
        if model.vocab_size is None and p.vocab_size and not model.init_from:
            # the vocabulary planned for (padded as training pads it); left out, the run's own
            # tokenizer would size the model (the default corpus's: 4,096 tokens)
            from zoo.families.transformer import padded_vocab

            out.append(f"model.vocab_size={padded_vocab(p.vocab_size, model)}")
    batch = (f"parallel.num_microbatches={lay.grad_accum}" if lay.pp > 1  # the engine derives the micro-batch
             else f"trainer.micro_batch_size={lay.micro_batch_size}")
    out += [f"precision={p.dtype}", f"parallel.tp={lay.tp}", *([f"parallel.cp={lay.cp}"] if lay.cp > 1 else []),
            f"parallel.pp={lay.pp}", f"parallel.dp={lay.dp}",
            f"parallel.zero_stage={lay.zero_stage}", batch, f"trainer.global_batch_size={p.global_batch_size}",
            f"model.activation_checkpointing={str(lay.activation_checkpointing).lower()}"]
    if lay.tp > 1 and p.plan.sequence_parallel:
        out.append("parallel.sequence_parallel=true")
    if lay.cp > 1 and not p.plan.cp_recompute:
        out.append("parallel.cp_recompute=false")
    if p.plan.document_mask:
        out.append("data.document_mask=true")
    return out


def topology_summary(lay, c) -> List[str]:
    """The recommended layout's device topology in a few lines: where each kind of group sits."""
    from zoo.parallel.topology import compress_hosts

    world, per_node = lay.world_size, c.gpus_per_node
    hosts = compress_hosts(f"node{r // per_node}" for r in range(world))
    order = "dp, pp, cp, tp" if lay.cp > 1 else "dp, pp, tp"
    out = [f"  {world} ranks on {hosts} ({min(per_node, world)} per node); ranks are ordered {order} (tp fastest)"]
    if lay.tp > 1:
        inside = per_node % lay.tp == 0
        out.append(f"  tensor parallel: {world // lay.tp} groups of {lay.tp} adjacent ranks, "
                   + ("each inside one node" if inside else f"SOME CROSS NODES ({lay.tp} does not divide {per_node})"))
    if lay.cp > 1:
        inside = per_node % (lay.tp * lay.cp) == 0
        out.append(f"  context parallel: {world // lay.cp} group(s) of {lay.cp} ranks {lay.tp} apart, "
                   + ("each inside one node" if inside else f"SOME CROSS NODES (tp x cp = {lay.tp * lay.cp} does not "
                                                               f"divide {per_node})"))
    if lay.pp > 1:
        replica = lay.tp * lay.pp
        where = "across nodes" if replica > per_node else "inside one node"
        out.append(f"  pipeline: {lay.pp} stages of {lay.tp} rank(s) per replica, neighbours {lay.tp} ranks apart, "
                   f"a replica's {replica} ranks {where}")
    if lay.dp > 1:
        out.append(f"  data parallel: {lay.dp} replicas of {lay.tp * lay.cp * lay.pp} rank(s), outermost"
                   + (" (across nodes)" if world > per_node else ""))
    return out


def render_json(p: Plan) -> str:
    best = p.recommended
    c = p.cluster
    obj = {"model": {"name": p.desc.name, "num_params": p.desc.num_params, "n_layer": p.desc.n_layer},
           "cluster": {"name": c.name, "nodes": c.nodes, "gpus_per_node": c.gpus_per_node, "gpu_mem_gb": c.gpu_mem_gb,
                       "host_mem_gb": c.host_mem_gb},
           "dtype": p.dtype, "global_batch_size": p.global_batch_size, "mem_limit_bytes": int(p.usable_bytes),
           "candidates": [x.as_dict() for x in p.candidates],
           "recommended": best.as_dict() if best else None}
    if best is not None:
        from zoo.plan.memory import host_memory

        host = host_memory(p.desc, best.layout, c.gpus_per_node, p.moments)
        obj["recommended_host_bytes_per_node"] = {"checkpoint": int(host.sync), "async_save": int(host.with_async),
                                                  "per_rank_transient": int(host.per_rank_transient),
                                                  "async_staging_per_rank": int(host.async_staging)}
    return json.dumps(obj, indent=1) + "\n"

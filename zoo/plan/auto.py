"""`parallel=auto`: the layout planned at start for the ranks the launcher gives.

zoo.train calls `plan_layout` before validation (no process group exists yet): the planner
(zoo.plan.search) estimates every layout of the model for this world (its size, its ranks
per node, one device's memory: a GPU's, or on CPU the host's RAM over its ranks) and the
training config takes the recommended one: tp, pp, dp, the ZeRO stage, the micro-batch and
accumulation (the global batch stays as set, so the training mathematics does not change),
sequence parallelism and activation checkpointing. A key given on the command line is kept
and the rest planned around it. The run records the layout it ran (config.yaml, summary,
topology), and a resume with parallel=auto on another world plans again and says what
changed: the layout-free checkpoint continues on any layout.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from zoo.config.schema import Config
from zoo.plan.settings import machine_preset
from zoo.run.errors import ConfigError

# A key given on the command line -> the planner's restriction that keeps it.
KEPT = {"parallel.tp": "tp", "parallel.cp": "cp", "parallel.pp": "pp", "parallel.zero_stage": "zero_stages",
        "trainer.micro_batch_size": "micro_batch_sizes", "model.activation_checkpointing": "activation_checkpointing",
        "parallel.sequence_parallel": "sequence_parallel"}
GB = 1e9


def given_keys(overrides: Sequence[str]) -> Dict[str, str]:
    """{key: value as typed} of the command line's `key=value` overrides (`+key`, `++key` too)."""
    out = {}
    for o in overrides:
        key, eq, value = str(o).lstrip("+").partition("=")
        if eq:
            out[key] = value
    return out


def world_of(parallel, launcher_world: Optional[int], launcher_per_node: Optional[int],
             cuda_devices: int, cpu_cores: int) -> Tuple[int, int]:
    """(ranks, ranks per node): the launcher's (torchrun, srun, the deepspeed launcher), or on
    zoo's own launcher parallel.world_size, else one rank per GPU, else one per CPU core. Nodes
    the world does not divide into evenly are planned as one."""
    if launcher_world is not None:
        per_node = min(launcher_per_node or launcher_world, launcher_world)
        return launcher_world, per_node if launcher_world % per_node == 0 else launcher_world
    world = parallel.world_size or cuda_devices or max(1, cpu_cores)
    return world, world


def _cluster(cuda: bool, world: int, per_node: int, device_bytes: float, host_bytes: float, allocator: str):
    """The planner's machines for this world: this machine's preset (its engine term measured
    with the ranks' malloc), with the world's shape and memory."""
    base = machine_preset(cuda, allocator)
    return dataclasses.replace(base, name=f"{world} rank(s) here", nodes=world // per_node, gpus_per_node=per_node,
                               gpu_mem_gb=device_bytes / GB, host_mem_gb=host_bytes / GB)


def _restrictions(cfg: Config, given: Dict[str, str]) -> Dict[str, object]:
    """The planner's search narrowed to the command line's layout keys (their composed values)."""
    values = {"parallel.tp": [cfg.parallel.tp], "parallel.cp": [cfg.parallel.cp], "parallel.pp": [cfg.parallel.pp],
              "parallel.zero_stage": [cfg.parallel.zero_stage],
              "trainer.micro_batch_size": [cfg.trainer.micro_batch_size],
              "model.activation_checkpointing": [cfg.model.activation_checkpointing],
              "parallel.sequence_parallel": cfg.parallel.sequence_parallel}
    return {KEPT[k]: values[k] for k in KEPT if k in given}


def _fitting_changes(plan_cfg) -> List[str]:
    """The precision or optimizer changes with which some layout of these ranks fits (each planned
    again), each with its estimate: bf16 from fp32, SGD's one momentum buffer from AdamW's two moments."""
    from zoo.plan.search import make_plan

    tries = []
    if plan_cfg.precision.dtype == "fp32":
        tries.append(("precision=bf16", {"precision": dataclasses.replace(plan_cfg.precision, dtype="bf16")}))
    if plan_cfg.optim.name == "adamw":
        tries.append(("optim=sgd", {"optim": dataclasses.replace(plan_cfg.optim, name="sgd", momentum=0.9)}))
    out = []
    for key, change in tries:
        best = make_plan(dataclasses.replace(plan_cfg, **change)).recommended
        if best is not None:
            out.append(f"{key} (then {best.mem.total / GB:.2f} GB a rank)")
    return out


def plan_layout(cfg: Config, *, world: int, per_node: int, device_bytes: float, host_bytes: float, cuda: bool,
                given: Dict[str, str], vocab_size: int, measure: Optional[Callable] = None,
                devices_here: int = 0) -> Tuple[Config, List[str]]:
    """`cfg` with the planned layout, and what to print (a few lines). With
    plan.measure=K, `measure(plan, K, steps)` (zoo.plan.measure.measure: the layouts run on this
    machine) runs the planner's top K and the fastest measured is taken; None: plan.measure is
    refused (the ranks were not started by zoo's own launcher)."""
    from zoo.plan.report import reasons
    from zoo.plan.search import make_plan
    from zoo.plan.settings import PlanConfig, PlanRunConfig

    if "parallel.dp" in given:
        raise ConfigError(f"parallel.dp={given['parallel.dp']} with parallel=auto: the plan sets dp = ranks / (tp x pp); "
                          f"set the ranks to start with parallel.world_size (zoo's launcher) or the launcher's own, "
                          f"or drop parallel=auto")
    kept = _restrictions(cfg, given)
    if kept.get("micro_batch_sizes") == ["auto"]:
        kept.pop("micro_batch_sizes")
    from zoo.run.allocator import planned

    cluster = _cluster(cuda, world, per_node, device_bytes, host_bytes, planned(cfg.run.cpu_allocator, cuda, world))
    plan_cfg = PlanRunConfig(model=cfg.model, cluster=cluster,
                             precision=cfg.precision, trainer=cfg.trainer, optim=cfg.optim,
                             plan=dataclasses.replace(PlanConfig(), vocab_size=vocab_size, measure=cfg.plan.measure,
                                                      measure_steps=cfg.plan.measure_steps,
                                                      document_mask=cfg.data.document_mask,
                                                      cp_recompute=cfg.parallel.cp_recompute, **kept))
    named = ", ".join(f"{k}={given[k]}" for k in KEPT if k in given)
    try:
        plan = make_plan(plan_cfg)
    except ValueError as err:
        raise ConfigError(f"parallel=auto{' with ' + named if named else ''}: {err}") from None
    best = plan.recommended
    if best is None:
        smallest = min(plan.candidates, key=lambda c: c.mem.total)
        fixes = ["more ranks (parallel.world_size, or the launcher's)"]
        fixes += [] if smallest.layout.activation_checkpointing else ["model.activation_checkpointing=true"]
        fixes += ["a smaller trainer.global_batch_size"] + _fitting_changes(plan_cfg)
        need, usable = smallest.mem.total / GB, plan.usable_bytes / GB
        digits = 2 if round(need, 2) != round(usable, 2) else 3  # never "needs 5.06 GB, 5.06 GB is usable"
        raise ConfigError(f"parallel=auto: no layout of {world} rank(s){' with ' + named if named else ''} fits: the "
                          f"smallest needs {need:.{digits}f} GB a rank (tp={smallest.layout.tp} "
                          f"pp={smallest.layout.pp} dp={smallest.layout.dp} zero_stage={smallest.layout.zero_stage}), "
                          f"{usable:.{digits}f} GB is usable ({plan.plan.mem_fraction:.0%} of "
                          f"{device_bytes / GB:.2f} GB); try {', '.join(fixes)}")
    reason = reasons(plan)[0]
    if cfg.plan.measure is not None:
        best, reason = _measured_pick(plan, measure, devices_here)
    lay = best.layout
    parallel = dataclasses.replace(cfg.parallel, tp=lay.tp, cp=lay.cp, pp=lay.pp, dp=lay.dp, zero_stage=lay.zero_stage,
                                   num_microbatches=lay.grad_accum if lay.pp > 1 else None,
                                   sequence_parallel=lay.tp > 1 and plan.plan.sequence_parallel)
    finder = given.get("trainer.micro_batch_size") == "auto"  # the batch finder measures it on the ranks
    trainer = cfg.trainer if finder else dataclasses.replace(cfg.trainer, micro_batch_size=lay.micro_batch_size)
    model = dataclasses.replace(cfg.model, activation_checkpointing=lay.activation_checkpointing)
    planned = dataclasses.replace(cfg, parallel=parallel, trainer=trainer, model=model)
    nodes = world // per_node
    lines = [f"parallel=auto: tp={lay.tp} {f'cp={lay.cp} ' if lay.cp > 1 else ''}pp={lay.pp} dp={lay.dp} "
             f"zero_stage={lay.zero_stage}, micro-batch "
             f"{lay.micro_batch_size} x {lay.grad_accum} accumulated (global batch {cfg.trainer.global_batch_size}), "
             f"activation checkpointing {'on' if lay.activation_checkpointing else 'off'}, planned for {world} "
             f"rank(s) on {nodes} node(s) of {device_bytes / GB:.1f} GB each: {best.mem.total / GB:.2f} GB a rank"
             + (f"; kept {named}" if named else ""),
             f"parallel=auto: {reason}"]
    if not plan.cluster.measured:  # the GPU preset's fixed costs: not measured on a GPU yet
        from zoo.plan.report import measured_note

        lines.append(f"parallel=auto: {measured_note(plan.cluster).strip('()')}")
    return planned, lines


def _measured_pick(plan, measure: Optional[Callable], devices_here: int):
    """(the fastest of the planner's top plan.measure layouts run here, the line that says so)."""
    from zoo.plan.measure import check_measure, name

    k, steps = plan.plan.measure, plan.plan.measure_steps
    if measure is None:
        raise ConfigError(f"plan.measure={k} with parallel=auto runs the planner's top {k} layouts on this machine "
                          f"before training, so zoo's own launcher must start the ranks (under torchrun, srun or "
                          f"the deepspeed launcher every rank would run them): start with python -m zoo.train "
                          f"parallel=auto parallel.world_size=N, or measure with python -m zoo.plan ... "
                          f"plan.measure={k} and set the layout it prints")
    try:
        check_measure(plan, devices_here)
        runs = measure(plan, k, steps)
    except ValueError as err:
        raise ConfigError(f"parallel=auto: {err}") from None
    fastest, first = min(runs, key=lambda r: r.step_s), runs[0]
    said = (f"the fastest of the planner's top {len(runs)} measured here ({steps} steps each): "
            f"{fastest.step_s:.3f} s a step")
    if fastest is not first:
        return fastest.candidate, said + f" against {first.step_s:.3f} s for the planner's pick ({name(first.candidate)})"
    return fastest.candidate, said + ", the planner's own pick" + (
        f" (the next {min(r.step_s for r in runs[1:]):.3f} s)" if len(runs) > 1 else "")


def replanned_line(before: dict, planned: Config, world: int, per_node: int) -> str:
    """On a resume: what changed from the layout that wrote the run (its config.yaml's parallel
    section), or that nothing did."""
    from zoo.parallel.topology import Layout

    old = Layout(tp=before.get("tp", 1), pp=before.get("pp", 1), dp=before.get("dp") or 1,
                 zero_stage=before.get("zero_stage", 0), cp=before.get("cp", 1))
    p = planned.parallel
    new = Layout(tp=p.tp, pp=p.pp, dp=p.dp, zero_stage=p.zero_stage)
    if old.name == new.name:
        return f"parallel=auto: the same layout as the run's ({new.name}) on {world} rank(s)"
    return (f"re-planned {old.name} -> {new.name}: the job now has {world} rank(s) on {world // per_node} node(s) "
            f"(the run had {old.world_size})")

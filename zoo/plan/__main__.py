"""Plan a layout: `python -m zoo.plan [model=gpt model.size=...] [cluster=...] [key=value ...]`.

Composes `conf/plan.yaml` (the training config's model, precision and trainer sections,
a cluster preset from `conf/cluster/`, and `plan`), estimates every layout the cluster
allows and prints the recommendation with its reasons and topology, or with
plan.format=json only a JSON object. Nothing is written to disk, but the picture of the
recommended layout's topology where `plan.topology=FILE.png` asks for it.

    python -m zoo.plan model.size=small cluster=dgx-a100 trainer.global_batch_size=512
    python -m zoo.plan model.size=gpt3-175b cluster=dgx-a100 cluster.nodes=128 trainer.global_batch_size=1536
    python -m zoo.plan model.size=gpt3-175b cluster=dgx-h100 cluster.nodes=64 plan.format=json
    python -m zoo.plan model.size=gpt3-175b cluster.nodes=128 plan.tp=[8] plan.pp=[16]   # score one grid
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from zoo.config.cli import TaskStarted, run_hydra_app
from zoo.config.schema import register_configs
from zoo.plan.settings import PlanRunConfig, register_plan_configs

register_configs()
register_plan_configs()
_task_started = TaskStarted()


def run(cfg: PlanRunConfig) -> str:
    """The planner's output for a composed config (ValueError on a bad input)."""
    from zoo.plan.measure import measured_section
    from zoo.plan.report import render_json, render_text
    from zoo.plan.search import make_plan

    plan = make_plan(cfg)
    if cfg.plan.measure is not None and cfg.plan.format == "json":
        raise ValueError("plan.measure prints a table: use it with plan.format=text")
    out = render_json(plan) if cfg.plan.format == "json" else render_text(plan)
    out += measured_section(plan)  # checked before anything runs; the output is written only after it
    if cfg.plan.topology and plan.candidates:
        out += draw_recommended(plan, cfg.plan.topology, quiet=cfg.plan.format == "json")
    return out


def draw_recommended(plan, path: str, quiet: bool) -> str:
    """plan.topology: the recommended layout's picture; one line saying where (not in JSON)."""
    from pathlib import Path

    from zoo.observe.topology_picture import draw_topology

    lay, per_node = plan.candidates[0].layout, plan.cluster.gpus_per_node
    hosts = [f"node{r // per_node}" for r in range(lay.world_size)]
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        drawing = draw_topology(lay.grid, hosts, [f"cuda:{r % per_node}" for r in range(lay.world_size)], target)
    except OSError as err:
        raise ValueError(f"plan.topology={path}: cannot write it ({err.strerror or err}); give a writable path") from None
    notes = "".join(f"\n  note: {n}" for n in drawing["notes"])
    return "" if quiet else f"\nTopology picture: {target}{notes}\n"


@hydra.main(version_base=None, config_path="../../conf", config_name="plan")
def _hydra_main(dcfg: DictConfig) -> None:
    _task_started()
    cfg: PlanRunConfig = OmegaConf.to_object(dcfg)
    try:
        sys.stdout.write(run(cfg))
    except ValueError as err:
        print(f"zoo.plan: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def unplanned_family(argv) -> str | None:
    """`model=bert`: a family without a planner description, refused in one line before
    Hydra composes (BERT's and the CNN's model files set training's data group, which the
    planner's config does not have)."""
    from zoo.families.registry import FAMILIES

    for arg in argv:
        if arg.startswith("model=") and arg[6:] in FAMILIES and FAMILIES[arg[6:]].planner is None:
            planned = sorted(name for name, spec in FAMILIES.items() if spec.planner is not None)
            return (f"{arg}: the planner describes {planned} so far; zoo's {arg[6:]} sizes (BERT-large's 340M "
                    f"parameters at most) fit one GPU as data-parallel replicas: train with parallel=ddp or "
                    f"zero1..3, and trainer.micro_batch_size=auto finds the micro-batch on a GPU")
    return None


def main() -> None:
    from zoo.run.quiet import quiet_third_party

    problem = unplanned_family(sys.argv[1:])
    if problem:
        print(f"zoo.plan: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    quiet_third_party("verbose=true" in sys.argv[1:])  # DeepSpeed's accelerator line (plan.verbose's diagram)
    run_hydra_app(_hydra_main, _task_started, PlanRunConfig)


if __name__ == "__main__":
    main()

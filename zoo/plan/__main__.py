"""Plan a layout: `python -m zoo.plan [model=gpt model.size=...] [cluster=...] [key=value ...]`.

Composes `conf/plan.yaml` (the training config's model, precision and trainer sections,
a cluster preset from `conf/cluster/`, and `plan`), estimates every layout the cluster
allows and prints the recommendation with its reasons and topology, or with
plan.format=json only a JSON object. Nothing is written to disk.

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
from zoo.plan.schema import PlanRunConfig, register_plan_configs

register_configs()
register_plan_configs()
_task_started = TaskStarted()


def run(cfg: PlanRunConfig) -> str:
    """The planner's output for a composed config (ValueError on a bad input)."""
    from zoo.plan.report import render_json, render_text
    from zoo.plan.search import make_plan

    plan = make_plan(cfg)
    return render_json(plan) if cfg.plan.format == "json" else render_text(plan)


@hydra.main(version_base=None, config_path="../../conf", config_name="plan")
def _hydra_main(dcfg: DictConfig) -> None:
    _task_started()
    cfg: PlanRunConfig = OmegaConf.to_object(dcfg)
    try:
        sys.stdout.write(run(cfg))
    except ValueError as err:
        print(f"zoo.plan: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    run_hydra_app(_hydra_main, _task_started)


if __name__ == "__main__":
    main()

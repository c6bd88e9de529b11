"""The planner: which layout to train with, decided from the config before a GPU is spent.

    python -m zoo.plan model.size=gpt3-175b cluster=dgx-a100 cluster.nodes=128 trainer.global_batch_size=1536

Python API:
    describe_model(model_cfg, vocab_size) -> ModelDesc      the model as the planner sees it (zoo.plan.families)
    estimate(desc, layout, cluster, dtype=, plan=) -> Candidate       memory and step time of one PlanLayout
    enumerate_layouts(desc, cluster, global_batch_size, dtype=, plan=) -> [Candidate], ranked
    make_plan(PlanRunConfig) -> Plan;  Plan.recommended
    predict_fit(model_cfg, layout, micro_batch, dtype, device_mem_bytes) -> (fits, mem)
    fit_warning(cfg, layout, device_mem_bytes) -> str | None    the start-of-training warning
"""
from zoo.plan.families import Activations, ModelDesc, ParamCount, Piece, describe_model
from zoo.plan.fit import device_memory_bytes, fit_warning, predict_fit
from zoo.plan.layout import PlanLayout
from zoo.plan.memory import MemoryEstimate, layout_memory, model_state_bytes
from zoo.plan.schema import ClusterConfig, PlanConfig, PlanRunConfig
from zoo.plan.search import (
           Candidate,
           Plan,
           enumerate_layouts,
           estimate,
           make_plan,
           recommend,
)
from zoo.plan.step_time import StepTime, step_time

__all__ = ["Activations", "Candidate", "ClusterConfig", "MemoryEstimate", "ModelDesc", "ParamCount",
           "Piece", "Plan", "PlanConfig", "PlanLayout", "PlanRunConfig", "StepTime", "describe_model",
           "device_memory_bytes", "enumerate_layouts", "estimate", "fit_warning", "layout_memory", "make_plan",
           "model_state_bytes", "predict_fit", "recommend", "step_time"]

"""`python -m zoo.plan`: composing conf/plan.yaml, every cluster preset, the JSON shape,
the text output, and each bad input's message."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO
from zoo.plan.__main__ import run
from zoo.plan.schema import PlanRunConfig

CONF = REPO / "conf"
PRESETS = sorted(p.stem for p in (CONF / "cluster").glob("*.yaml"))
CANDIDATE_KEYS = {"tp", "pp", "dp", "zero_stage", "micro_batch_size", "grad_accum", "activation_checkpointing",
                  "mem_bytes", "fits", "step_time_s"}
MEM_KEYS = {"params", "grads", "optimizer", "activations", "total"}


def plan_cfg(*overrides: str) -> PlanRunConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_object(compose(config_name="plan", overrides=list(overrides)))


def test_presets_exist():
    assert {"cpu", "dgx-a100", "dgx-h100", "h200"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_cluster_preset_plans(preset):
    text = run(plan_cfg(f"cluster={preset}", "model.size=small", "trainer.global_batch_size=64"))
    assert "RECOMMENDED: tp=1 pp=1" in text and "Device topology of the recommended layout:" in text


def test_json_shape():
    out = json.loads(run(plan_cfg("model.size=gpt3-175b", "cluster=dgx-a100", "cluster.nodes=64",
                                  "trainer.global_batch_size=1536", "plan.format=json")))
    assert out["candidates"] and out["recommended"] in out["candidates"]
    for c in out["candidates"]:
        assert CANDIDATE_KEYS <= set(c) and MEM_KEYS <= set(c["mem_bytes"])
        mem = c["mem_bytes"]
        assert abs(mem["total"] - sum(v for k, v in mem.items() if k != "total")) <= 3  # rounding of each part
        assert isinstance(c["fits"], bool) and c["step_time_s"] > 0
    assert out["recommended"]["tp"] == 8 and out["recommended"]["fits"]


def test_text_gives_reasons_and_the_topology():
    text = run(plan_cfg("model.size=gpt3-175b", "cluster.nodes=128", "trainer.global_batch_size=1536",
                        "plan.diagram_ranks=4"))
    for phrase in ("Tensor parallelism inside a node: tp=8", "Pipeline parallelism across nodes",
                   "Data parallelism outermost", "bubble (p-1)/(m+p-1)", "Gradient accumulation",
                   "train with: parallel.tp=8", "parallel.num_microbatches=", "TP group: [0, 1, 2, 3, 4, 5, 6, 7]  hosts ['node0']",
                   "(rank lines after the first 4 left out)"):
        assert phrase in text, phrase


def test_nothing_fits_says_so():
    text = run(plan_cfg("model.size=gpt3-175b", "cluster=dgx-a100", "trainer.global_batch_size=64"))
    assert "NOTHING FITS: the smallest estimate is" in text and "add nodes (cluster.nodes)" in text
    out = json.loads(run(plan_cfg("model.size=gpt3-175b", "trainer.global_batch_size=64", "plan.format=json")))
    assert out["recommended"] is None and not any(c["fits"] for c in out["candidates"])


@pytest.mark.parametrize("override, message", [
    ("cluster.gpus_per_node=0", "cluster.gpus_per_node=0 must be positive; set the accelerators of one node, "
                                "e.g. cluster.gpus_per_node=8"),
    ("cluster.nodes=0", "cluster.nodes=0 must be positive; a cluster has at least one node"),
    ("cluster.gpu_mem_gb=-1", "cluster.gpu_mem_gb=-1.0 must be positive; set one accelerator's memory in GB"),
    ("cluster.peak_tflops=0", "cluster.peak_tflops=0.0 must be positive; set the dense bf16 peak"),
    ("cluster.fp32_tflops=0", "cluster.fp32_tflops=0.0 must be positive; set it, or null"),
    ("cluster.hbm_gbps=0", "cluster.hbm_gbps=0.0 must be positive"),
    ("cluster.intra_node_gbps=0", "cluster.intra_node_gbps=0.0 must be positive; set the NVLink bandwidth"),
    ("cluster.inter_node_gbps=-5", "cluster.inter_node_gbps=-5.0 must be positive"),
    ("cluster.mfu=1.5", r"cluster.mfu=1.5 must be in \(0, 1\]: it is a fraction of the peak"),
    ("cluster.comm_efficiency=0", r"cluster.comm_efficiency=0.0 must be in \(0, 1\]"),
    ("plan.format=xml", r"plan.format='xml' is unknown; choose one of \['text', 'json'\]"),
    ("precision.dtype=fp8", r"precision.dtype='fp8' is unknown; choose one of \['fp32', 'bf16', 'fp16'\]"),
    ("plan.mem_fraction=1.2", r"plan.mem_fraction=1.2 must be in \(0, 1\]"),
    ("trainer.global_batch_size=0", "trainer.global_batch_size=0 must be positive"),
    ("plan.vocab_size=0", "plan.vocab_size=0 must be positive"),
    ("plan.micro_batch_sizes=[]", r"plan.micro_batch_sizes=\[\] must be a non-empty list of positive sizes"),
    ("plan.tp=[0]", r"plan.tp=\[0\] must be a non-empty list of positive sizes"),
    ("plan.zero_stages=[4]", r"plan.zero_stages=\[4\] must be a non-empty subset of \[0, 1, 2, 3\]"),
    ("plan.activation_checkpointing=[]", r"plan.activation_checkpointing=\[\] tries nothing"),
    ("plan.top=0", "plan.top=0 must be positive"),
    ("plan.prefer_simpler_within=1", r"plan.prefer_simpler_within=1.0 must be in \[0, 1\)"),
    ("plan.zero_bucket_elems=0", "plan.zero_bucket_elems=0 must be positive"),
    ("model.family=cnn", r"model.family='cnn' has no planner description"),
    ("trainer.global_batch_size=7", r"trainer.global_batch_size=7 is not a multiple of micro_batch \* dp"),
])
def test_bad_inputs(override, message):
    overrides = [override] + (["plan.micro_batch_sizes=[2]"] if "global_batch_size=7" in override else [])
    with pytest.raises(ValueError, match=message):
        run(plan_cfg(*overrides))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "zoo.plan", *args], capture_output=True, text=True, timeout=120,
                          cwd=CONF.parent)


def test_cli_json_prints_only_json_and_errors_exit_2():
    ok = _cli("model.size=small", "cluster=dgx-h100", "trainer.global_batch_size=512", "plan.format=json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["recommended"]["tp"] == 1
    bad = _cli("cluster.gpus_per_node=0")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "zoo.plan: error: cluster.gpus_per_node=0 must be positive" in bad.stderr
    typo = _cli("cluster.nodez=3")
    assert typo.returncode == 2 and "Key 'nodez' not in 'ClusterConfig'" in typo.stderr

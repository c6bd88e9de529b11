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
from zoo.plan.settings import PlanRunConfig

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
                        "plan.diagram_ranks=4", "plan.verbose=true"))
    for phrase in ("Tensor parallelism inside a node: tp=8", "Pipeline parallelism across nodes",
                   "Data parallelism outermost", "bubble (p-1)/(m+p-1)", "Gradient accumulation",
                   "parallel.tp=8", "parallel.num_microbatches=", "TP group: [0, 1, 2, 3, 4, 5, 6, 7]  hosts node0",
                   "(rank lines after the first 4 left out)"):
        assert phrase in text, phrase


def test_the_recommendation_leads_and_the_text_fits_a_terminal():
    """The README's 175B example: the recommendation and its command in the first lines, the
    rank grid only with plan.verbose=true, lines at most 110 characters but the command."""
    lines = run(plan_cfg("model.size=gpt3-175b", "cluster.nodes=128", "trainer.global_batch_size=1536")).splitlines()
    assert lines[0].startswith("RECOMMENDED: tp=8 ") and lines[3].startswith("  train with: python -m zoo.train ")
    assert len(lines) <= 50 and not any("group: [" in line for line in lines)
    assert lines[4].startswith("  (add --dry-run to that command to check it where it will run")
    assert all(len(line) <= 110 for i, line in enumerate(lines) if i != 3)
    assert "  1024 ranks on node[0-127] (8 per node); ranks are ordered dp, pp, tp (tp fastest)" in lines
    assert "  tensor parallel: 128 groups of 8 adjacent ranks, each inside one node" in lines


@pytest.mark.parametrize("overrides", [
    ["model.size=gpt3-175b", "cluster.nodes=128", "trainer.global_batch_size=1536"],
    ["model.size=small", "model.n_layer=6", "cluster=dgx-h100", "trainer.global_batch_size=64"],
    ["model.size=medium", "precision=fp32", "cluster=cpu", "trainer.global_batch_size=16"],
])
def test_the_printed_command_reproduces_the_planned_layout_and_dtype(overrides):
    from zoo.config.schema import Config
    from zoo.config.validate import resolve_layout

    text = run(plan_cfg(*overrides))
    command = next(line for line in text.splitlines() if line.startswith("  train with: "))
    train_overrides = command.split("python -m zoo.train ", 1)[1].split()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg: Config = OmegaConf.to_object(compose(config_name="config", overrides=train_overrides))
    best = json.loads(run(plan_cfg(*overrides, "plan.format=json")))["recommended"]
    layout, _ = resolve_layout(cfg, best["tp"] * best["pp"] * best["dp"])
    assert (layout.tp, layout.pp, layout.dp, layout.zero_stage) == (best["tp"], best["pp"], best["dp"],
                                                                    best["zero_stage"])
    planned = plan_cfg(*overrides)
    assert cfg.precision.dtype == planned.precision.dtype
    assert cfg.model == planned.model or cfg.model.activation_checkpointing == best["activation_checkpointing"]
    assert (cfg.model.size, cfg.model.n_layer) == (planned.model.size, planned.model.n_layer)
    assert cfg.trainer.global_batch_size == planned.trainer.global_batch_size


def test_host_memory_at_a_checkpoint_is_planned_and_warned_about():
    """llama2-70b on 128 GPUs: a sharded checkpoint adds one tensor per rank (not the 98-108 GB
    per rank of a gathering save); nodes too small for it are named."""
    base = ("model=llama", "model.size=llama2-70b", "cluster.nodes=16", "trainer.global_batch_size=512")
    out = json.loads(run(plan_cfg(*base, "plan.format=json")))
    host = out["recommended_host_bytes_per_node"]
    # the largest piece, fp32: the untied head (Llama 2's published vocabulary of 32,000) and its norm
    assert host["per_rank_transient"] == 4 * (32000 * 8192 + 8192)
    assert host["checkpoint"] == 9 * host["per_rank_transient"] and host["checkpoint"] < 20e9  # 8 ranks + rank 0
    assert host["async_save"] > host["checkpoint"] + 8 * host["async_staging_per_rank"] - 1
    assert "WARNING" not in run(plan_cfg(*base))
    small = run(plan_cfg(*base, "cluster.host_mem_gb=8"))
    assert "WARNING: a checkpoint needs 9.4 GB of host memory per node, more than 80% of the node's 8 GB" in \
        " ".join(line.strip() for line in small.splitlines())


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
    ("cluster.host_mem_gb=0", "cluster.host_mem_gb=0.0 must be positive; set one node's RAM in GB"),
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
    ("optim.momentum=-1", r"optim.momentum=-1.0 must be in \[0, 1\) \(SGD's momentum; 0: none\)"),
    ("plan.micro_batch_sizes=[]", r"plan.micro_batch_sizes=\[\] must be a non-empty list of positive sizes"),
    ("plan.tp=[0]", r"plan.tp=\[0\] must be a non-empty list of positive sizes"),
    ("plan.zero_stages=[4]", r"plan.zero_stages=\[4\] must be a non-empty subset of \[0, 1, 2, 3\]"),
    ("plan.activation_checkpointing=[]", r"plan.activation_checkpointing=\[\] tries nothing"),
    ("plan.top=0", "plan.top=0 must be positive"),
    ("plan.prefer_simpler_within=1", r"plan.prefer_simpler_within=1.0 must be in \[0, 1\)"),
    ("plan.zero_bucket_elems=0", "plan.zero_bucket_elems=0 must be positive"),
    ("model.family=cnn", r"model.family='cnn' has no planner description"),
    ("trainer.global_batch_size=7", r"trainer.global_batch_size=7 admits no layout on 8 GPUs"),
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
    assert typo.returncode == 2 and "cluster.nodez is not a key of the config: did you mean cluster.nodes?" in typo.stderr


@pytest.mark.parametrize("size", ["tiny", "smollm-135m"])
def test_the_llama_description_counts_the_real_models_parameters(size):
    import torch

    from zoo.config.schema import ModelConfig
    from zoo.families.registry import family
    from zoo.families.transformer import padded_vocab
    from zoo.plan.describe import describe_model

    cfg = ModelConfig(family="llama", size=size)
    desc = describe_model(cfg, 50257)
    spec = family("llama")
    with torch.device("meta"):
        model = spec.model(spec.shape(cfg, padded_vocab(50257, cfg)))
    assert desc.num_params == sum(p.numel() for p in model.parameters())
    assert desc.tp_divides["model.n_kv_head"] == spec.shape(cfg).n_kv_head
    assert desc.head_ties_embedding == (size == "smollm-135m")


def test_a_family_without_a_planner_is_refused_in_one_line():
    for model in ("bert", "cnn"):
        proc = subprocess.run([sys.executable, "-m", "zoo.plan", f"model={model}"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"zoo.plan: error: model={model}: the planner describes ['gpt', 'llama']")
    text = run(plan_cfg("model=llama", "model.size=llama3-8b", "cluster.nodes=2", "trainer.global_batch_size=512"))
    assert text.startswith("RECOMMENDED: ") and "model=llama model.size=llama3-8b model.vocab_size=128256 precision=bf16" in text


def test_plan_document_mask_is_counted_and_trained_with():
    plain = json.loads(run(plan_cfg("model.size=small", "trainer.global_batch_size=64", "plan.format=json")))
    masked = json.loads(run(plan_cfg("model.size=small", "trainer.global_batch_size=64", "plan.format=json",
                                     "plan.document_mask=true")))
    first = {json.dumps({k: c[k] for k in ("tp", "pp", "dp", "zero_stage", "micro_batch_size", "activation_checkpointing")}):
             c["mem_bytes"]["activations"] for c in plain["candidates"]}
    for c in masked["candidates"]:
        key = json.dumps({k: c[k] for k in ("tp", "pp", "dp", "zero_stage", "micro_batch_size", "activation_checkpointing")})
        if key in first:
            assert c["mem_bytes"]["activations"] > first[key]
    text = run(plan_cfg("model.size=small", "trainer.global_batch_size=64", "plan.document_mask=true"))
    assert "data.document_mask=true" in text.split("train with:")[1].splitlines()[0]


def test_a_cpu_plan_speaks_of_cpu_ranks_not_gpus():
    """#49 item 7: the cpu preset's reasons said "one GPU's 8.0 GB" on a machine without one."""
    text = run(plan_cfg("cluster=cpu", "model.size=tiny", "trainer.global_batch_size=16"))
    assert "GPU" not in text and "NVLink" not in text, [line for line in text.splitlines() if "GPU" in line]
    assert "fits one CPU rank's 8.0 GB usable" in text and "(memory in GB per CPU rank)" in text
    assert "GB per GPU" in run(plan_cfg("cluster=h200", "model.size=small", "trainer.global_batch_size=64"))


def test_a_plan_says_whether_its_presets_fixed_costs_were_measured():
    """#51 item 5: a GPU preset's runtime memory and overheads are unmeasured until a GPU measures
    them (cluster.measured, with the date and the device); the cpu preset's were."""
    gpu = run(plan_cfg("cluster=h200", "model.size=small", "trainer.global_batch_size=64"))
    assert "(cluster h200: runtime memory and fixed overheads unmeasured, left out (0): benchmarks/gpu_check)" in gpu
    cpu = run(plan_cfg("cluster=cpu", "model.size=tiny", "trainer.global_batch_size=16"))
    assert "(cluster cpu: runtime memory and fixed overheads measured 2026-12-05, this 2-core CPU machine)" in cpu

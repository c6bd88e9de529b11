"""zoo across hosts: a Slurm cluster of two simulated nodes on this machine (.ci/slurm_setup.sh
with ZOO_SLURM_NODES=2: each node a network namespace with its own address, hostname and
slurmd) running the real slurm/train_multinode.sbatch as a CPU cluster runs it
(`--gpus-per-node=0 --cpus-per-task=1 -O`, gloo between the nodes).

ddp over 2 nodes x 2 ranks gives one node's losses; a warned job checkpoints, requeues and
resumes on both nodes with the uninterrupted run's losses; `kill -9` of a rank on the second
node ends the job; 3d over 2 x 4 (every tensor-parallel group inside one host) equals one
process; a rank stopped with `kill -STOP` on the second node ends the job within
parallel.timeout_s + 60 s and leaves no process on either node. Everything the cluster
started is stopped and its namespaces removed afterwards, also when a test fails. Skipped
where Slurm cannot be installed or namespaces cannot be made.
"""
from __future__ import annotations

import json
import re
import signal

import pytest
import torch

from tests.slurm.test_slurm import ROOT, Job, _losses, _wait_for, cluster, signal_a_rank_and_wait

MULTINODE = ROOT / "slurm" / "train_multinode.sbatch"
SECOND_NODE = ("SLURMD_NODENAME", "zoo-node2")  # a rank's environment there
CPU_NODES = ["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", "--overcommit"]
TINY_GPT = ["trainer.max_steps=12", "trainer.global_batch_size=16", "trainer.micro_batch_size=4",
            "trainer.log_every=1", "trainer.progress=false", "trainer.eval_batches=1", "trainer.sample_tokens=0",
            "optim.warmup_steps=2", "logger=none"]


@pytest.fixture(scope="module")
def nodes(zoo_cache):
    yield from cluster(zoo_cache, nodes=2)


def submit(nodes, workdir, overrides, per_node: int, env=None) -> Job:
    return nodes.submit(workdir, ["parallel.backend=gloo", *overrides], env=env, script=MULTINODE,
                        ranks=[*CPU_NODES, f"--ntasks-per-node={per_node}"])


def _completed(nodes, job: Job, timeout_s: float = 240) -> dict:
    info = nodes.wait(job, timeout_s=timeout_s)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), \
        f"job {job.id} {info['JobState']} (exit {info['ExitCode']}); its output:\n{job.log[-3000:]}"
    return info


def _groups(run_dir) -> dict:
    """topology.txt's groups: kind -> [(ranks, crosses hosts)]."""
    out = {}
    text = (run_dir / "topology.txt").read_text()
    for kind, ranks, rest in re.findall(r"^(TP|PP|DP) group: \[([\d, ]+)\](.*)$", text, re.M):
        out.setdefault(kind, []).append(([int(r) for r in ranks.split(",")], "crosses hosts" in rest))
    return out


@pytest.fixture(scope="module")
def ddp_2x2(nodes, tmp_path_factory):
    job = submit(nodes, tmp_path_factory.mktemp("ddp"), ["parallel=ddp", *TINY_GPT], per_node=2)
    info = _completed(nodes, job)
    return job, info


def test_ddp_over_two_nodes_equals_one_node(run_zoo, ddp_2x2):
    job, info = ddp_2x2
    assert info["NodeList"] == "zoo-node[1-2]" and info["NumTasks"] == "4", info
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["dp"], summary["steps"]) == (4, 4, 12), summary
    hosts = set(re.findall(r"^\s+\d+\s+\d+\s+\d+\s+\d+\s+(\S+)", (job.run_dir / "topology.txt").read_text(), re.M))
    assert hosts == {"zoo-node1", "zoo-node2"}, hosts
    assert _groups(job.run_dir)["DP"] == [([0, 1, 2, 3], True)]
    one_node = run_zoo("parallel=ddp", "parallel.dp=4", *TINY_GPT)
    assert _losses(job.run_dir) == [(m["step"], m["loss"]) for m in one_node.metrics]


def test_a_killed_rank_on_the_second_node_ends_the_job(nodes, tmp_path):
    job = submit(nodes, tmp_path, [*TINY_GPT, "trainer.max_steps=100000"], per_node=2)
    signal_a_rank_and_wait(nodes, job, SECOND_NODE, signal.SIGKILL, within_s=60, wait_s=120)


def test_a_warned_job_requeues_and_resumes_on_both_nodes(nodes, ddp_2x2, tmp_path):
    reference, _ = ddp_2x2
    job = submit(nodes, tmp_path, ["parallel=ddp", *TINY_GPT], per_node=2)
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "step 3", job)
    nodes.warn(job)
    info = _completed(nodes, job)
    assert info["Restarts"] == "1" and info["NodeList"] == "zoo-node[1-2]", info
    assert f"zoo: job {job.id} (restart 1) on zoo-node[1-2]" in job.log, job.log[-3000:]
    assert [step for step, _ in _losses(job.run_dir)] == list(range(1, 13))
    assert _losses(job.run_dir) == _losses(reference.run_dir)


def test_3d_over_two_nodes_of_four_equals_one_process(nodes, run_zoo, tmp_path):
    """tp2 x pp2 x dp2 over 2 nodes x 4 ranks: each tensor-parallel group inside one host, the
    data-parallel groups across; the losses of one process within 1e-4."""
    batch = ["model.n_layer=4", "trainer.micro_batch_size=2", "trainer.global_batch_size=24"]  # 6 per pipeline
    job = submit(nodes, tmp_path, ["parallel=3d", *TINY_GPT, *batch], per_node=4)
    _completed(nodes, job, timeout_s=400)
    groups = _groups(job.run_dir)
    assert groups["TP"] and not any(crosses for _, crosses in groups["TP"]), groups["TP"]
    assert all(crosses for _, crosses in groups["DP"]), groups["DP"]
    one = run_zoo("parallel=ddp", *TINY_GPT, *batch)
    torch.testing.assert_close(torch.tensor([loss for _, loss in _losses(job.run_dir)]), torch.tensor(one.losses()),
                               rtol=1e-4, atol=0)


def test_a_stopped_rank_on_the_second_node_ends_the_job_and_leaves_no_process(nodes, tmp_path):
    timeout_s, wait_s = 20, 10
    job = submit(nodes, tmp_path, [*TINY_GPT, "trainer.max_steps=100000", f"parallel.timeout_s={timeout_s}"],
                 per_node=2, env={"ZOO_SRUN_WAIT": str(wait_s)})
    signal_a_rank_and_wait(nodes, job, SECOND_NODE, signal.SIGSTOP, within_s=timeout_s + 60,
                           wait_s=timeout_s + wait_s + 90)
    assert "Traceback" not in job.log, job.log[-3000:]


def test_a_planned_job_requeued_onto_one_node_plans_again_and_continues(nodes, run_zoo, tmp_path):
    """#37 item 2: the sbatch scripts plan the layout (parallel=auto, no layout given) for 2 nodes
    x 2 ranks; warned, the job checkpoints and requeues; held while pending, it is moved onto
    1 node x 2 ranks (scontrol update), plans again for 2 ranks, says so, and continues the
    layout-free checkpoint with the same global batch and an uninterrupted planned run's losses."""
    job = submit(nodes, tmp_path, TINY_GPT, per_node=2)
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "step 3", job)
    nodes.warn(job)
    _wait_for(lambda: nodes.show(job)["JobState"] == "PENDING" and nodes.show(job)["Restarts"] == "1",
              "the requeue", job, timeout_s=120)
    nodes._run("scontrol", "hold", job.id)
    nodes._run("scontrol", "update", f"JobId={job.id}", "NumNodes=1", "NumTasks=2")
    nodes._run("scontrol", "release", job.id)
    info = _completed(nodes, job)
    assert info["Restarts"] == "1" and info["NumNodes"] == "1" and info["NumTasks"] == "2", info
    assert "parallel=auto" in job.log and f"zoo: job {job.id} (restart 1)" in job.log, job.log[-3000:]
    replanned = re.search(r"^zoo: re-planned (\S+) -> (\S+): the job now has 2 rank\(s\) on 1 node\(s\) "
                          r"\(the run had 4\)$", job.log, re.M)
    assert replanned, job.log[-3000:]
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["global_batch_size"], summary["steps"]) == (2, 16, 12), summary
    losses = _losses(job.run_dir)
    assert [step for step, _ in losses] == list(range(1, 13))
    reference = run_zoo("parallel=auto", "parallel.world_size=4", *TINY_GPT)
    want = dict((m["step"], m["loss"]) for m in reference.metrics if "loss" in m)
    torch.testing.assert_close(torch.tensor([loss for _, loss in losses]), torch.tensor([want[s] for s in range(1, 13)]),
                               rtol=1e-5, atol=0)


def _same_steps_trained_again(run_dir) -> None:
    """The steps trained again after an in-job restart have the losses the attempt before
    logged for them (an uninterrupted run's), within 1e-5; every step was logged."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    at = next(i for i, m in enumerate(lines) if "attempt" in m)
    before = {m["step"]: m["loss"] for m in lines[:at] if "loss" in m}
    again = {m["step"]: m["loss"] for m in lines[at + 1:] if "loss" in m}
    assert set(before) | set(again) == set(range(1, 21)) and 11 in again, (sorted(before), sorted(again))
    for step in sorted(set(before) & set(again)):
        assert abs(again[step] - before[step]) <= 1e-5 * abs(before[step]), (step, again[step], before[step])


RESTARTING = [*TINY_GPT, "trainer.max_steps=20", "checkpoint.every=5", "run.max_restarts=1"]


def test_a_killed_rank_restarts_the_ranks_in_the_same_job_with_run_max_restarts(nodes, tmp_path):
    """#54 under srun: slurm/srun_ranks.sh reads run.max_restarts; rank 2 (node 2) SIGKILLed after
    step 12: one survivor names it, srun is run again on both nodes (they still answer), the
    ranks resume step 10's checkpoint, and the job completes without a requeue."""
    from tests.slurm.test_slurm import _job_processes

    job = submit(nodes, tmp_path, RESTARTING, per_node=2)
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 12, "step 12", job,
              timeout_s=200)
    victim = [p for p in _job_processes(job) if p.environ().get("SLURM_PROCID") == "2"]
    victim[0].send_signal(signal.SIGKILL)
    info = _completed(nodes, job, timeout_s=300)
    assert info["Restarts"] == "0", info  # no requeue: inside the job
    assert "rank 2 on zoo-node2 went away (no answer to the survivors' roll call" in job.log, job.log[-3000:]
    assert "restart 1 of 1 (run.max_restarts) on zoo-node1,zoo-node2 (2 node(s) answering, 4 ranks" in job.log
    _same_steps_trained_again(job.run_dir)


def test_a_lost_node_restarts_the_job_on_the_node_left_in_the_same_allocation(nodes, tmp_path):
    """#54: node 2 is lost (its slurmd, step daemon and ranks SIGKILLed after step 12). The job
    keeps its allocation (train_multinode.sbatch: --no-kill; Slurm removes the failed node
    from it), the survivors name ranks 2 and 3 on zoo-node2, srun_ranks.sh starts the ranks
    again on zoo-node1 alone, where parallel=auto re-plans for 2 ranks and resumes step 10's
    checkpoint (written by 4): the job completes on one node, without a requeue."""
    import subprocess

    from tests.slurm.test_slurm import _setup

    job = submit(nodes, tmp_path, RESTARTING, per_node=2)
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 12, "step 12", job,
              timeout_s=200)
    try:
        subprocess.run(["bash", "-c", "ip netns pids zoo-node2 | xargs -r kill -9"], check=True, timeout=30)
        info = _completed(nodes, job, timeout_s=300)
    finally:
        _setup("up", 2)  # node 2's slurmd again (ReturnToService=2 takes the node back)
    assert (info["Restarts"], info["NodeList"]) == ("0", "zoo-node1"), info
    assert "ranks 2 on zoo-node2, 3 on zoo-node2 went away (no answer to the survivors' roll call" in job.log, \
        job.log[-3000:]
    assert "restart 1 of 1 (run.max_restarts) on zoo-node1 (1 node(s) answering, 2 ranks" in job.log
    assert "zoo: re-planned tp1-pp1-dp4_zero1 -> tp1-pp1-dp2_zero1" in job.log
    assert "now 2 rank(s), tp1-pp1-dp2_zero1; was 4 rank(s), tp1-pp1-dp4_zero1" in job.log
    assert json.loads((job.run_dir / "summary.json").read_text())["attempts"] == 2
    _same_steps_trained_again(job.run_dir)

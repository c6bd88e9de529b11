"""The same entry point under external launchers: each process is one rank, dp comes from
the world size, and all ranks agree on rank 0's run directory."""
from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FAST = ["debug=fast", "trainer.progress=false"]


def test_torchrun(run_zoo, tmp_path):
    """Two ranks under torchrun: world size, dp and ZeRO from the launcher; and with a
    timestamped hydra.run.dir each rank composes its own directory name, rank 0's wins."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "outputs"
    run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                 f"hydra.run.dir={out}/" + "${now:%H-%M-%S-%f}", "parallel=zero1", *FAST], run_dir=out)
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1 and (dirs[0] / "summary.json").exists(), dirs
    s = json.loads((dirs[0] / "summary.json").read_text())
    assert (s["world_size"], s["dp"], s["zero_stage"]) == (2, 2, 1)


def test_under_torchrun_a_config_error_is_said_once(run_zoo, tmp_path):
    """Every rank validates and refuses; rank 0 alone prints the line (#33 item 10: each of
    torchrun's ranks printed it)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    run = run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                       f"hydra.run.dir={tmp_path / 'run'}", "parallel=zero1", "trainer.global_batch_size=7", *FAST],
                  run_dir=tmp_path / "run", check=False)
    errors = [line for line in run.stderr.splitlines() if line.startswith("zoo: error:")]
    assert run.returncode != 0 and len(errors) == 1 and "trainer.global_batch_size=7" in errors[0], run.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(shutil.which("deepspeed", path=str(Path(sys.executable).parent)) is None,
                    reason="the deepspeed launcher script is not installed beside this python")
@pytest.mark.parametrize("flags", [[], ["--no_local_rank"]], ids=["as-the-readme-prints-it", "no-local-rank"])
def test_deepspeed_launcher(run_zoo, tmp_path, flags):
    """docs/layouts.md's line, `deepspeed --num_gpus 8 --module zoo.train parallel=zero2`, on 2
    ranks: the launcher's --local_rank=N argument is taken out before Hydra sees it."""
    run_dir = tmp_path / "ds"
    launcher = Path(sys.executable).with_name("deepspeed")
    run = run_zoo(cmd=[str(launcher), "--num_gpus", "2", *flags, "--module", "zoo.train", "parallel=zero2",
                       f"hydra.run.dir={run_dir}", *FAST], run_dir=run_dir)
    assert (run.summary["world_size"], run.summary["zero_stage"]) == (2, 2)


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_under_torchrun_a_killed_rank_leaves_one_line_from_its_peer_and_no_traceback(tmp_path, zoo_cache, how):
    """torchrun names the rank that died (its root-cause report); of the two ranks that lost
    their peer, one names it and its host in one line (zoo.run.roll_call: the survivors answer,
    the one that did not is named), the other stays silent; both exit 1, without a traceback.
    A rank stopped with SIGSTOP (hung): its peers' collective times out after
    parallel.timeout_s, one says which rank did not answer, and torchrun ends the stopped one:
    the job ends within parallel.timeout_s + 60 s."""
    import os
    import signal
    import subprocess
    import time

    import psutil

    from tests.e2e.test_failures import FAST as FAILURE_FAST
    from tests.e2e.test_failures import wait_for_training

    run_dir = tmp_path / "killed"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "WANDB_MODE": "disabled"}
    torchrun = Path(sys.executable).with_name("torchrun")
    timeout_s = 15
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "3", "-m", "zoo.train",
                             f"hydra.run.dir={run_dir}", "parallel=zero1", "trainer.max_steps=100000",
                             f"parallel.timeout_s={timeout_s}", *FAILURE_FAST, "trainer.global_batch_size=6"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_training(run_dir, proc)
    ranks = sorted((c for c in psutil.Process(proc.pid).children() if "zoo.train" in " ".join(c.cmdline())),
                   key=lambda c: int(c.environ().get("RANK", -1)))
    assert len(ranks) == 3
    descendants = psutil.Process(proc.pid).children(recursive=True)
    t0 = time.monotonic()
    ranks[1].send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    out, err = proc.communicate(timeout=timeout_s + 120)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert "/zoo/" not in err, err[-3000:]  # no traceback of a rank (torchrun's agent prints its own)
    peer = [line for line in err.splitlines() if line.startswith("zoo: rank ")]
    assert len(peer) == 1 and "the 2 surviving rank(s) stop (exit code 1)" in peer[0], err[-3000:]
    root = err.split("Root Cause (first observed failure):", 1)[1]  # torchrun's report of the first failure
    host = socket.gethostname()
    if how == "kill":
        assert f"rank 1 on {host} went away" in peer[0] and "rank      : 1" in root and "SIGKILL" in root, err[-3000:]
    else:  # a peer failed first: its timeout; torchrun then ended the stopped rank
        assert f"rank 1 on {host} did not answer within parallel.timeout_s" in peer[0], err[-3000:]
        assert "rank      : 1" not in root, err[-3000:]
        assert took < timeout_s + 60, took
    time.sleep(1)
    assert not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "orphans left"


def test_under_torchrun_parallel_auto_runs_one_plan_when_the_ranks_report_different_memory(run_zoo, tmp_path):
    """#54 item 2: rank 1 reports a 0.9 GB host (ZOO_TEST_RANK_HOST_GB), where the tiny GPT plans
    tp=2; rank 0 has this machine's and plans dp=2 on its own. Each rank's own plan would start
    two different layouts; rank 0 plans again for the smallest memory, every rank runs that
    plan, and plans.jsonl records it with the attempt number."""
    torchrun = Path(sys.executable).with_name("torchrun")
    run_dir = tmp_path / "run"
    run = run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                       f"hydra.run.dir={run_dir}", "parallel=auto", "trainer.max_steps=2", "logger=none", *FAST],
                  run_dir=run_dir, env={"ZOO_TEST_RANK_HOST_GB": "1:0.9"})
    assert "parallel=auto: tp=1 pp=1 dp=2" in run.stdout  # rank 0's own plan, before the ranks agree
    assert "the ranks report different memory; one plan for all 2, made on rank 0 for the smallest" in run.stdout
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["tp"], s["dp"]) == (2, 1)
    records = [json.loads(line) for line in (run_dir / "plans.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["attempt"] == 0 and not records[0]["ranks_alike"]
    assert (records[0]["tp"], records[0]["dp"], records[0]["host_of"]) == (2, 1, f"rank 1 on {socket.gethostname()}")


def _last_losses(run_dir: Path) -> dict:
    """step -> loss, the last line logged for each step (a restarted attempt logs its steps again)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "loss" in m:
            out[m["step"]] = m["loss"]
    return out


def test_under_torchrun_max_restarts_a_killed_rank_restarts_the_job_from_its_checkpoint(run_zoo, tmp_path, zoo_cache):
    """#54 item 1 under torchrun: rank 1 killed after step 12 of 16, torchrun --max-restarts=1
    starts the ranks again, which resume (resume=auto, implied by the restart) from step 10's
    checkpoint, say which steps they train again, and end the job as an uninterrupted run
    would (steps 11-16 within 1e-5). Before, the restarted ranks' gloo mesh failed (torch's
    env:// store gave a peer's address of the attempt before: zoo.worker.attempt_store)."""
    import os
    import signal
    import subprocess

    import psutil

    from tests.e2e.test_failures import wait_for_training

    torchrun = Path(sys.executable).with_name("torchrun")
    common = ["parallel=zero1", "trainer.max_steps=16", "checkpoint.every=5", "trainer.log_every=1",
              "trainer.sample_tokens=0", "logger=none", *FAST]
    run_dir = tmp_path / "restarted"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m",
                             "zoo.train", f"hydra.run.dir={run_dir}", *common], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_training(run_dir, proc, steps=12)
    ranks = [c for c in psutil.Process(proc.pid).children() if c.environ().get("RANK") == "1"]
    ranks[0].send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    assert "zoo: restart 1 of 1 (torchrun --max-restarts) on 2 rank(s): resume=auto" in out, out[-3000:]
    resumed = [line for line in out.splitlines() if line.startswith("zoo: resumed from")]
    assert len(resumed) == 1 and "step_0000010 at step 10" in resumed[0] and "are trained again" in resumed[0], out
    lost = int(resumed[0].split("; steps 11-", 1)[1].split(",")[0]) - 10  # 2, or more where the kill landed late
    said = [line for line in out.splitlines() if line.startswith("zoo: attempt 2 ")]
    assert len(said) == 1 and f"(restart 1 of 1, torchrun --max-restarts; 0 left): {lost} step(s) and" in said[0], out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["attempts"], summary["restarts"], summary["restarts_left"], summary["lost_steps"]) == (2, 1, 0, lost)
    assert 0 < summary["lost_s"] < 240
    _same_steps_trained_again(run_dir, 16, 10)


def _same_steps_trained_again(run_dir: Path, max_steps: int, resumed: int) -> None:
    """Every step was logged, and the steps trained again after the restart have the losses the
    attempt before logged for them (an uninterrupted run's): within 1e-5."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    at = next(i for i, m in enumerate(lines) if "attempt" in m)
    before = {m["step"]: m["loss"] for m in lines[:at] if "loss" in m}
    again = {m["step"]: m["loss"] for m in lines[at + 1:] if "loss" in m}
    assert set(before) | set(again) == set(range(1, max_steps + 1))
    redone = sorted(set(before) & set(again))
    assert redone and redone[0] == resumed + 1, (sorted(before), sorted(again))
    for step in redone:
        assert abs(again[step] - before[step]) <= 1e-5 * abs(before[step]), (step, again[step], before[step])


def test_under_torchrun_a_lost_node_restarts_the_job_on_the_node_left_re_planned(tmp_path, zoo_cache):
    """#54 item 1, elastic: two torchrun agents (two nodes of 2 ranks, `--nnodes=1:2`) run one job,
    parallel=auto plans tp2 x dp2 for 4 ranks; node 2 is lost (its agent and ranks SIGKILLed
    after step 12). The survivors name ranks 2 and 3; torchrun restarts the node left, which
    re-plans for its 2 ranks, resumes step 10's checkpoint (written under tp2) on the new layout,
    says what was lost and what changed, trains the lost steps again to the losses logged before
    (within 1e-5) and finishes the job."""
    import os
    import signal
    import subprocess

    import psutil

    from tests.e2e.test_failures import wait_for_training

    torchrun = Path(sys.executable).with_name("torchrun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "elastic"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "WANDB_MODE": "disabled"}

    def node():
        return subprocess.Popen([str(torchrun), "--nnodes=1:2", "--nproc-per-node=2", "--max-restarts=1",
                                 "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=zoo-test",
                                 "--rdzv-conf=last_call_timeout=3", "-m", "zoo.train", f"hydra.run.dir={run_dir}",
                                 "parallel=auto", "trainer.max_steps=16", "checkpoint.every=5", "logger=none",
                                 "trainer.sample_tokens=0", "optim.warmup_steps=2", *FAST],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = node()  # it hosts the rendezvous store (the first to bind the endpoint)
    wait_for_rendezvous_store(port, first)
    second = node()
    try:
        wait_for_training(run_dir, first, steps=12)
        lost = psutil.Process(second.pid)
        for proc in [lost, *lost.children(recursive=True)]:
            proc.send_signal(signal.SIGKILL)
        out, err = first.communicate(timeout=240)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
        second.communicate()
    assert first.returncode == 0, err[-3000:]
    host = socket.gethostname()
    named = [line for line in err.splitlines() if line.startswith("zoo: rank ")]
    namer = named[0].split(" on ", 1)[0] if named else ""  # rank 0 or 1: whichever survivor claimed the naming
    assert namer in ("zoo: rank 0", "zoo: rank 1") and named == [
        f"{namer} on {host}: ranks 2 on {host}, 3 on {host} went away (no answer to the survivors' roll call: killed, "
        f"or its host lost); the 2 surviving rank(s) stop (exit code 1); torchrun --max-restarts restarts the job "
        f"(1 of 1 left)"], err[-3000:]
    assert "zoo: re-planned tp2-pp1-dp2_zero1 -> tp1-pp1-dp2_zero1: the job now has 2 rank(s)" in out, out[-3000:]
    said = [line for line in out.splitlines() if line.startswith("zoo: attempt 2 ")]
    assert len(said) == 1 and "lost since step 10's checkpoint was saved; now 2 rank(s), tp1-pp1-dp2_zero1; was 4 " \
        "rank(s), tp2-pp1-dp2_zero1" in said[0], out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["tp"], summary["attempts"]) == (2, 1, 2)
    _same_steps_trained_again(run_dir, 16, 10)


def wait_for_rendezvous_store(port: int, proc, timeout: float = 60) -> None:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the first torchrun agent did not open its rendezvous store: {proc.poll()=}")


def test_under_torchrun_no_layout_fitting_the_smallest_rank_stops_every_rank_in_one_line(run_zoo, tmp_path):
    """Rank 1 reports a 0.2 GB host, where nothing fits: rank 0 (which fits on its own) says so
    once and every rank stops (none waits in a collective for a plan that never comes)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    run = run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                       f"hydra.run.dir={tmp_path / 'run'}", "parallel=auto", "logger=none", *FAST],
                  run_dir=tmp_path / "run", env={"ZOO_TEST_RANK_HOST_GB": "1:0.2"}, check=False, timeout=180)
    errors = [line for line in run.stderr.splitlines() if line.startswith("zoo: error:")]
    assert run.returncode != 0 and len(errors) == 1, run.stderr[-3000:]
    assert "parallel=auto: no layout of 2 rank(s) fits" in errors[0], errors

"""The slurm/ scripts on a real single-node Slurm, brought up by .ci/slurm_setup.sh.

A tiny GPT over 4 CPU ranks through slurm/debug_cpu.sbatch; the requeue protocol of
slurm/srun_ranks.sh with a stand-in trainer (warning signal -> exit 75 -> requeue ->
`resume=auto` in the same run directory); and, once zoo/checkpoint.py exists, a warned GPT
run that checkpoints, requeues itself and ends with the uninterrupted run's losses.
Skipped only where Slurm cannot be installed (no root, no apt-get).
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / ".ci" / "slurm_setup.sh"
DEBUG_CPU = ROOT / "slurm" / "debug_cpu.sbatch"
PREPARE = ROOT / "slurm" / "prepare_array.sbatch"
EXIT_REQUEUE = 75  # slurm/srun_ranks.sh: the trainer's "checkpoint written, run me again"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "PREEMPTED"}
FOUR_CPU_RANKS = ["--ntasks=4", "--cpus-per-task=1", "--overcommit"]  # 4 ranks on a 2-core machine
TINY_GPT = ["trainer.max_steps=30", "trainer.global_batch_size=16", "trainer.micro_batch_size=4",
            "trainer.log_every=1", "trainer.progress=false", "trainer.eval_batches=2", "trainer.sample_tokens=0"]
# Variables of an enclosing launcher would leak into the jobs through sbatch's --export=ALL.
LAUNCHER_VARS = re.compile(r"SLURM_.*|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|"
                           r"TORCHELASTIC_.*|ZOO_LOCAL_WORKER")


@dataclass
class Job:
    id: str
    workdir: Path

    @property
    def log(self) -> str:
        path = self.workdir / f"slurm-{self.id}.out"
        return path.read_text() if path.exists() else "(no job output)"

    @property
    def run_dir(self) -> Path:
        return self.workdir / "outputs" / f"slurm-{self.id}"


class Cluster:
    def __init__(self, env: dict):
        self.env = env

    def _run(self, *cmd: str, env: dict | None = None, cwd: Path | None = None) -> str:
        out = subprocess.run(cmd, env=env or self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}"
        return out.stdout

    def submit(self, workdir: Path, overrides: list[str], sbatch_args: list[str] = (), env: dict = None, *,
               script: Path = DEBUG_CPU, ranks: list[str] = FOUR_CPU_RANKS) -> Job:
        """sbatch from the repository root (as documented), the job running in `workdir`."""
        out = self._run("sbatch", "--parsable", f"--chdir={workdir}", f"--output={workdir}/slurm-%j.out",
                        *ranks, *sbatch_args, str(script), *overrides,
                        env={**self.env, **(env or {})}, cwd=ROOT)
        return Job(out.strip().split(";")[0], workdir)

    def show(self, job: Job) -> dict:
        """`scontrol show job` as a dict (no accounting here: finished jobs stay MinJobAge seconds)."""
        return dict(re.findall(r"(\w+)=(\S*)", self._run("scontrol", "show", "job", "--oneliner", job.id)))

    def wait(self, job: Job, timeout_s: float = 150) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.show(job)
            if info["JobState"] in ENDED:
                return info
            time.sleep(0.5)
        self._run("scancel", job.id)
        pytest.fail(f"job {job.id} still {info['JobState']} after {timeout_s} s; its output:\n{job.log[-3000:]}")

    def warn(self, job: Job) -> None:
        """What `--signal=B:USR1@120` does near the time limit: USR1 to the batch shell."""
        self._run("scancel", "--signal=USR1", "--batch", job.id)


def _setup(action: str, nodes: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SETUP), action], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "ZOO_SLURM_NODES": str(nodes)})


def cluster(zoo_cache, nodes: int = 1):
    """Bring up the cluster (unless it already runs), yield a Cluster, stop it again (also
    when a test failed) unless it was up before."""
    was_up = "slurmctld: running" in _setup("status", nodes).stdout
    up = _setup("up", nodes)
    if up.returncode == 77:
        pytest.skip((up.stderr.strip().splitlines() or ["Slurm cannot be installed here"])[-1])
    if up.returncode != 0:
        _setup("down", nodes)  # what came up (a namespace, a daemon) does not outlive the failure
        pytest.fail(f".ci/slurm_setup.sh up exited {up.returncode}:\n{up.stderr}", pytrace=False)
    conf = re.search(r"export SLURM_CONF=(\S+)", up.stdout).group(1)
    env = {k: v for k, v in os.environ.items() if not LAUNCHER_VARS.fullmatch(k)}
    try:
        yield Cluster({**env, "SLURM_CONF": conf, "ZOO_PYTHON": sys.executable, "ZOO_CACHE": str(zoo_cache)})
    finally:
        if not was_up:
            down = _setup("down", nodes)
            assert down.returncode == 0, f".ci/slurm_setup.sh down exited {down.returncode}:\n{down.stderr}"


@pytest.fixture(scope="session")
def slurm(zoo_cache) -> Cluster:
    yield from cluster(zoo_cache)


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(row["step"], row["loss"]) for row in map(json.loads, lines)]


@pytest.fixture(scope="module")
def reference_run(slurm, tmp_path_factory):
    """The tiny GPT over 4 CPU ranks, start to end: (job, scontrol info, summary)."""
    job = slurm.submit(tmp_path_factory.mktemp("reference"), TINY_GPT)
    info = slurm.wait(job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", \
        f"job {job.id} {info['JobState']} (exit {info['ExitCode']}); its output:\n{job.log[-3000:]}"
    return job, info, json.loads((job.run_dir / "summary.json").read_text())


def test_debug_cpu_trains_tiny_gpt_on_four_ranks(reference_run):
    job, info, summary = reference_run
    assert info["NumTasks"] == "4" and info["Restarts"] == "0"
    assert (summary["world_size"], summary["dp"], summary["steps"]) == (4, 4, 30), summary
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < _losses(job.run_dir)[0][1]
    assert f"zoo: job {job.id} (restart 0)" in job.log and "1 threads each" in job.log
    from zoo.run.allocator import resolve  # srun_ranks.sh gave the ranks run.cpu_allocator=auto's malloc

    assert summary["cpu_allocator"] == resolve("auto")[0]


def test_a_hydra_sweep_through_the_submitit_launcher_runs_each_layout_as_a_slurm_job(slurm, tmp_path):
    """`-m hydra/launcher=submitit_slurm`: each member a Slurm job of 2 tasks, each task a rank;
    ddp and ZeRO-1 at dp 2 reach the same losses (ZeRO-1 shards the optimizer, not the math)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [slurm] extra is not installed")
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.train", "-m", "hydra/launcher=submitit_slurm", "hydra.launcher.tasks_per_node=2",
         "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
         "+hydra.launcher.additional_parameters={overcommit:true}", f"hydra.sweep.dir={sweep}", "debug=fast",
         "logger=none", "trainer.sample_tokens=0", "trainer.progress=false", "parallel=ddp,zero1"],
        cwd=tmp_path, env={**slurm.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}, capture_output=True,
        text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summaries = [json.loads((sweep / str(job) / "summary.json").read_text()) for job in (0, 1)]
    assert [(s["world_size"], s["dp"], s["zero_stage"]) for s in summaries] == [(2, 2, 0), (2, 2, 1)]
    (steps0, loss0), (steps1, loss1) = (zip(*_losses(sweep / str(job))) for job in (0, 1))
    assert steps0 == steps1 == (1, 2, 3) and loss0 == pytest.approx(loss1, rel=1e-5)
    assert "Traceback" not in proc.stderr


# A stand-in for `python -m zoo.train` (ZOO_PYTHON=this file): records how srun started it,
# then behaves like the trainer: on USR1 exit 75 ("checkpoint written"); else STUB_EXIT.
STUB = '''#!{python}
import json, os, signal, sys, time

if sys.argv[1:3] == ["-m", "zoo.run.allocator"]:  # srun_ranks.sh asks for the ranks' malloc: none here
    sys.exit(0)
args = sys.argv[3:]  # after -m zoo.train
run_dir = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")][-1]
os.makedirs(run_dir, exist_ok=True)
warnings = []
signal.signal(signal.SIGUSR1, lambda *_: warnings.append(time.time()))
rank, restart = os.environ["SLURM_PROCID"], os.environ.get("SLURM_RESTART_COUNT", "0")
record = dict(args=args, threads=os.environ["OMP_NUM_THREADS"], master_addr=os.environ["MASTER_ADDR"])

def write(name, data):
    path = os.path.join(run_dir, name)
    with open(path + ".tmp", "w") as fh:
        json.dump(data, fh)
    os.replace(path + ".tmp", path)

write(f"rank{{rank}}-restart{{restart}}.json", record)
if os.environ.get("STUB_WAIT_FOR_WARNING") != "1" or "resume=auto" in args:
    sys.exit(int(os.environ.get("STUB_EXIT", "0")))
deadline = time.time() + 60
while not warnings and time.time() < deadline:
    time.sleep(0.05)
time.sleep(0.5)  # a second signal would be counted too
write(f"rank{{rank}}-warned.json", dict(warnings=len(warnings)))
sys.exit({requeue} if warnings else 1)
'''


@pytest.fixture
def stub_trainer(tmp_path) -> dict:
    path = tmp_path / "stub_trainer"
    path.write_text(STUB.format(python=sys.executable, requeue=EXIT_REQUEUE))
    path.chmod(0o755)
    return {"ZOO_PYTHON": str(path)}


def _wait_for(predicate, what: str, job: Job, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"job {job.id}: no {what} after {timeout_s} s:\n{job.log[-3000:]}"
        time.sleep(0.2)


def test_warned_job_requeues_itself_and_resumes_in_its_run_dir(slurm, tmp_path, stub_trainer):
    job = slurm.submit(tmp_path, ["model=gpt", "trainer.max_steps=7"],
                       env={**stub_trainer, "STUB_WAIT_FOR_WARNING": "1"})
    _wait_for(lambda: len(list(job.run_dir.glob("rank?-restart0.json"))) == 4, "4 started ranks", job)
    slurm.warn(job)
    info = slurm.wait(job, timeout_s=90)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), job.log
    for rank in range(4):  # the batch shell passed the signal on to every rank, once
        assert json.loads((job.run_dir / f"rank{rank}-warned.json").read_text()) == {"warnings": 1}
    first = json.loads((job.run_dir / "rank0-restart0.json").read_text())
    again = json.loads((job.run_dir / "rank3-restart1.json").read_text())
    run_dir = f"hydra.run.dir=outputs/slurm-{job.id}"
    assert first["args"] == ["parallel.backend=gloo", "model=gpt", "trainer.max_steps=7", "parallel=auto", run_dir]
    assert again["args"] == first["args"] + ["resume=auto"]
    assert first["threads"] == "1" and first["master_addr"] == info["BatchHost"]
    assert f"zoo: requeueing job {job.id} (srun exit {EXIT_REQUEUE})" in job.log


def test_failed_job_is_not_requeued_and_a_given_run_dir_is_kept(slurm, tmp_path, stub_trainer):
    job = slurm.submit(tmp_path, ["hydra.run.dir=mine", "resume=auto"], env={**stub_trainer, "STUB_EXIT": "3"})
    info = slurm.wait(job, timeout_s=60)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("FAILED", "3:0", "0"), job.log
    record = json.loads((tmp_path / "mine" / "rank0-restart0.json").read_text())
    assert record["args"] == ["parallel.backend=gloo", "hydra.run.dir=mine", "resume=auto", "parallel=auto"]
    assert "requeueing" not in job.log


def test_warned_gpt_run_checkpoints_requeues_and_matches_uninterrupted_run(slurm, tmp_path, reference_run):
    reference, _, reference_summary = reference_run
    job = slurm.submit(tmp_path, TINY_GPT)
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "step 3", job)
    slurm.warn(job)
    info = slurm.wait(job)
    assert (info["JobState"], info["ExitCode"], info["Restarts"]) == ("COMPLETED", "0:0", "1"), job.log[-3000:]
    assert f"zoo: requeueing job {job.id} (srun exit {EXIT_REQUEUE})" in job.log, job.log[-3000:]
    steps = [step for step, _ in _losses(job.run_dir)]
    # Resumed, not restarted: each step ran once, and the warning came before the end.
    assert steps == list(range(1, 31)), f"logged steps {steps}"
    assert "resume=auto" in job.log and f"zoo: job {job.id} (restart 1)" in job.log
    assert _losses(job.run_dir) == _losses(reference.run_dir)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["final_loss"] == reference_summary["final_loss"]


def _job_processes(job: Job) -> list:
    """The job's zoo.train processes, on every node (a simulated node's share this machine's pids)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.environ().get("SLURM_JOB_ID") == job.id and "zoo.train" in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def signal_a_rank_and_wait(cluster: Cluster, job: Job, which: tuple, sig, *, within_s: float, wait_s: float) -> dict:
    """Once the job logged step 2, send `sig` to its rank whose environment has which = (key,
    value); the job must then fail within `within_s` and leave no process on any node."""
    metrics = job.run_dir / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, "step 2", job)
    victim = [p for p in _job_processes(job) if p.environ().get(which[0]) == which[1]]
    assert victim, f"no rank of the job with {which[0]}={which[1]}"
    victim[0].send_signal(sig)
    t0 = time.monotonic()
    info = cluster.wait(job, timeout_s=wait_s)
    took = time.monotonic() - t0
    assert info["JobState"] in ("FAILED", "CANCELLED"), (info["JobState"], job.log[-3000:])
    assert took < within_s, took
    time.sleep(2)
    assert not _job_processes(job), "processes of the job are left"
    return info


def test_a_stopped_rank_ends_the_job_within_the_timeout_and_the_wait(slurm, tmp_path):
    """kill -STOP of one rank: the others time out (parallel.timeout_s) and say so in one line
    each; srun ends the stopped one ZOO_SRUN_WAIT seconds after the first exit (Slurm's
    KillWait later with SIGKILL); the job fails and leaves no process."""
    import signal

    timeout_s, wait_s = 20, 10
    job = slurm.submit(tmp_path, [*TINY_GPT[1:], "trainer.max_steps=100000", f"parallel.timeout_s={timeout_s}"],
                       env={"ZOO_SRUN_WAIT": str(wait_s)})
    signal_a_rank_and_wait(slurm, job, ("SLURM_PROCID", "3"), signal.SIGSTOP, within_s=timeout_s + 60,
                           wait_s=timeout_s + wait_s + 90)
    lost = [line for line in job.log.splitlines() if "a peer rank did not answer within parallel.timeout_s" in line]
    assert lost and "/zoo/" not in job.log, job.log[-3000:]


def test_an_array_prepares_the_parts_and_a_dependent_job_merges_them(slurm, tmp_path):
    """slurm/prepare_array.sbatch (#38 item 2): array tasks 0-2 prepare a part of the files each,
    a job depending on the array merges them; the merged directory holds one preparation's tokens."""
    import numpy as np

    from data_pipelines.prepare import TokenShards, prepare
    from data_pipelines.tokenizer import train_gpt_tokenizer

    src = tmp_path / "corpus"
    src.mkdir()
    texts = [f"document {i}: for x in range({i}): print(x) " * (3 + i % 5) for i in range(120)]
    for part in range(4):
        (src / f"part{part}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[part::4]))
    tok = str(train_gpt_tokenizer(texts, 400, source_key="slurm-prepare", cache_dir=str(tmp_path / "cache")))
    args = ["--path", str(src), "--tokenizer", tok, "--out", "data", "--batch-docs", "8"]
    array = slurm.submit(tmp_path, args, ["--array=0-2", "--cpus-per-task=1"], script=PREPARE, ranks=["--ntasks=1"])
    merged = slurm.submit(tmp_path, ["--out", "data"], [f"--dependency=afterok:{array.id}", "--cpus-per-task=1"],
                          script=PREPARE, ranks=["--ntasks=1"])
    info = slurm.wait(merged, timeout_s=180)
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), merged.log
    data = tmp_path / "data"
    assert sorted(p.name for p in data.glob("part-*")) == ["part-00000", "part-00001", "part-00002"]
    one = prepare("files", str(src), tok, tmp_path / "one", workers=1, batch_docs=8)
    together = TokenShards(data)
    assert json.loads((data / "meta.json").read_text())["documents"] == one["documents"] == 120
    assert np.array_equal(together.read(0, len(together)), TokenShards(tmp_path / "one").read(0, one["tokens"]))

"""The GPU check: zoo's first numbers on a CUDA device, from one call of at most 7 minutes.

    python benchmarks/gpu_check.py                    # on a CUDA machine (OUT=... or --out DIR)
    python benchmarks/gpu_check.py --cpu --deadline 150 --out DIR     # the same sub-runs, tiny, here

Everything lands in the output folder as it happens, so a call killed at any moment still
returns what ran: `progress.txt` (a line per event: each sub-run's exit code, seconds, zoo's
`run:` line, the log's tail on failure), each sub-run's folder (its log written there while it
runs; `summary.json`, `metrics.jsonl`, `config.yaml` and the profile's summary copied in when it
ends), and `results.md`, rebuilt after every sub-run (each row on its own: a row that cannot be
read says so and the others stay).

A deadline governs the whole check (`--deadline`, 420 s): each sub-run gets
min(its own limit, the time left minus a margin) and is skipped, with a line, when under 30 s
would remain. A sub-run that outlives its limit gets SIGTERM and, 10 s later, SIGKILL, to its
whole process group (zoo acts on SIGTERM only after a finished step; its ranks are in the
group). The preflight comes first: `nvidia-smi` and `pip list` into the folder, then the
imports with their versions, then the first sub-run (3 tiny steps): if the imports or that run
fail, the check stops there, saying why.

The sub-runs, most important first: a tiny GPT in bf16; GPT-2 small in bf16 (tokens/s, MFU,
peak memory against the planner's estimate); in fp16 (loss scale, skipped steps); a checkpoint
with an asynchronous save, then `resume=auto`; compiled with a profile window; the batch finder
(`micro_batch_size=auto`, CUDA only); SmolLM-135M with two data workers; a rank whose
LOCAL_RANK is past the visible devices; GPT-2 medium and benchmarks/gpt_vs_hf.py (zoo compiled
against GPT2LMHeadModel and the nanoGPT loop) if time is left. `--cpu` runs the same
sub-runs at the tiny size on this machine's CPU (gloo), in fp32 where the GPU's are bf16 (a bf16
matmul is ~50x slower than fp32's on this CPU; fp16 stays, through zoo.engine.half), the
CUDA-only ones skipped with a line.

ZOO_GPU_CHECK_STANDIN="NAME=hang,NAME=fail" replaces those sub-runs with a process that ignores
SIGTERM and sleeps, or one that exits 7: the test of the deadline (tests/e2e/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
MARGIN_S = 15  # kept back from every limit: the kill's 10 s grace and the copying
MIN_RUN_S = 30  # a sub-run that would get less is skipped
GRACE_S = 10  # SIGTERM, then SIGKILL this much later


@dataclass
class SubRun:
    name: str
    limit_s: int
    args: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    cuda_only: bool = False
    run_dir: Optional[str] = None  # another sub-run's directory (a resume)
    script: Optional[List[str]] = None  # a benchmark script and its arguments instead of zoo.train
    what: str = ""  # what the row reports beyond the common columns


@dataclass
class Outcome:
    name: str
    status: str  # ok, exit N, killed at its limit, skipped: why, stand-in
    seconds: float = 0.0
    run_line: str = ""
    run_dir: Optional[Path] = None


def subruns(cpu: bool) -> List[SubRun]:
    """The sub-runs, most important first; at the tiny size with `cpu`."""
    if cpu:
        gpt = ["model=gpt", "model.size=tiny", "trainer.global_batch_size=8", "trainer.micro_batch_size=4",
               "trainer.log_every=2", "trainer.eval_batches=1"]
        small, medium, steps = gpt, gpt, 6
        llama = ["model=llama", "model.size=tiny", "trainer.global_batch_size=8", "trainer.micro_batch_size=4"]
    else:
        gpt = ["model=gpt", "model.vocab_size=50304", "trainer.global_batch_size=64", "trainer.log_every=10",
               "trainer.eval_batches=4"]
        small = [*gpt, "model.size=small", "trainer.micro_batch_size=16"]
        medium = [*gpt, "model.size=medium", "trainer.micro_batch_size=8"]
        steps = 30
        llama = ["model=llama", "model.size=smollm-135m", "model.vocab_size=50304", "model.block_size=1024",
                 "trainer.global_batch_size=64", "trainer.micro_batch_size=16", "trainer.log_every=10"]
    tiny = ["model=gpt", "model.size=tiny", "trainer.max_steps=3", "trainer.log_every=1"]
    quick = 60 if cpu else 90
    runs = [
        SubRun("tiny-gpt-bf16", quick, [*tiny, "precision=bf16"], what="the preflight run"),
        SubRun("gpt2-small-bf16", 150, [*small, "precision=bf16", f"trainer.max_steps={steps}"]),
        SubRun("gpt2-small-fp16", 120, [*small, "precision=fp16", f"trainer.max_steps={steps}"],
               what="loss scale, skipped steps"),
        SubRun("ckpt-save", 120, [*small, "precision=bf16", f"trainer.max_steps={steps // 2}",
                                  f"checkpoint.every={steps // 2}", "checkpoint.async_save=true"]),
        SubRun("ckpt-resume", 120, [*small, "precision=bf16", f"trainer.max_steps={steps}", "resume=auto",
                                    f"checkpoint.every={steps // 2}"], run_dir="ckpt-save", what="resumed step"),
        SubRun("gpt2-small-compile", 200, [*small, "precision=bf16", f"trainer.max_steps={steps}", "model.compile=true",
                                           f"trainer.profile.start={steps - 3}"]
               + ([] if cpu else ["trainer.profile.memory=true"]), what="compile seconds"),
        SubRun("batch-finder", 150, [*small, "precision=bf16", "trainer.max_steps=10", "trainer.micro_batch_size=auto",
                                     "trainer.global_batch_size=256"], cuda_only=True, what="micro-batch chosen"),
        # document masking on a grouped-query model: the masked call repeats the kv heads on CUDA
        # (zoo.models.llama.attend) so that the memory-efficient kernel, not the math one, runs
        SubRun("llama-workers", 120, [*llama, "precision=bf16", f"trainer.max_steps={steps}", "data.num_workers=2",
                                      "data.document_mask=true"]),
        SubRun("local-rank-past-devices", quick, [*tiny, "precision=bf16"], env={"LOCAL_RANK": "LOCAL_RANK_PAST"},
               what="LOCAL_RANK past the visible devices"),
        SubRun("gpt2-medium-bf16", 150, [*medium, "precision=bf16", f"trainer.max_steps={steps}"]),
        SubRun("gpt-vs-hf", 150, [], cuda_only=True, what="zoo compiled against GPT2LMHeadModel and the nanoGPT loop",
               script=["benchmarks/gpt_vs_hf.py", "--device", "cuda", "--dtype", "bf16", "--compile", "--layers", "6",
                       "--embd", "384", "--heads", "6", "--steps", "40", "--rounds", "4"]),
    ]
    if cpu:
        for s in runs:
            s.args = ["precision=fp32" if a == "precision=bf16" else a for a in s.args]
    return runs


class Check:
    def __init__(self, out: Path, deadline_s: float, cpu: bool, standins: Dict[str, str]):
        self.out, self.cpu, self.standins = out, cpu, standins
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.deadline_s = deadline_s
        self.work = Path(tempfile.mkdtemp(prefix="zoo-gpu-check-"))  # checkpoints stay out of the output
        self.outcomes: List[Outcome] = []
        self.header: List[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def note(self, line: str) -> None:
        """One line in progress.txt (and on stdout), at once."""
        stamped = f"[{time.monotonic() - self.t0:6.1f} s] {line}"
        print(stamped, flush=True)
        with open(self.out / "progress.txt", "a") as f:
            f.write(stamped + "\n")

    def env(self, extra: Dict[str, str]) -> Dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        env.setdefault("ZOO_CACHE", str(REPO / ".zoo_cache"))
        for key, value in extra.items():
            if value == "LOCAL_RANK_PAST":  # one past the visible devices (1 on CPU): a single-rank job
                value = str(_device_count() or 1)
                env.update(RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(_free_port()))
            env[key] = value
        return env

    def run(self, cmd: List[str], log: Path, limit: float, env: Dict[str, str]) -> str:
        """Run `cmd` in its own process group, its output into `log`; its status."""
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=GRACE_S)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                _signal_group(proc.pid, signal.SIGKILL)  # ranks or workers left behind
                return f"killed at its {limit:.0f} s limit"
            _signal_group(proc.pid, signal.SIGKILL)
            return "ok" if rc == 0 else f"exit {rc}"

    def sub_run(self, s: SubRun) -> Outcome:
        left = self.left() - MARGIN_S
        if s.cuda_only and self.cpu:
            return Outcome(s.name, "skipped: CUDA only")
        if left < MIN_RUN_S:
            return Outcome(s.name, f"skipped: {max(0.0, self.left()):.0f} s of the deadline left")
        limit = min(s.limit_s, left)
        folder = self.out / s.name
        folder.mkdir(parents=True, exist_ok=True)
        run_dir = self.work / (s.run_dir or s.name)
        standin = self.standins.get(s.name)
        if standin == "hang":
            cmd = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                         "print('stand-in: hanging, SIGTERM ignored', flush=True)\ntime.sleep(10**6)"]
        elif standin == "fail":
            cmd = [sys.executable, "-c", "import sys\nprint('stand-in: failing')\nsys.exit(7)"]
        elif s.script:
            cmd = [sys.executable, *s.script]
        else:
            cmd = [sys.executable, "-m", "zoo.train", *s.args, f"hydra.run.dir={run_dir}", "logger=none",
                   "trainer.progress=false", "trainer.sample_tokens=0", "checkpoint.save_final=false",
                   f"parallel.timeout_s={max(30, min(120, int(limit)))}"]
        self.note(f"{s.name}: started, limit {limit:.0f} s" + (f" (stand-in: {standin})" if standin else ""))
        t0 = time.monotonic()
        status = self.run(cmd, folder / "log.txt", limit, self.env(s.env))
        outcome = Outcome(s.name, status, time.monotonic() - t0, run_dir=run_dir)
        text = (folder / "log.txt").read_text(errors="replace")
        outcome.run_line = next((line for line in reversed(text.splitlines()) if line.startswith("zoo: run:")), "")
        started = time.time() - outcome.seconds - 1
        for name, saved in (("summary.json", "summary.json"), ("metrics.jsonl", "metrics.jsonl"),
                            ("config.yaml", "config.yaml"), ("profile/summary.json", "profile-summary.json")):
            src = run_dir / name  # this sub-run's own (a resume's directory holds the last one's too)
            if src.is_file() and src.stat().st_mtime >= started:
                shutil.copy(src, folder / saved)
        return outcome

    def record(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        line = f"{outcome.name}: {outcome.status}"
        if outcome.seconds:
            line += f" after {outcome.seconds:.0f} s"
        if outcome.run_line:
            line += f"; {outcome.run_line}"
        self.note(line)
        if outcome.status not in ("ok",) and not outcome.status.startswith("skipped"):
            log = self.out / outcome.name / "log.txt"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.is_file() else []
            for t in tail:
                self.note(f"    | {t}")
        self.write_results()

    def write_results(self) -> None:
        """results.md from what has run so far; each row on its own."""
        rows = ["| sub-run | status | s | tokens/s | MFU | peak GiB | planned GiB | planned/peak | final loss | notes |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for o in self.outcomes:
            try:
                rows.append(_row(o, self.out / o.name))
            except Exception as err:  # noqa: BLE001 - one unreadable row must not lose the others
                rows.append(f"| {o.name} | {o.status} | {o.seconds:.0f} | row failed: {type(err).__name__}: "
                            f"{str(err)[:120]} | | | | | | |")
        text = "\n".join([*self.header, f"- elapsed {time.monotonic() - self.t0:.0f} s of the {self.deadline_s:.0f} s "
                                        f"deadline", "", *rows]) + "\n"
        tmp = self.out / "results.md.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.out / "results.md")


def _row(o: Outcome, folder: Path) -> str:
    cells = ["", "", "", "", "", ""]
    notes = []
    summary_path = folder / "summary.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        cells[0] = f"{s['tokens_per_s']:,.0f}" if s.get("tokens_per_s") else ""
        cells[1] = f"{s['mfu']:.1%}" if s.get("mfu") is not None else ""
        peak = s.get("peak_mem_bytes")
        cells[2] = f"{peak / 2**30:.2f}" if peak else ""
        planned = _planned_bytes(folder, s)
        if planned:
            cells[3] = f"{planned / 2**30:.2f}"
            cells[4] = f"{planned / peak:.2f}" if peak else ""
        cells[5] = f"{s['final_loss']:.3f}" if s.get("final_loss") is not None else ""
        metrics = folder / "metrics.jsonl"
        last = json.loads(metrics.read_text().splitlines()[-1]) if metrics.is_file() and metrics.stat().st_size else {}
        for key, label, where in (("loss_scale", "loss scale", last), ("skipped_steps", "skipped steps", last),
                                  ("compile_s", "compile s", s)):
            if where.get(key) is not None:
                notes.append(f"{label} {where[key]:g}")
        if s.get("steps_run") is not None and s["steps_run"] != s.get("steps"):
            notes.append(f"resumed: {s['steps_run']} of {s['steps']} steps run here")
        if o.name == "batch-finder":
            notes.append(f"micro-batch {s.get('micro_batch_size')}")
    if o.status == "ok" and not o.run_line:
        notes.append("no `zoo: run:` line")
    return (f"| {o.name} | {o.status} | {o.seconds:.0f} | " + " | ".join(cells) + f" | {'; '.join(notes)} |")


def _planned_bytes(folder: Path, summary: dict) -> Optional[float]:
    """The planner's estimate of one rank for the run's own config and layout (zoo.plan.fit)."""
    config = folder / "config.yaml"
    if not config.is_file():
        return None
    from omegaconf import OmegaConf

    from zoo.config.schema import Config
    from zoo.parallel.topology import Layout
    from zoo.plan.dry_run import planned_vocab
    from zoo.plan.fit import device_memory_bytes, run_memory

    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(config)))
    if cfg.trainer.micro_batch_size == "auto":
        cfg.trainer.micro_batch_size = summary["micro_batch_size"]
    layout = Layout(tp=summary["tp"], pp=summary["pp"], dp=summary["dp"], zero_stage=summary["zero_stage"])
    return run_memory(cfg, layout, device_memory_bytes(layout.world_size), vocab_size=planned_vocab(cfg.data))[1]["total"]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - the preflight reports a broken torch
        return 0


def _standins(text: str, names: List[str]) -> Dict[str, str]:
    """ZOO_GPU_CHECK_STANDIN's sub-runs and what stands in for each; ValueError naming a wrong part."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, kind = part.partition("=")
        if kind not in ("hang", "fail") or name not in names:
            raise ValueError(f"ZOO_GPU_CHECK_STANDIN={text!r}: {part!r} must be NAME=hang or NAME=fail, NAME one of "
                             f"{names}")
        out[name] = kind
    return out


def preflight(check: Check) -> bool:
    """nvidia-smi and pip list into the folder; the imports and their versions. False: stop."""
    for name, cmd in (("nvidia-smi.txt", ["nvidia-smi"]), ("pip-list.txt", [sys.executable, "-m", "pip", "list"])):
        if check.cpu and name == "nvidia-smi.txt":
            continue
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            (check.out / name).write_text(done.stdout + done.stderr)
        except (OSError, subprocess.TimeoutExpired) as err:
            check.note(f"preflight: {' '.join(cmd)} failed: {err}")
    probe = ("import json, platform, torch, deepspeed, hydra, zoo.train\n"
             "cuda = torch.cuda.is_available()\n"
             "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, "
             "'deepspeed': deepspeed.__version__, 'hydra': hydra.__version__, 'cuda': torch.version.cuda, "
             "'device': torch.cuda.get_device_name(0) if cuda else 'cpu', "
             "'memory_gib': round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if cuda else None}))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=90, cwd=REPO,
                              env=check.env({}))
    except subprocess.TimeoutExpired:
        check.note("preflight: importing torch, deepspeed, hydra and zoo took over 90 s; stopping")
        return False
    if done.returncode != 0:
        check.note("preflight: the imports failed; stopping. Their last lines:")
        for line in (done.stdout + done.stderr).splitlines()[-10:]:
            check.note(f"    | {line}")
        return False
    versions = json.loads(done.stdout.strip().splitlines()[-1])
    if not check.cpu and versions["device"] == "cpu":
        check.note("preflight: no CUDA device visible; stopping (--cpu runs the tiny check on a CPU)")
        return False
    check.header = ["# zoo GPU check" + (" (CPU mode: tiny sizes)" if check.cpu else ""), "",
                    "- " + ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None)]
    check.note("preflight: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None))
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deadline", type=float, default=420.0, help="seconds for the whole check (default 420)")
    parser.add_argument("--cpu", action="store_true", help="the same sub-runs at the tiny size on this CPU")
    parser.add_argument("--out", type=Path, default=None, help="the output folder (default: $OUT)")
    parser.add_argument("--only", default="", help="comma-separated sub-run names (default: all)")
    args = parser.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out is None:
        parser.error("give --out DIR (or set OUT, as the device tool does)")
    if not args.deadline >= MARGIN_S + MIN_RUN_S:
        parser.error(f"--deadline {args.deadline:g}: under {MARGIN_S + MIN_RUN_S} s no sub-run could start; "
                     f"the device check takes 420")
    runs = subruns(args.cpu)
    try:
        standins = _standins(os.environ.get("ZOO_GPU_CHECK_STANDIN", ""), [s.name for s in runs])
    except ValueError as err:
        parser.error(str(err))
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in runs}
        if unknown:
            parser.error(f"--only {args.only}: no sub-run {sorted(unknown)}; they are {[s.name for s in runs]}")
        runs = [s for s in runs if s.name in wanted]
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.deadline, args.cpu, standins)
    check.note(f"gpu_check: {len(runs)} sub-runs, deadline {args.deadline:.0f} s, output {out}")
    try:
        if not preflight(check):
            check.write_results()
            return 4
        check.write_results()
        for i, s in enumerate(runs):
            outcome = check.sub_run(s)
            check.record(outcome)
            if i == 0 and s.name == "tiny-gpt-bf16" and outcome.status != "ok":
                check.note("the preflight run failed; stopping (its log's tail is above)")
                return 4
        failed = [o.name for o in check.outcomes if o.status != "ok" and not o.status.startswith("skipped")]
        check.note(f"gpu_check: done in {time.monotonic() - check.t0:.0f} s; "
                   + (f"not ok: {', '.join(failed)}" if failed else "every sub-run that ran was ok"))
        return 1 if failed else 0
    finally:
        shutil.rmtree(check.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Checkpoints: exact resume (also after kill -9), resume on another layout, atomic writes,
and refusing a checkpoint of another model."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import REPO
from tests.e2e.checkpoint_runs import FAST, STEPS, after, losses_by_step
from tests.unit.checkpoint.test_checkpoint import ExecutesCode
from zoo.checkpoint.verify import write_checksums


@pytest.fixture(scope="module")
def written(run_zoo, tmp_path_factory):
    """A run stopped after step 3 with a checkpoint there; tests resume from copies of it."""
    run_dir = tmp_path_factory.mktemp("written") / "run"
    return run_zoo(*FAST, "trainer.max_steps=3", "checkpoint.every=3", "checkpoint.native=true", run_dir=run_dir)


def copy_run(written, tmp_path):
    return shutil.copytree(written.run_dir, tmp_path / "run")


def test_exact_resume_is_bitwise(run_zoo, tmp_path, checkpoint_reference, written):
    """Both ways of reading a checkpoint on the layout that wrote it: DeepSpeed's per-rank
    files (the default) and the layout-free files (checkpoint.native=false)."""
    assert losses_by_step(written) == {s: checkpoint_reference[s] for s in (1, 2, 3)}
    # DeepSpeed's files are in the checkpoint's checksums, hashed at save by the rank that owns each
    from zoo.checkpoint.verify import damage

    step3 = written.run_dir / "checkpoints" / "step_0000003"
    listed = json.loads((step3 / "checksums.json").read_text())
    assert any(name.startswith("native/") for name in listed) and damage(step3) is None
    run_dir = copy_run(written, tmp_path)
    resumed = run_zoo(*FAST, "trainer.max_steps=6", "checkpoint.every=3", "checkpoint.native=true", "resume=auto",
                      run_dir=run_dir)
    assert "at step 3" in resumed.stdout and "read from its native files" in resumed.stdout
    want = {s: checkpoint_reference[s] for s in (4, 5, 6)}
    assert after(losses_by_step(resumed), 3) == want  # identical floats
    portable = run_zoo(*FAST, "trainer.max_steps=6", "checkpoint.native=false", f"resume={step3}")
    assert "read from its layout-free files" in portable.stdout
    assert losses_by_step(portable) == want
    # the start's phases: the checkpoint's read is its own, after the model's build
    phases = portable.summary["startup"]
    assert list(phases)[-4:] == ["model", "resume", "first_step", "total"] and phases["resume"] > 0, phases
    assert "checkpoint read" in portable.stdout


def test_native_files_load_without_running_pickled_code(run_zoo, tmp_path, written):
    run_dir = copy_run(written, tmp_path)
    marker = tmp_path / "code-ran"
    for f in (run_dir / "checkpoints" / "step_0000003" / "native").glob("*model_states.pt"):
        torch.save({"module": ExecutesCode(marker)}, f)
    write_checksums(run_dir / "checkpoints" / "step_0000003")  # as a hostile checkpoint would come
    bad = run_zoo(*FAST, "trainer.max_steps=4", "checkpoint.native=true", "resume=auto", run_dir=run_dir, check=False)
    assert bad.returncode == 2 and "refused to load" in bad.stderr and "checkpoint.native=false" in bad.stderr
    assert not marker.exists() and "Traceback" not in bad.stderr


def test_universal_checkpoint_loading_is_refused_before_launch(run_zoo, tmp_path, written):
    run_dir = copy_run(written, tmp_path)
    marker = tmp_path / "code-ran"
    zero = run_dir / "checkpoints" / "step_0000003" / "native" / "zero"
    zero.mkdir(parents=True, exist_ok=True)
    torch.save({"state": ExecutesCode(marker)}, zero / "optimizer_state.pt")
    for f in (run_dir / "checkpoints" / "step_0000003" / "native").glob("*.pt"):
        torch.save({"module": ExecutesCode(marker)}, f)
    bad = run_zoo(*FAST, "trainer.max_steps=4", "checkpoint.native=true", "resume=auto",
                  "+deepspeed.checkpoint.load_universal=true", run_dir=run_dir, check=False)
    assert bad.returncode == 2 and "deepspeed.checkpoint.load_universal" in bad.stderr
    assert not marker.exists() and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_a_pickle_in_one_ranks_optimizer_file_is_refused_by_that_rank(run_zoo, tmp_path):
    """dp=2 under ZeRO-1: each rank reads its own optimizer partition. A hostile file that only
    rank 1 reads is refused before any rank reads it, by every rank alike: one line, naming
    the file, no traceback from any rank (rank 0 waits in no collective rank 1 left)."""
    run_dir = tmp_path / "run"
    zero1 = ["parallel=zero1", "checkpoint.native=true"]
    run_zoo(*FAST, *zero1, "trainer.max_steps=2", "checkpoint.every=2", run_dir=run_dir)
    marker = tmp_path / "code-ran"
    native = run_dir / "checkpoints" / "step_0000002" / "native"
    rank1 = [f for f in native.glob("*optim_states.pt") if "pp_rank_1_" in f.name]
    assert len(rank1) == 1, sorted(p.name for p in native.iterdir())
    torch.save({"optimizer_state_dict": ExecutesCode(marker)}, rank1[0])
    # The checksums recorded at save time already catch the changed file ...
    caught = run_zoo(*FAST, *zero1, "trainer.max_steps=3", "resume=auto", run_dir=run_dir, check=False)
    assert caught.returncode == 2 and f"{rank1[0].name} has" in caught.stderr and "no intact checkpoint" in caught.stderr
    # ... and a hostile checkpoint whose checksums were written to match is refused by the unpickler.
    write_checksums(native.parent)
    for launcher in ([], ["torchrun"]):
        bad = run_zoo(*FAST, *zero1, "trainer.max_steps=3", "resume=auto", run_dir=run_dir, check=False,
                      cmd=_torchrun(run_dir, *FAST, *zero1, "trainer.max_steps=3", "resume=auto") if launcher else None)
        # torchrun exits 1 whatever its ranks' exit codes (each rank exits 2 here).
        assert bad.returncode == (1 if launcher else 2), bad.stderr[-3000:]
        assert bad.stderr.count("zoo: error:") == 1, bad.stderr[-3000:]
        assert "refused to load" in bad.stderr and rank1[0].name in bad.stderr, bad.stderr[-3000:]
        assert "exitcode  : 2" in bad.stderr if launcher else True
        assert not marker.exists()
        # torchrun reports a failed rank with a traceback of its own; no frame comes from zoo's ranks.
        assert not re.search(r'File ".*/zoo/', bad.stderr) and (launcher or "Traceback" not in bad.stderr)


def _torchrun(run_dir, *overrides):
    """The same run as one rank per process under torchrun (2 ranks: dp comes from the world size)."""
    from pathlib import Path

    torchrun = Path(sys.executable).with_name("torchrun")
    return [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train", f"hydra.run.dir={run_dir}",
            "trainer.progress=false", *overrides]


def test_kill_9_then_resume_matches_an_uninterrupted_run(run_zoo, tmp_path, zoo_cache, checkpoint_reference):
    every = [f"trainer.max_steps={STEPS}", "checkpoint.every=1", "checkpoint.keep=2"]
    run_dir = tmp_path / "killed"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", *FAST, *every],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and not (latest.exists() and latest.read_text().strip() >= "step_0000005"):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-training, possibly mid-save
    proc.wait()
    assert latest.exists(), "no checkpoint was written before the kill"
    killed_at = int(latest.read_text().strip().split("_")[1])
    assert killed_at < STEPS, "the run finished before it was killed"
    resumed = run_zoo(*FAST, *every, "resume=auto", run_dir=run_dir)
    assert f"at step {killed_at}" in resumed.stdout
    assert losses_by_step(resumed) == checkpoint_reference


def test_a_half_written_checkpoint_is_never_used(run_zoo, tmp_path, checkpoint_reference, written):
    run_dir = copy_run(written, tmp_path)
    ckpts = run_dir / "checkpoints"
    # What a kill during the write of step 4 leaves: a temporary directory, latest unmoved.
    partial = ckpts / ".step_0000004.tmp"
    shutil.copytree(ckpts / "step_0000003", partial)
    (partial / "shard-00000.safetensors").write_bytes(b"truncated")
    (partial / "state.json").unlink()
    resumed = run_zoo(*FAST, "trainer.max_steps=5", "resume=auto", run_dir=run_dir)
    assert "at step 3" in resumed.stdout and resumed.summary["steps"] == 5
    assert after(losses_by_step(resumed), 3) == {4: checkpoint_reference[4], 5: checkpoint_reference[5]}


PP = ["parallel=pp", "parallel.num_microbatches=4"]


# (layout, what the resume crosses, the step the segment ends at): one 20-step schedule
CHAIN = [
    (PP, "pp 2 (written)", 4),
    (PP, "pp 2 same", 8),
    (["parallel=tp"], "pp 2 -> 1, tp 1 -> 2", 11),
    (["parallel=zero3"], "tp 2 -> 1, dp 1 -> 2, ZeRO 1 -> 3", 14),
    (["parallel=ddp"], "dp 2 -> 1, ZeRO 3 -> 0", STEPS),
]


def assert_each_rank_wrote_its_share(ckpt, world: int, partitioned: bool) -> None:
    """Every value of every tensor is in exactly one rank's shard; with `partitioned` (ZeRO,
    dp = world) each rank's shard holds its 1/world of each tensor, not a whole one."""
    import math

    from zoo.checkpoint.boxes import intersect

    indexes = [json.loads((ckpt / f"index-{r:05d}.json").read_text())["entries"] for r in range(world)]
    assert sorted(f.name for f in ckpt.glob("shard-*.safetensors")) == [f"shard-{r:05d}.safetensors" for r in range(world)]
    tensors = {e["tensor"]: e["shape"] for entries in indexes for e in entries}
    for tensor, shape in tensors.items():
        boxes = [(r, (tuple(e["offsets"]), tuple(e["sizes"]))) for r, entries in enumerate(indexes) for e in entries
                 if e["tensor"] == tensor]
        assert sum(math.prod(b[1]) for _, b in boxes) == math.prod(shape), tensor  # covered ...
        assert all(intersect(a, b) is None for i, (_, a) in enumerate(boxes) for _, b in boxes[i + 1:]), tensor  # once
        if partitioned and math.prod(shape) >= world:
            per_rank = [sum(math.prod(b[1]) for r2, b in boxes if r2 == r) for r in range(world)]
            assert max(per_rank) <= math.ceil(math.prod(shape) / world), (tensor, per_rank)
    # the merged index a resume reads (zoo.checkpoint.merged_index) holds the same boxes
    from zoo.checkpoint.merged_index import MergedIndex

    merged = MergedIndex(ckpt)
    assert merged.tensors.keys() == tensors.keys()
    for tensor in tensors:
        saved = sorted((f"shard-{r:05d}.safetensors", e["key"], (tuple(e["offsets"]), tuple(e["sizes"])))
                       for r, entries in enumerate(indexes) for e in entries if e["tensor"] == tensor)
        assert sorted(merged.boxes(tensor)) == saved, tensor


def test_resume_on_another_layout(run_zoo, tmp_path, checkpoint_reference):
    run_dir, start = tmp_path / "chain", 0
    for layout, what, end in CHAIN:
        run = run_zoo(*FAST, *layout, "checkpoint.every=2", "checkpoint.native=true", f"trainer.max_steps={end}",
                      "resume=auto", run_dir=run_dir)
        got = losses_by_step(run)
        mine = list(range(start + 1, end + 1))
        if start:
            assert f"at step {start}" in run.stdout, what
            assert f"read from its {'native' if 'same' in what else 'layout-free'} files" in run.stdout, what
        torch.testing.assert_close(torch.tensor([got[s] for s in mine]), torch.tensor([checkpoint_reference[s] for s in mine]),
                                   rtol=1e-5, atol=0, msg=lambda m: f"{what}: {m}")
        if layout == ["parallel=zero3"]:  # what each of its 2 ranks wrote: half of every tensor
            assert_each_rank_wrote_its_share(run_dir / "checkpoints" / f"step_{end:07d}", 2, partitioned=True)
        start = end


def test_a_checkpoint_of_another_model_is_refused(run_zoo, tmp_path, written):
    run_dir = copy_run(written, tmp_path)
    bad = run_zoo(*FAST, "trainer.max_steps=4", "model.n_layer=2", "resume=auto", run_dir=run_dir, check=False)
    assert bad.returncode == 2, bad.stderr
    assert "n_layer" in bad.stderr and "Traceback" not in bad.stderr
    state = json.loads((run_dir / "checkpoints" / "step_0000003" / "state.json").read_text())
    assert state["shape"]["n_layer"] == 4
    assert state["data_order"] == "feistel"  # the epoch's order a resume keeps (data_pipelines.schedule)


def test_an_async_save_resumes_on_another_layout_and_sigterm_waits_for_the_write(run_zoo, tmp_path, zoo_cache,
                                                                                 checkpoint_reference):
    """checkpoint.async_save: each periodic checkpoint is staged and written in the background
    (each write held back 2 s here, so one is in flight when SIGTERM comes); the stop waits for
    it, checkpoints its own step, and a resume under tp=2 continues the reference run."""
    every = [f"trainer.max_steps={STEPS}", "checkpoint.every=2", "checkpoint.async_save=true", "checkpoint.keep=5"]
    run_dir = tmp_path / "async"
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "ZOO_TEST_SAVE_DELAY_S": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "zoo.train", f"hydra.run.dir={run_dir}", *FAST, *every],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not (run_dir / "checkpoints" / ".step_0000004.tmp").exists():
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # step 4's shards are still being written
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-3000:]
    assert "step_0000004: the step stalled" in out and "checkpoint step_0000004 written" in out, out[-3000:]
    assert "waited" in out.split("checkpoint step_0000004 written")[1].splitlines()[0], out[-3000:]
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    stopped = int(latest.split("_")[1])
    assert stopped >= 4 and (run_dir / "checkpoints" / "step_0000004" / "checksums.json").exists()
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))
    resumed = run_zoo(*FAST, *every, "parallel=tp", "resume=auto", run_dir=run_dir)
    assert f"at step {stopped}" in resumed.stdout and "tp1-pp1-dp1" in resumed.stdout
    torch.testing.assert_close(torch.tensor(list(after(losses_by_step(resumed), stopped).values())),
                               torch.tensor([checkpoint_reference[s] for s in range(stopped + 1, STEPS + 1)]),
                               rtol=1e-5, atol=0)
    assert resumed.summary["checkpoint_stall_s"] >= 0


def test_a_bf16_run_without_zero_resumes_exactly(run_zoo, tmp_path):
    """bf16 at ZeRO-0: DeepSpeed's FP16_UnfusedOptimizer keeps an fp32 master a parameter and keys
    AdamW's state by it. The checkpoint holds those masters and moments (it held the bf16
    weights and zero moments, and a resumed run's loss went NaN at its second step), so a
    resume continues the uninterrupted run."""
    bf16 = (*FAST, "precision=bf16", "parallel.zero_stage=0", "trainer.eval_batches=0")
    straight = run_zoo(*bf16, "trainer.max_steps=6", run_dir=tmp_path / "straight")
    run_zoo(*bf16, "trainer.max_steps=3", "checkpoint.every=3", run_dir=tmp_path / "run")
    resumed = run_zoo(*bf16, "trainer.max_steps=6", "resume=auto", run_dir=tmp_path / "run")
    assert "at step 3" in resumed.stdout
    assert after(losses_by_step(resumed), 3) == after(losses_by_step(straight), 3)


def test_checkpoint_every_auto_measures_a_save_then_follows_young_s_interval(run_zoo, tmp_path):
    """checkpoint.every=auto: a first save two steps in measures what a save costs; each line
    then says the interval chosen from it (Young's, with run.mtbf_hours), and the checkpoints
    are where the lines put them; a resume keeps the interval its checkpoint chose."""
    run_dir = tmp_path / "run"
    run = run_zoo(*FAST, "trainer.max_steps=9", "checkpoint.every=auto", "run.mtbf_hours=0.0003", "checkpoint.keep=50",
                  run_dir=run_dir)
    lines = [line for line in run.stdout.splitlines() if "checkpoint.every=auto" in line]
    assert "a first checkpoint at step 2 measures what a save costs" in lines[0], lines
    chosen = {int(m.group(2)): int(m.group(1)) for m in
              (re.search(r"every (\d+) steps from step (\d+) \(a save stalls training [0-9.]+ s, a step takes "
                         r"[0-9.]+ s, run.mtbf_hours=0.0003: Young's sqrt\(2 x [0-9.]+ s x 1 s\) = [0-9.e-]+ s", line)
               for line in lines[1:]) if m}
    assert len(chosen) == len(lines) - 1 and 2 in chosen, lines
    expected, step, every, recorded = [], 2, None, None
    while step <= 9:  # where the lines put the saves
        expected.append(step)
        recorded = every  # what a save's checkpoint records: the interval chosen before its own measurement
        every = chosen.get(step, every)
        step += every
    if expected[-1] != 9:
        recorded = every  # the final checkpoint, written after the last measurement
    saved = sorted(int(p.name[len("step_"):]) for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == sorted(set(expected) | {9}), (saved, expected, lines)  # and the final one
    state = json.loads((run_dir / "checkpoints" / "step_0000009" / "state.json").read_text())
    assert state["checkpoint_interval"] == ({"interval": recorded} if recorded else {}), (state, lines)
    resumed = run_zoo(*FAST, "trainer.max_steps=12", "checkpoint.every=auto", "run.mtbf_hours=0.0003",
                      "checkpoint.keep=50", "resume=auto", run_dir=run_dir)
    assert (f"every {recorded} steps, as the checkpoint resumed from chose" if recorded
            else "a first checkpoint at step 11") in resumed.stdout, resumed.stdout

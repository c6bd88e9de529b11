"""Verified checkpoints: each damage a disk or a person does to a checkpoint is found before
it is read, named in one line, and `resume=auto` falls back to the newest intact checkpoint
(the run then continues exactly); a fresh start never writes over existing checkpoints."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.checkpoint_runs import FAST, losses_by_step

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def two_checkpoints(run_zoo, tmp_path_factory):
    """A run of 4 steps with checkpoints at steps 2 and 4."""
    run_dir = tmp_path_factory.mktemp("two") / "run"
    return run_zoo(*FAST, "trainer.max_steps=4", "checkpoint.every=2", "checkpoint.keep=5", run_dir=run_dir)


def _truncate(step):
    f = step / "shard-00000.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return "shard-00000.safetensors has"


def _flip_4_kib(step):
    f = step / "shard-00000.safetensors"
    data = bytearray(f.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])
    f.write_bytes(bytes(data))
    return "shard-00000.safetensors does not match its checksum"


def _garbage_state(step):
    (step / "state.json").write_text("{not json")
    return "state.json is not readable JSON"


def _missing_state(step):
    (step / "state.json").unlink()
    return "state.json is missing"


def _deleted_directory(step):
    shutil.rmtree(step)
    return "step_0000004/ is missing"


DAMAGES = [_truncate, _flip_4_kib, _garbage_state, _missing_state, _deleted_directory]


def test_every_damage_is_found_and_named_before_anything_is_read(tmp_path, two_checkpoints):
    """The verification `resume=auto` runs, on a copy of a real run per kind of damage."""
    from zoo.checkpoint.verify import newest_intact

    for damage in DAMAGES:
        run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / damage.__name__)
        said = damage(run_dir / "checkpoints" / "step_0000004")
        path, notes = newest_intact(run_dir / "checkpoints")
        assert path.name == "step_0000002" and len(notes) == 1 and said in notes[0], (damage.__name__, notes)
        assert "falling back to the one before it" in notes[0]


# The whole resume for each kind (two in the fast tier, the rest in tests/conftest.py's SLOW).
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda f: f.__name__.strip("_"))
def test_resume_auto_falls_back_to_the_newest_intact_checkpoint(run_zoo, tmp_path, two_checkpoints, checkpoint_reference, damage):
    run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / "run")
    said = damage(run_dir / "checkpoints" / "step_0000004")
    resumed = run_zoo(*FAST, "trainer.max_steps=6", "checkpoint.every=2", "resume=auto", run_dir=run_dir)
    assert said in resumed.stdout and "falling back" in resumed.stdout
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    assert {s: l for s, l in losses_by_step(resumed).items() if s > 2} == {s: checkpoint_reference[s] for s in (3, 4, 5, 6)}


def test_without_latest_the_newest_intact_step_is_taken(run_zoo, tmp_path, two_checkpoints, checkpoint_reference):
    run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / "run")
    (run_dir / "checkpoints" / "latest").unlink()
    resumed = run_zoo(*FAST, "trainer.max_steps=6", "checkpoint.every=2", "resume=auto", run_dir=run_dir)
    assert "at step 4" in resumed.stdout
    assert {s: l for s, l in losses_by_step(resumed).items() if s > 4} == {s: checkpoint_reference[s] for s in (5, 6)}


def _one_error_line(run) -> str:
    lines = [line for line in run.stderr.splitlines() if line.startswith("zoo: error:")]
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    return lines[0]


def test_a_fresh_start_never_writes_over_checkpoints(run_zoo, tmp_path, two_checkpoints):
    run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / "run")
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    line = _one_error_line(run_zoo(*FAST, "trainer.max_steps=2", run_dir=run_dir, check=False))
    assert "already holds checkpoints" in line and "resume=auto" in line
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_fresh_start_never_writes_over_a_finished_runs_results(run_zoo, tmp_path):
    run_dir = tmp_path / "run"
    first = run_zoo(*FAST, "trainer.max_steps=1", run_dir=run_dir)  # no checkpoints: results only
    before = {p: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    line = _one_error_line(run_zoo(*FAST, "trainer.max_steps=1", "trainer.seed=7", run_dir=run_dir, check=False))
    assert "already holds a run's results" in line and "summary.json" in line
    assert {p: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before and first.summary["steps"] == 1


def test_a_damaged_checkpoint_named_explicitly_is_refused(run_zoo, tmp_path, two_checkpoints):
    run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / "run")
    step = run_dir / "checkpoints" / "step_0000004"
    said = _truncate(step)
    line = _one_error_line(run_zoo(*FAST, "trainer.max_steps=6", f"resume={step}", check=False))
    assert said in line


def test_no_intact_checkpoint_is_refused_naming_each(run_zoo, tmp_path, two_checkpoints):
    run_dir = shutil.copytree(two_checkpoints.run_dir, tmp_path / "run")
    for step in ("step_0000002", "step_0000004"):
        _garbage_state(run_dir / "checkpoints" / step)
    line = _one_error_line(run_zoo(*FAST, "trainer.max_steps=6", "resume=auto", run_dir=run_dir, check=False))
    assert "no intact checkpoint" in line and "step_0000002" in line and "step_0000004" in line


def test_checksums_cover_every_file(two_checkpoints):
    step = two_checkpoints.run_dir / "checkpoints" / "step_0000004"
    listed = json.loads((step / "checksums.json").read_text())
    assert set(listed) == {str(p.relative_to(step)) for p in step.rglob("*") if p.is_file()} - {"checksums.json"}


def test_two_ranks_verify_their_shares_and_fall_back_together(run_zoo, tmp_path, checkpoint_reference):
    """#50 item 3: under zero1 on 2 ranks each rank hashes its own shard (rank 1 finds its
    changed shard-00001, which rank 0 no longer reads), both fall back to step 2 together, and
    the run continues exactly."""
    zero1 = ["parallel=zero1", "checkpoint.native=true"]  # DeepSpeed's files too, each hashed at save by its owner
    run_dir = tmp_path / "run"
    run_zoo(*FAST, *zero1, "trainer.max_steps=4", "checkpoint.every=2", "checkpoint.keep=5", run_dir=run_dir)
    from zoo.checkpoint.verify import damage

    listed = json.loads((run_dir / "checkpoints" / "step_0000004" / "checksums.json").read_text())
    assert sum(name.startswith("native/") for name in listed) >= 2 and damage(run_dir / "checkpoints" / "step_0000004") is None
    f = run_dir / "checkpoints" / "step_0000004" / "shard-00001.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    resumed = run_zoo(*FAST, *zero1, "trainer.max_steps=6", "checkpoint.every=2", "resume=auto", run_dir=run_dir)
    assert "shard-00001.safetensors does not match its checksum" in resumed.stdout and "falling back" in resumed.stdout
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    assert {s: l for s, l in losses_by_step(resumed).items() if s > 2} == pytest.approx(
        {s: checkpoint_reference[s] for s in (3, 4, 5, 6)}, abs=1e-5)

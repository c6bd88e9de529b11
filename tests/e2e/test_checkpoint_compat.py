"""Checkpoints written by the code before the family restructuring still load: the old code
(checked out from git history) writes, today's code resumes, and the resumed steps equal
the old code's own uninterrupted steps."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

# The last commit before the restructuring into zoo/families, zoo/checkpoint and zoo/observe.
OLD = "b9a0c46"
FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.eval_batches=1", "optim.warmup_steps=2",
        "optim.decay_steps=4", "logger=none"]


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory):
    out = tmp_path_factory.mktemp("old_code")
    proc = subprocess.run(f"git -C {REPO} archive {OLD} | tar -x -C {out}", shell=True, capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "zoo" / "checkpoint.py").exists():
        pytest.skip(f"commit {OLD} is not in this clone's history ({proc.stderr.strip()[:200]})")
    return out


def losses(run) -> dict:
    return {m["step"]: m["loss"] for m in run.metrics}


@pytest.mark.parametrize("family, layout, exact", [("gpt", ["parallel=ddp"], True),
                                                   ("bert", ["parallel=pp", "trainer.global_batch_size=12",
                                                             "checkpoint.native=true"], False)])
def test_a_checkpoint_of_the_old_code_resumes(run_zoo, old_tree, tmp_path, family, layout, exact):
    common = [*FAST, f"model={family}", *layout, "trainer.max_steps=4"]
    # Today's code builds the data cache first, so that both read the same entries (an entry
    # with the old code's marker would be rebuilt, and BERT's rebuild is not bitwise the same).
    run_zoo(*FAST, f"model={family}", "trainer.max_steps=0", "checkpoint.save_final=false", run_dir=tmp_path / "warm")
    old = run_zoo(*common, "checkpoint.every=2", cwd=old_tree, env={"PYTHONPATH": str(old_tree)})
    assert "zoo: start:" not in old.stdout, "today's code ran, not the old one (it prints where its start went)"
    written = old.run_dir / "checkpoints" / "step_0000002"
    assert written.is_dir()
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    shutil.copytree(written, run_dir / "step_0000002")
    resumed = run_zoo(*common, f"resume={run_dir / 'step_0000002'}", run_dir=run_dir / "run")
    assert "at step 2" in resumed.stdout
    # Native files of the old pipeline's layer list are not this code's: the layout-free files are read.
    assert "read from its layout-free files" in resumed.stdout
    want = {s: l for s, l in losses(old).items() if s > 2}
    got = losses(resumed)
    if exact:
        assert got == want
    else:
        torch.testing.assert_close(torch.tensor([got[s] for s in want]), torch.tensor(list(want.values())),
                                   rtol=1e-5, atol=0)

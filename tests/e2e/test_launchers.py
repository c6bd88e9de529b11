"""The same entry point under external launchers: each process is one rank, dp comes from
the world size, and all ranks agree on rank 0's run directory."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

FAST = ["debug=fast", "trainer.progress=false"]


def test_torchrun(run_zoo, tmp_path):
    run_dir = tmp_path / "torchrun"
    torchrun = Path(sys.executable).with_name("torchrun")
    run = run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                       f"hydra.run.dir={run_dir}", "parallel=zero1", *FAST], run_dir=run_dir)
    s = run.summary
    assert (s["world_size"], s["dp"], s["zero_stage"]) == (2, 2, 1)


def test_torchrun_ranks_agree_on_one_run_dir(run_zoo, tmp_path):
    """Without hydra.run.dir each rank composes its own timestamped directory; rank 0's wins."""
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "outputs"
    run_zoo(cmd=[str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "zoo.train",
                 f"hydra.run.dir={out}/" + "${now:%H-%M-%S-%f}", "parallel=ddp", *FAST], run_dir=out)
    dirs = [d for d in out.iterdir() if d.is_dir()]
    assert len(dirs) == 1 and (dirs[0] / "summary.json").exists(), dirs


@pytest.mark.skipif(shutil.which("deepspeed", path=str(Path(sys.executable).parent)) is None,
                    reason="the deepspeed launcher script is not installed beside this python")
@pytest.mark.parametrize("flags", [[], ["--no_local_rank"]], ids=["as-the-readme-prints-it", "no-local-rank"])
def test_deepspeed_launcher(run_zoo, tmp_path, flags):
    """The README's line, `deepspeed --num_gpus 8 --module zoo.train parallel=zero2`, on 2
    ranks: the launcher's --local_rank=N argument is taken out before Hydra sees it."""
    run_dir = tmp_path / "ds"
    launcher = Path(sys.executable).with_name("deepspeed")
    run = run_zoo(cmd=[str(launcher), "--num_gpus", "2", *flags, "--module", "zoo.train", "parallel=zero2",
                       f"hydra.run.dir={run_dir}", *FAST], run_dir=run_dir)
    assert (run.summary["world_size"], run.summary["zero_stage"]) == (2, 2)

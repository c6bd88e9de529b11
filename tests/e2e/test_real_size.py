"""benchmarks/real_size.py's phases at a small shape (the slow tier; the benchmark itself runs
TinyLlama-1.1B): parallel=auto on 4 ranks, a checkpoint, resume=auto re-planned, a resume onto
tp2 x pp2 with the evaluation and the in-place sample, export, transformers' logits equal to
the plain model's with the final weights; each rank's peak within 1.10x of the planner's
estimate; building the model is a small part of a resume's start; the ranks ran on the
malloc run.cpu_allocator=auto picks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_the_real_size_phases_at_a_small_shape(tmp_path, zoo_cache):
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "benchmarks/real_size.py", "--size", "tiny", "--vocab", "4096", "--out",
                          str(tmp_path), "--json", str(tmp_path / "rows.json")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert rows["hf_logits"]["max_diff"] < 1e-4 and rows["hf_logits"]["params"] > 1_000_000
    for name in ("train", "resume_auto", "resume_other"):
        s = rows[name]["summary"]
        assert max(s["peak_mem_bytes_per_rank_training"]) / 1e9 <= 1.10 * rows[name]["planned_gb"], name
    assert (rows["resume_other"]["summary"]["tp"], rows["resume_other"]["summary"]["pp"]) == (2, 2)
    assert rows["resume_other"]["summary"]["sample"].startswith(rows["resume_other"]["summary"]["sample_prompt"])
    for name in ("resume_auto", "resume_other"):
        start = rows[name]["summary"]["startup"]
        assert start["model"] <= 0.10 * start["total"], (name, start)
    assert "worst rank peak / plan" in out.stdout
    from zoo.run.allocator import resolve  # the ranks ran on the malloc zoo's launcher preloads

    assert {rows[name]["summary"]["cpu_allocator"] for name in rows if "summary" in rows[name]} == {resolve("auto")[0]}

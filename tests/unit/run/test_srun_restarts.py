"""slurm/srun_ranks.sh's in-job restarts (run.max_restarts), with srun, scontrol and sinfo stubbed:
a failed srun is run again on the nodes that still answer, with resume=auto and the attempt
number; a spent budget, a config error and a bad value each end it as they should."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

STUBS = {
    "scontrol": """#!/bin/bash
# scontrol show hostnames LIST: node[1-2] or a comma list
list=$3
if [[ $list == "node[1-2]" ]]; then printf 'node1\\nnode2\\n'; else tr ',' '\\n' <<<"$list"; fi
""",
    "sinfo": """#!/bin/bash
printf 'node1 alloc\\nnode2 down*\\n'
""",
    "srun": """#!/bin/bash
n=$(cat "$STUB_DIR/calls" 2>/dev/null || echo 0)
echo $((n + 1)) >"$STUB_DIR/calls"
echo "args: $* | attempt=$ZOO_ATTEMPT max=$ZOO_MAX_RESTARTS master=$MASTER_ADDR" >>"$STUB_DIR/srun.log"
codes=($SRUN_CODES)
exit ${codes[$n]:-0}
""",
}


def _run(tmp_path: Path, codes: str, *overrides: str) -> subprocess.CompletedProcess:
    for name, text in STUBS.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "STUB_DIR": str(tmp_path), "SRUN_CODES": codes,
           "ZOO_PYTHON": sys.executable, "SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_PER_TASK": "1",
           "SLURM_RESTART_COUNT": "0"}
    script = f'source {REPO / "slurm" / "srun_ranks.sh"}; srun_ranks "$@"'
    return subprocess.run(["bash", "-c", script, "srun_ranks", *overrides], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def _calls(tmp_path: Path) -> list:
    log = tmp_path / "srun.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_failed_srun_runs_again_on_the_nodes_that_answer_resuming(tmp_path):
    out = _run(tmp_path, "137 0", "run.max_restarts=2", "logger=none")
    assert out.returncode == 0, out.stderr
    first, second = _calls(tmp_path)
    assert "--ntasks=4" in first and "run.max_restarts" not in first and "resume=auto" not in first
    assert "attempt=0 max=2 master=node1" in first
    assert "--ntasks=2" in second and "--nodes=1 --nodelist=node1 --overlap" in second and "resume=auto" in second
    assert "attempt=1 max=2" in second
    assert "zoo: srun exited 137; restart 1 of 2 (run.max_restarts) on node1 (1 node(s) answering, 2 ranks" in out.stdout


def test_the_budget_spent_ends_the_job_in_one_line_with_srun_s_code(tmp_path):
    out = _run(tmp_path, "137 1", "run.max_restarts=1")
    assert out.returncode == 1 and len(_calls(tmp_path)) == 2
    assert out.stderr.strip().splitlines()[-1] == ("zoo: error: srun exited 1 on attempt 2 of 2: run.max_restarts=1 "
                                                   "spent, the job ends")


def test_without_restarts_a_config_error_or_a_requeue_srun_runs_once(tmp_path):
    assert _run(tmp_path, "137").returncode == 137 and len(_calls(tmp_path)) == 1
    for code in ("2", "3"):
        (tmp_path / "srun.log").unlink()
        (tmp_path / "calls").unlink()
        assert _run(tmp_path, code, "run.max_restarts=3").returncode == int(code) and len(_calls(tmp_path)) == 1


def test_a_bad_value_is_one_line_and_no_srun(tmp_path):
    out = _run(tmp_path, "0", "run.max_restarts=two")
    assert out.returncode == 2 and not _calls(tmp_path)
    assert out.stderr.strip() == ("zoo: error: run.max_restarts=two must be an integer >= 0 (restarts of the ranks "
                                  "inside the job)")

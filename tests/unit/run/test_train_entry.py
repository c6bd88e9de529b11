"""zoo.train's entry helpers: the one-line report of the first failing rank, the deepspeed launcher's
argument taken out before Hydra."""
from __future__ import annotations

from zoo.train import _last_error_line


def test_an_error_file_record_gives_its_exception_line():
    record = {"message": "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    g()\n"
                         "torch.distributed.DistBackendError: [../gloo] Timed out waiting 15000ms for recv\n",
              "extraInfo": {"py_callstack": "...", "timestamp": "1764580000"}}
    line = _last_error_line(record)
    assert line == "torch.distributed.DistBackendError: [../gloo] Timed out waiting 15000ms for recv"
    assert "\n" not in _last_error_line("Signal 9 (SIGKILL) received by PID 123")


def test_an_empty_message_says_so():
    assert _last_error_line({"message": ""}) == "(no message)" and _last_error_line(None) == "(no message)"

def test_the_deepspeed_launchers_local_rank_argument_is_taken_out(monkeypatch):
    import os

    from zoo.train import _take_local_rank

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _take_local_rank(["--local_rank=1", "parallel=zero2"]) == ["parallel=zero2"]
    assert os.environ["LOCAL_RANK"] == "1"
    assert _take_local_rank(["a=1", "--local_rank", "3", "b=2"]) == ["a=1", "b=2"]


def test_run_max_restarts_is_refused_under_another_launcher_naming_its_own_flag():
    import pytest

    from tests.unit.config.test_config import composed
    from zoo.run.errors import ConfigError
    from zoo.run.launch import LaunchEnv
    from zoo.train import _checked

    cfg = composed("run.max_restarts=2")
    with pytest.raises(ConfigError, match=r"^run.max_restarts=2 is read by zoo's own launcher .*not under torchrun: "
                                          r"drop it and give torchrun --max-restarts=2$"):
        _checked(cfg, LaunchEnv("torchrun", 2))
    with pytest.raises(ConfigError, match=r"not under slurm: the sbatch scripts read it \(slurm/srun_ranks.sh"):
        _checked(cfg, LaunchEnv("slurm", 2))
    with pytest.raises(ConfigError, match="not under deepspeed: drop it: there a failure ends the job"):
        _checked(cfg, LaunchEnv("deepspeed", 2))
    _checked(cfg, LaunchEnv("local", None))  # zoo's own launcher reads it


def test_a_config_error_of_a_restarted_job_says_it_came_back_on_other_ranks(monkeypatch):
    from tests.unit.config.test_config import composed
    from zoo.run.launch import LaunchEnv
    from zoo.train import restarted_on

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert restarted_on(composed("parallel=3d"), LaunchEnv("torchrun", 3)) == ""  # the first attempt: as always
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restarted_on(composed("parallel=3d"), LaunchEnv("torchrun", 3)) == (
        " (restart 1 of 2, torchrun --max-restarts: the job came back on 3 rank(s), and this layout no longer fits "
        "them; parallel=auto re-plans a restarted job for the ranks it has)")
    assert restarted_on(composed("parallel=auto"), LaunchEnv("torchrun", 3)) == ""

"""run.cpu_allocator: which malloc the CPU ranks get (zoo.run.allocator), the refusals, the
LD_PRELOAD the launcher and srun_ranks.sh give the ranks, and the planner's engine term for it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from zoo.run import allocator
from zoo.run.errors import ConfigError


@pytest.fixture
def libs(tmp_path, monkeypatch):
    """A library folder the search sees alone; `put(name)` installs a (fake) shared object."""
    monkeypatch.setattr(allocator, "_search_dirs", lambda: [tmp_path])

    def put(filename: str) -> str:
        (tmp_path / filename).write_bytes(b"\x7fELF")
        return str(tmp_path / filename)

    return put


def test_auto_prefers_tcmalloc_then_jemalloc_then_glibc(libs):
    assert allocator.resolve("auto") == ("glibc", None)
    je = libs("libjemalloc.so.2")
    assert allocator.resolve("auto") == ("jemalloc", je)
    tc = libs("libtcmalloc_minimal.so.4")
    assert allocator.resolve("auto") == ("tcmalloc", tc)
    assert allocator.resolve("jemalloc") == ("jemalloc", je)
    assert allocator.resolve("glibc") == ("glibc", None)


def test_a_named_allocator_this_machine_lacks_is_one_line_naming_the_package(libs):
    with pytest.raises(ConfigError) as err:
        allocator.resolve("tcmalloc")
    line = str(err.value)
    assert "\n" not in line and "run.cpu_allocator=tcmalloc" in line and "libtcmalloc-minimal4" in line
    assert "run.cpu_allocator=auto" in line
    with pytest.raises(ConfigError, match=r"run.cpu_allocator='mimalloc' is unknown: use one of auto, tcmalloc"):
        allocator.resolve("mimalloc")


def test_preload_goes_first_once_and_keeps_what_was_there():
    env = {"LD_PRELOAD": "/opt/a.so /opt/b.so"}
    assert allocator.with_preload("/x/libtc.so", env) == "/x/libtc.so:/opt/a.so:/opt/b.so"
    assert allocator.with_preload("/opt/b.so", env) == "/opt/a.so:/opt/b.so"
    assert allocator.with_preload(None, {}) == ""


def test_the_ranks_launched_here_get_the_preload_and_gpu_ranks_are_left_alone(libs, monkeypatch):
    tc = libs("libtcmalloc_minimal.so.4")
    monkeypatch.setenv("LD_PRELOAD", "/opt/a.so")
    monkeypatch.delenv("TCMALLOC_AGGRESSIVE_DECOMMIT", raising=False)
    assert allocator.preload_for_ranks("auto", cuda=True) == "caching"  # not "glibc": no note on a GPU
    assert os.environ["LD_PRELOAD"] == "/opt/a.so" and "TCMALLOC_AGGRESSIVE_DECOMMIT" not in os.environ
    assert allocator.preload_for_ranks("auto", cuda=False) == "tcmalloc"
    assert os.environ["LD_PRELOAD"] == f"{tc}:/opt/a.so" and os.environ["TCMALLOC_AGGRESSIVE_DECOMMIT"] == "t"
    monkeypatch.setenv("TCMALLOC_AGGRESSIVE_DECOMMIT", "f")  # the user's own setting stays
    assert allocator.ranks_env("tcmalloc", tc) == {"LD_PRELOAD": f"{tc}:/opt/a.so"}


def test_the_planner_counts_the_ranks_malloc(libs, monkeypatch):
    libs("libtcmalloc_minimal.so.4")
    for key in ("RANK", "ZOO_LOCAL_WORKER", "ZOO_START_METHOD"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(allocator, "in_use", lambda: "glibc")
    assert allocator.planned("auto", cuda=True) == "caching"
    assert allocator.planned("auto", cuda=False, world=4) == "tcmalloc"  # zoo's launcher will preload it
    assert allocator.planned("glibc", cuda=False, world=4) == "glibc"
    assert allocator.planned("auto", cuda=False, world=1) == "glibc"  # one rank runs in this process
    monkeypatch.setenv("ZOO_START_METHOD", "fork")  # forked ranks keep this process's malloc
    assert allocator.planned("auto", cuda=False, world=4) == "glibc"
    monkeypatch.delenv("ZOO_START_METHOD")
    monkeypatch.setenv("RANK", "3")  # a rank torchrun or srun started: the one it runs on
    assert allocator.planned("auto", cuda=False, world=4) == "glibc"


def test_the_cpu_preset_has_an_engine_term_for_each_malloc():
    from zoo.plan.settings import machine_preset

    preloaded, glibc = machine_preset(False, "tcmalloc"), machine_preset(False, "glibc")
    assert preloaded.engine_bytes_per_param_glibc == glibc.engine_bytes_per_param
    assert glibc.engine_bytes_per_param != preloaded.engine_bytes_per_param
    assert machine_preset(True, "glibc").engine_bytes_per_param == machine_preset(True).engine_bytes_per_param


def test_a_process_started_with_the_preload_runs_on_it():
    name, path = allocator.resolve("auto")
    code = "from zoo.run.allocator import in_use; print(in_use())"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    plain = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert plain.stdout.strip() == "glibc", plain.stderr
    if path is None:
        pytest.skip("no tcmalloc or jemalloc on this machine (apt install libtcmalloc-minimal4)")
    preloaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "LD_PRELOAD": path},
                               capture_output=True, text=True)
    assert preloaded.stdout.strip() == name, preloaded.stderr


def test_the_command_for_srun_prints_the_exports_or_refuses_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TCMALLOC_AGGRESSIVE_DECOMMIT")}
    ok = subprocess.run([sys.executable, "-m", "zoo.run.allocator", "model=gpt", "run.cpu_allocator=glibc"], cwd=REPO,
                        env=env, capture_output=True, text=True)
    assert (ok.returncode, ok.stdout) == (0, "")
    name, path = allocator.resolve("auto")
    if path is not None:
        auto = subprocess.run([sys.executable, "-m", "zoo.run.allocator"], cwd=REPO, env={**env, "LD_PRELOAD": "/o/a b"},
                              capture_output=True, text=True)
        shell = subprocess.run(["bash", "-c", auto.stdout + 'echo "$LD_PRELOAD|${TCMALLOC_AGGRESSIVE_DECOMMIT:-}"'],
                               env={**env, "LD_PRELOAD": "/o/a b"}, capture_output=True, text=True)
        assert shell.stdout.strip() == f"{path}:/o/a:b|{'t' if name == 'tcmalloc' else ''}", auto.stdout
    bad = subprocess.run([sys.executable, "-m", "zoo.run.allocator", "run.cpu_allocator=ptmalloc3"], cwd=REPO,
                         env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("zoo: error: run.cpu_allocator='ptmalloc3' is unknown") and bad.stderr.count("\n") == 1


def test_validation_refuses_a_bad_allocator_before_anything_starts(libs):
    from tests.unit.config.test_config import check, composed

    check(composed("run.cpu_allocator=auto"))  # glibc here (the fake folder is empty): no refusal
    with pytest.raises(ConfigError) as err:
        check(composed("run.cpu_allocator=jemalloc"))
    assert str(err.value).startswith("run.cpu_allocator=jemalloc: no libjemalloc.so.2 or libjemalloc.so.1 on this "
                                     "machine; install libjemalloc2") and "\n" not in str(err.value)

import os
import subprocess
import sys


def test_deepspeed_builds_no_shm_op_and_probes_no_ops_for_training():
    """DeepSpeed's torch backend asks build_shm_op() at start: after the switch it is None
    (neither built nor loaded) and no op was probed (no gcc run, no gcc lines printed). In a
    fresh interpreter: the probe's table is cached in the module on first access."""
    code = """
import subprocess, deepspeed.ops
ran = []
real = subprocess.Popen
subprocess.Popen = lambda *a, **k: ran.append(a) or real(*a, **k)
from zoo.engine import lean_start
lean_start.skip_shm_comm_op()
from deepspeed.comm.torch import build_shm_op
assert build_shm_op() is None
assert deepspeed.ops.__compatible_ops__ == {"deepspeed_shm_comm": False}, deepspeed.ops.__compatible_ops__
print("ok", len(ran))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "ok 0" and "gcc" not in out.stdout + out.stderr


def test_a_probed_table_keeps_its_other_entries():
    import deepspeed.ops

    from zoo.engine import lean_start

    before = dict(deepspeed.ops.__compatible_ops__)  # probes here
    try:
        lean_start.skip_shm_comm_op()
        after = deepspeed.ops.__compatible_ops__
        assert after["deepspeed_shm_comm"] is False
        assert {k: v for k, v in after.items() if k != "deepspeed_shm_comm"} == \
            {k: v for k, v in before.items() if k != "deepspeed_shm_comm"}
    finally:
        deepspeed.ops.__compatible_ops__.clear()
        deepspeed.ops.__compatible_ops__.update(before)


def test_the_local_launcher_forks_ranks_from_a_server_on_cpu_and_spawns_them_on_cuda(monkeypatch):
    import torch

    from zoo.run import launch

    monkeypatch.delenv(launch.START_METHOD_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch.worker_start_method() == "forkserver"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert launch.worker_start_method() == "spawn"
    monkeypatch.setenv(launch.START_METHOD_ENV, "forkserver")
    assert launch.worker_start_method() == "forkserver"


def test_fork_is_taken_only_by_a_process_with_one_thread():
    """A fresh process forks its ranks; once OpenMP has started its pool (a 2-thread matmul),
    forking would hang the child, so the forkserver is taken."""
    import subprocess
    import sys

    probe = ("from zoo.run import launch; import torch; a = launch._fork_or_forkserver(); torch.set_num_threads(2); "
             "x = torch.randn(512, 512); x @ x; print(a, launch._fork_or_forkserver())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.splitlines()[-1].split() == ["fork", "forkserver"], out.stderr[-2000:]


def test_every_module_the_server_preloads_exists():
    import importlib.util

    from zoo.run import launch

    assert all(importlib.util.find_spec(name) is not None for name in launch.preload(dynamo=True))
    assert "torch._dynamo" not in launch.preload(dynamo=False)


def test_an_unknown_start_method_is_one_line(monkeypatch):
    import pytest

    from zoo.run import launch
    from zoo.run.errors import ConfigError

    monkeypatch.setenv(launch.START_METHOD_ENV, "vfork")
    with pytest.raises(ConfigError, match="ZOO_START_METHOD=vfork is unknown; use spawn, forkserver or fork"):
        launch.worker_start_method()


def test_a_rank_whose_peer_went_away_is_told_apart():
    from zoo.worker import _peer_lost

    assert _peer_lost(RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"))
    assert not _peer_lost(RuntimeError("CUDA out of memory"))


MUON_STEPS = """
import os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
import torch, deepspeed
from zoo.engine import lean_start
lean_start.skip_shm_comm_op()
print("skipped", lean_start.skip_muon_import(eval(sys.argv[2])))
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
for stage in (1, 2, 3):
    cfg = {"train_batch_size": 2, "zero_optimization": {"stage": stage},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)),
                                      config=cfg)
    engine.backward(engine(torch.randn(2, 8)).sum())
    engine.step()
print("inductor", "torch._inductor.compile_fx" in sys.modules)
del engine
from zoo.worker import leave_process_group
leave_process_group()  # while the interpreter is whole (tests/unit/one_rank.py says why)
"""


def test_zero_engines_start_and_step_without_deepspeeds_muon_and_torch_inductor():
    """Every ZeRO stage builds and steps with the stand-ins, and torch._inductor (which the real
    Muon module imports through its torch.compile'd kernels, ~3.7 s) is never imported; a raw
    config that asks for Muon keeps DeepSpeed's own module."""
    import socket

    def run(raw: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", MUON_STEPS, str(port), raw], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert out.returncode == 0, out.stderr[-3000:]
        return [line for line in out.stdout.splitlines() if line.startswith(("skipped", "inductor"))]

    assert run("{}") == ["skipped True", "inductor False"]
    code = "from zoo.engine import lean_start; print(lean_start.skip_muon_import({'optimizer': {'type': 'MuonWithAuxAdam'}}))"
    asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert asked.stdout.strip() == "False", asked.stderr[-2000:]

"""trainer.micro_batch_size=auto: the search, against probes whose peak memory is known.

The probe on a real run measures CUDA's allocator over a real training step (only on a GPU:
benchmarks/gpu_check runs it); here the search is driven by stand-in probes with a known peak
per micro-batch, which is what decides the answer."""
from __future__ import annotations

PROBE_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from zoo.config.schema import register_configs
from zoo.worker import init_distributed, leave_process_group
from zoo.config.validate import resolve_layout
from zoo.parallel.topology import build_grid
from zoo.families.registry import family
from zoo.plan import batch_finder

conf, run_dir, port = sys.argv[1:4]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=port)
register_configs()
with initialize_config_dir(config_dir=conf, version_base=None):
    cfg = OmegaConf.to_object(compose("config", overrides=["debug=fast", "trainer.global_batch_size=16"]))
init_distributed(cfg.parallel, cfg.precision.dtype, cfg.deepspeed)
layout, _ = resolve_layout(cfg, 1)
grid = build_grid(layout)
task = family("gpt").new_task(cfg, torch.device("cpu"), layout)
task.prepare(Path(run_dir), 0)
fed, losses = [], []
micro_batch = task.micro_batch
task.micro_batch = lambda *a, **k: fed.append(micro_batch(*a, **k)[0].shape[0]) or micro_batch(*a, **k)
# CUDA's allocator readings, stood in for: 1 GiB of states plus 0.25 GiB per sample of the
# micro-batch the probe fed last. Everything else is real: engines, steps, the all-reduce.
for name, fn in dict(reset_peak_memory_stats=lambda d: None, empty_cache=lambda: None,
                     synchronize=lambda d: None,
                     max_memory_allocated=lambda d: 2**30 + fed[-1] * 2**28).items():
    setattr(torch.cuda, name, fn)
probe = batch_finder._probe(cfg, layout, grid, task, torch.device("cpu"))
best, trials = batch_finder.search(batch_finder.candidates(16, 1), probe, budget=2.6 * 2**30)
print(json.dumps({"best": best, "tried": [t.micro_batch for t in trials], "fed": fed}))
leave_process_group()
"""


def test_the_probe_trains_real_engines_at_each_size(tmp_path, zoo_cache):
    """The probe's own path on CPU (real DeepSpeed engines built, stepped twice and destroyed
    per size, batches of that size from the task); only the allocator's readings are stood in."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from tests.conftest import REPO

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ZOO_CACHE": str(zoo_cache), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, str(REPO / "conf"), str(tmp_path), str(port)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # 1 GiB + b/4 GiB <= 2.6 GiB: b <= 6.4, so 4 of the divisors 1, 2, 4, 8, 16
    assert out["best"] == 4 and out["tried"] == [1, 2, 4]
    assert out["fed"] == [1, 1, 2, 2, 4, 4]  # two real steps per size

"""The one-rank harness (tests/unit/one_rank.py) leaves its process group while the
interpreter is whole: a script that exited with gloo's groups alive aborted at its teardown
now and then ("terminate called without an active exception", after `ok`: gloo's threads
still held work whose tensors the half-finalized interpreter freed)."""
from __future__ import annotations

import subprocess
import sys

from tests.unit.one_rank import script

ZERO3_THEN_PROBE = """
import atexit
def _probe():  # runs after the harness's epilogue, as the interpreter ends
    import torch.distributed as dist
    print("initialized at exit:", dist.is_initialized(), flush=True)
atexit.register(_probe)
config = {"train_batch_size": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": 3}}
model = tiny_net()
engine = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
three_steps(engine)
print("ok")
"""


def test_a_one_rank_script_has_left_its_process_group_before_the_interpreter_ends():
    out = subprocess.run([sys.executable, "-c", script(ZERO3_THEN_PROBE)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2:] == ["ok", "initialized at exit: False"], lines[-5:]

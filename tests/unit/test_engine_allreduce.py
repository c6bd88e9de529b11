import subprocess
import sys

CODE = """
import os, socket
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
import torch, deepspeed
from zoo import lean_start
from zoo.engine import skip_single_replica_allreduce
lean_start.skip_shm_comm_op(); lean_start.skip_muon_import({})
deepspeed.init_distributed("gloo")

def engine_of(stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=model.parameters())
    return engine

def run(engine, x):
    calls = []
    real = engine.allreduce_gradients
    engine.allreduce_gradients = lambda *a, **k: calls.append(1) or real(*a, **k)
    losses = []
    for _ in range(3):
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses, len(calls)

x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
reference, calls = run(engine_of(0), x)
assert calls == 3, calls
lean = engine_of(0)
assert skip_single_replica_allreduce(lean, dp=1)
losses, calls = run(lean, x)
assert calls == 0, calls
assert losses == reference, (losses, reference)
assert not skip_single_replica_allreduce(engine_of(0), dp=2)
assert not skip_single_replica_allreduce(engine_of(1), dp=1)  # ZeRO's reduction fills its partitions
print("ok")
"""


def test_one_replica_skips_deepspeeds_gradient_allreduce_and_trains_bit_for_bit_the_same():
    """At dp=1, ZeRO-0, fp32 the engine calls no gradient all-reduce (it would flatten, all-reduce
    over one rank and copy back), and three steps give exactly the losses of an engine that does;
    at dp=2 or under ZeRO nothing is switched off."""
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"

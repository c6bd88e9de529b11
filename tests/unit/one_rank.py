"""What a unit test's fresh interpreter runs first to hold a one-rank DeepSpeed process group
(gloo on a free loopback port, as zoo's ranks start: no shm op, no Muon import), with a tiny
net, its batch X and three engine steps on it; and the run of such a script."""
import subprocess
import sys

PROLOGUE = """
import os, socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
import torch, deepspeed
from zoo.engine import lean_start
lean_start.skip_shm_comm_op(); lean_start.skip_muon_import({})
deepspeed.init_distributed("gloo")

def tiny_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))

def three_steps(engine):
    losses = []
    for _ in range(3):
        loss = engine(X).square().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses
"""


def run_one_rank(body: str, timeout: int = 300) -> None:
    """Run PROLOGUE + body in a fresh interpreter; it must exit 0 and print `ok` last."""
    out = subprocess.run([sys.executable, "-c", PROLOGUE + body], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"

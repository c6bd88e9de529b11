"""What a unit test's fresh interpreter runs first to hold a one-rank DeepSpeed process group
(gloo on a free loopback port, as zoo's ranks start: no shm op, no Muon import), with a tiny
net, its batch X and three engine steps on it; and the run of such a script.

The body runs in a namespace of its own that is emptied when it ends, then the process group
is left as a zoo rank leaves it (zoo.worker.leave_process_group: the garbage collected, every
group destroyed). Left to the interpreter's teardown, the engines' autograd graphs and gloo's
pending work were freed after the groups' threads were shut down, and the process aborted
after printing `ok` ("terminate called without an active exception": ZeRO-3 engines, under
the suite's load)."""
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


EPILOGUE = """
from zoo.worker import leave_process_group
_body_globals = dict(globals())
exec(compile(BODY, "<one-rank test body>", "exec"), _body_globals)
_body_globals.clear()
del _body_globals
leave_process_group()
"""


def script(body: str) -> str:
    """The interpreter's whole program: PROLOGUE, `body`, then the process group left."""
    return PROLOGUE + f"BODY = {body!r}\n" + EPILOGUE


def run_one_rank(body: str, timeout: int = 300) -> None:
    """Run PROLOGUE + body in a fresh interpreter; it must exit 0 and print `ok` last."""
    out = subprocess.run([sys.executable, "-c", script(body)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"

"""zoo.engine.half: fp16 on this CPU through DeepSpeed's ZeRO-0 fp16 optimizer trains as fp32
does. DeepSpeed 0.19.8 builds that optimizer with one real AdamW step on zero gradients (a
weight decay applied, Adam's step count one ahead), and its engine.backward does not scale
the loss for it while its step unscales the gradients (so they arrive 2**N too small and
clipping never fires): zoo undoes the first and scales the loss. Measured here before the
fix: the second step's loss 0.496 against fp32's 0.271, and clipping without effect."""
from tests.unit.one_rank import run_one_rank

ZERO0 = """
from zoo.config.schema import Config
from zoo.engine import half, initialize_engine, state
from zoo.parallel.topology import Layout, build_grid

assert half.cpu_computes_fp16() and half.enable_on_cpu()

class Net(torch.nn.Module):  # tiny_net with names a checkpoint tells apart
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)))

def run(dtype, clip):
    cfg = Config()
    cfg.trainer.global_batch_size, cfg.trainer.micro_batch_size = 4, 4
    cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.grad_clip, cfg.optim.weight_decay = 1e-2, 0, clip, 0.1
    cfg.precision.dtype, cfg.precision.initial_scale_power = dtype, 8
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=0)
    engine = initialize_engine(Net(), cfg, layout, build_grid(layout))
    losses, norms = [], []
    for _ in range(6):
        out = engine(X.half() if dtype == "fp16" else X)
        loss = out.float().square().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        norms.append(state.grad_norm(engine))
    return engine, losses, norms

for clip in (0.0, 0.05):
    _, fp32, _ = run("fp32", clip)
    engine, fp16, norms = run("fp16", clip)
    assert type(engine.optimizer).__name__ == "FP16_UnfusedOptimizer"
    assert state.skipped_steps(engine) == 0 and state.scaler_state(engine)["cur_iter"] == 6
    gaps = [abs(a - b) / a for a, b in zip(fp32, fp16)]
    assert max(gaps) < 0.02, (clip, fp32, fp16)  # before the fix: 0.2-0.8 from the second step on
    assert all(0 < n < 10 for n in norms), norms  # unscaled (a scaled norm reads 2**8 times more)

# A checkpoint of that optimizer holds its fp32 masters and their moments (not the fp16
# weights and zeros): a fresh engine loaded from it continues exactly as the saved one does.
import tempfile
from pathlib import Path
from zoo.checkpoint import layout_free
engine, _, _ = run("fp16", 0.05)
grid = build_grid(Layout(tp=1, pp=1, dp=1, zero_stage=0))
saved = layout_free.save(engine, grid, Path(tempfile.mkdtemp()), step=6, consumed=0, meta={"shape": {}}, keep=1)
def three(e):
    out = []
    for _ in range(3):
        loss = e(X.half()).float().square().mean()
        e.backward(loss)
        e.step()
        out.append(loss.item())
    return out
cfg = Config()
cfg.trainer.global_batch_size, cfg.trainer.micro_batch_size = 4, 4
cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.grad_clip, cfg.optim.weight_decay = 1e-2, 0, 0.05, 0.1
cfg.precision.dtype, cfg.precision.initial_scale_power = "fp16", 8
layout = Layout(tp=1, pp=1, dp=1, zero_stage=0)
fresh = initialize_engine(Net(), cfg, layout, build_grid(layout))
layout_free.load(fresh, grid, saved, layout_free.read_state(saved))
assert state.scaler_state(fresh) == state.scaler_state(engine)
assert three(fresh) == three(engine)
print("ok")
"""


def test_zero0_fp16_trains_like_fp32_with_and_without_clipping():
    run_one_rank(ZERO0)

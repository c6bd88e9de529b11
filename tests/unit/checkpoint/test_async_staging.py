"""An asynchronous save copies the parameters' state in its writer thread while the next
forward and backward run; the optimizer's next step waits for that copy. Its files equal a
synchronous save's of the same step, byte for byte, although the step that follows changes
every weight: with the staging copy held back, the step must wait for it (and it does)."""
from tests.unit.one_rank import run_one_rank

ASYNC = """
import tempfile, time
from pathlib import Path
from zoo.checkpoint import layout_free, sharded
from zoo.config.schema import Config
from zoo.engine import initialize_engine
from zoo.parallel.topology import Layout, build_grid

slow = sharded.ShardWrite.stage_state
def held_back(self):  # the copy starts late: the forward and backward of the next step run first
    time.sleep(0.5)
    slow(self)
sharded.ShardWrite.stage_state = held_back

for stage in (0, 1, 3):
    cfg = Config()
    cfg.trainer.global_batch_size, cfg.trainer.micro_batch_size = 4, 4
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=stage)
    grid = build_grid(layout)
    engine = initialize_engine(tiny_net(), cfg, layout, grid)
    three_steps(engine)
    root = Path(tempfile.mkdtemp())
    meta = {"family": "tiny", "shape": {}}
    sync = layout_free.save(engine, grid, root / "sync", step=3, consumed=0, meta=meta, keep=1)
    pending = layout_free.save(engine, grid, root / "async", step=3, consumed=0, meta=meta, keep=1, background=True)
    before = [p.detach().clone() for p in engine.module.parameters()] if stage != 3 else None
    losses = three_steps(engine)  # the optimizer steps while the shard is being staged and written
    assert pending.waited_s > 0.2, (stage, pending.waited_s)
    done = layout_free.finish(pending)
    if before is not None:
        assert all(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters())), stage
    for name in ("shard-00000.safetensors", "index-00000.json", "state.json", "rng.safetensors"):
        assert (sync / name).read_bytes() == (done / name).read_bytes(), (stage, name)
    pending = layout_free.save(engine, grid, root / "async", step=6, consumed=0, meta=meta, keep=1, background=True,
                               staging=pending.staging)
    layout_free.finish(pending)  # no step in between: nothing waits, the hook is spent by the next step
    three_steps(engine)
print("ok")
"""


def test_an_async_save_equals_a_synchronous_one_while_the_next_step_runs():
    run_one_rank(ASYNC)

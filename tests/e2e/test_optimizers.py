"""optim=sgd end to end: SGD with Nesterov momentum through DeepSpeed's optimizer config
trains the CNN, and its momentum buffers go into the layout-free checkpoint, so a run
resumed on another layout (one process -> a 2-stage pipeline, which groups the samples into
micro-batches as one process does: BatchNorm sees the same batches) continues the
uninterrupted run's losses; a checkpoint of the other optimizer is refused in one line."""
from __future__ import annotations

import torch

SGD = ["model=cnn", "optim=sgd", "debug=fast", "logger=none", "trainer.max_steps=6", "trainer.log_every=1",
       "trainer.global_batch_size=16", "trainer.micro_batch_size=4", "optim.warmup_steps=1", "optim.decay_steps=6"]


def test_sgd_with_momentum_resumes_on_another_layout_exactly(run_zoo, tmp_path):
    whole = run_zoo(*SGD)
    losses = whole.losses()
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert whole.summary["final_loss"] == losses[-1]
    run_zoo(*SGD, "trainer.max_steps=3", "checkpoint.every=3", run_dir=tmp_path / "run")
    from zoo.checkpoint.sharded import Index

    kinds = {name.split("/", 1)[0] for name in Index(tmp_path / "run" / "checkpoints" / "step_0000003").shapes}
    assert kinds == {"model", "momentum_buffer"}, kinds
    resumed = run_zoo(*SGD, "parallel=pp", "parallel.num_microbatches=4", "resume=auto", run_dir=tmp_path / "run")
    assert "at step 3" in resumed.stdout
    torch.testing.assert_close(torch.tensor(resumed.losses()), torch.tensor(losses), rtol=1e-5, atol=0)
    refused = run_zoo(*[a for a in SGD if a != "optim=sgd"], "resume=auto", run_dir=tmp_path / "run", check=False)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("zoo: error:")]
    assert refused.returncode == 2 and len(lines) == 1 and "holds optim=sgd's state but this run uses optim=adamw" \
        in lines[0], refused.stderr[-2000:]

"""data.document_mask=true trains the same under pipeline and 3D parallelism (tp with sequence
parallelism) as in one process: the (hidden, positions) pairs the layers pass (zoo.models.documents)
cross the pipeline's stages and the sequence shards unchanged. The unit tests hold the logits
(tests/unit/models/test_document_mask.py); these hold whole runs."""
from __future__ import annotations

import pytest
import torch

COMMON = ["data.document_mask=true", "trainer.max_steps=6", "trainer.global_batch_size=24", "trainer.eval_every=3",
          "trainer.log_every=1", "trainer.sample_tokens=0", "optim.warmup_steps=2"]


@pytest.fixture(scope="module")
def one_process(run_zoo):
    return {family: run_zoo(f"model={family}", "parallel=ddp", "trainer.micro_batch_size=2", *COMMON)
            for family in ("gpt", "llama")}


@pytest.mark.parametrize("family,layout,rtol", [
    ("gpt", ["parallel=pp"], 1e-5),
    ("llama", ["parallel=3d", "parallel.sequence_parallel=true"], 1e-4),
])
def test_document_masked_run_matches_one_process(run_zoo, one_process, family, layout, rtol):
    ref = one_process[family]
    run = run_zoo(f"model={family}", *layout, *COMMON)
    assert run.summary["pp"] == 2
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=rtol, atol=0)
    torch.testing.assert_close(torch.tensor(list(run.evals().values())), torch.tensor(list(ref.evals().values())),
                               rtol=rtol, atol=0)
    assert "document_mask: true" in (run.run_dir / "config.yaml").read_text()
    assert "tokens, attending within documents) to train on" in run.stdout + run.stderr


def test_document_masking_changes_what_a_run_learns(run_zoo, one_process):
    """The mask acts on this corpus: without it the same run's losses differ from the first
    step whose samples hold a document boundary on (about one block in ten here, so a step of
    24 samples may hold none: the six steps are compared)."""
    ref = one_process["gpt"]
    plain = run_zoo("model=gpt", "parallel=ddp", "trainer.micro_batch_size=2",
                    *[a for a in COMMON if not a.startswith("data.document_mask")])
    assert len(plain.losses()) == len(ref.losses()) == 6
    assert max(abs(a - b) for a, b in zip(plain.losses(), ref.losses())) > 1e-4, (plain.losses(), ref.losses())

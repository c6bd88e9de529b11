"""data.eod_mask_loss=true: no target after an end-of-document token, and the loss the mean
over the global batch's counted targets (zoo.parallel.token_weights), so a corpus of short
documents (a boundary every 10-60 tokens: micro-batches count unevenly) trains the same in one
process, under dp2 with gradient accumulation and under pp2; without the weights the
micro-batched runs drift from the reference (checked by hand, see the closing note of #53)."""
from __future__ import annotations

import json
import random

import pytest
import torch

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory):
    from pydoc_data.topics import topics

    words = " ".join(topics.values()).split()
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("eod") / "docs.jsonl"
    with path.open("w") as f:
        at = 0
        for _ in range(3000):
            n = rng.randint(5, 40)
            f.write(json.dumps({"text": " ".join(words[at:at + n])}) + "\n")
            at += n
    return path


def _common(path):
    return ["model=gpt", "data=files", f"data.path={path}", "data.eod_mask_loss=true", "trainer.max_steps=6",
            "trainer.global_batch_size=12", "trainer.log_every=1", "trainer.sample_tokens=0", "optim.warmup_steps=2",
            "trainer.eval_every=3", "logger=none"]


@pytest.fixture(scope="module")
def one_batch(run_zoo, short_documents):
    return run_zoo(*_common(short_documents), "parallel=ddp", "trainer.micro_batch_size=12")


@pytest.mark.parametrize("layout", [["parallel=ddp", "parallel.dp=2", "trainer.micro_batch_size=2"], ["parallel=pp"]],
                         ids=["dp2-accum3", "pp2"])
def test_eod_masked_loss_is_the_global_mean_on_every_layout(run_zoo, short_documents, one_batch, layout):
    run = run_zoo(*_common(short_documents), *layout)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(one_batch.losses()), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(list(run.evals().values())),
                               torch.tensor(list(one_batch.evals().values())), rtol=1e-5, atol=0)
    assert "no target after a document's end) to train on" in run.stdout + run.stderr

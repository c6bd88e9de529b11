"""The end-of-run sample is decoded on the distributed model in place (zoo.parallel.generate:
every rank runs its share, a decode cache, no rank builds the whole model): the same text as
one process on every layout, sampled (temperature 0.8, the same generator) and greedy. The
BERT and CNN accuracies counted in place are compared across layouts in test_families."""
from __future__ import annotations

import pytest

STEPS = ["debug=fast", "logger=none", "trainer.max_steps=3", "trainer.global_batch_size=12", "trainer.sample_tokens=24",
         "trainer.eval_batches=1"]
LAYOUTS = {
    "tp2": ["parallel=tp"],
    "tp2-sequence-parallel": ["parallel=tp", "parallel.sequence_parallel=true"],
    "pp2": ["parallel=pp"],
    "tp2xpp2": ["parallel=3d", "parallel.dp=1"],
    "zero3-dp2": ["parallel=zero3"],
    "zero3-tp2": ["parallel=zero3", "parallel.tp=2", "parallel.dp=1"],
    "pp2-no-final-weights": ["parallel=pp", "checkpoint.save_final=false"],
}


@pytest.fixture(scope="module")
def one_process(run_zoo):
    done = {}

    def run(*extra: str):
        if extra not in done:
            done[extra] = run_zoo("parallel=ddp", *STEPS, *extra)
        return done[extra]

    return run


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gpt_sample_on_a_layout_is_one_process_sample(run_zoo, one_process, name):
    ref = one_process()
    run = run_zoo(*LAYOUTS[name], *STEPS)
    assert run.summary["final_loss"] == pytest.approx(ref.summary["final_loss"], rel=1e-5)
    assert run.summary["sample"] == ref.summary["sample"]
    assert len(ref.summary["sample"]) > len(ref.summary["sample_prompt"]) + 24  # 24 tokens of more than one byte
    assert "zoo: sample (prompt " in run.stdout


@pytest.mark.parametrize("extra", [[], ["data.document_mask=true"]])
def test_llama_greedy_sample_under_tp2_x_pp2(run_zoo, one_process, extra):
    """Llama's grouped-query heads and rotary angles in the cache; with document masking the
    stages pass (hidden, positions) and every step runs the whole context (no cache)."""
    greedy = ["model=llama", "trainer.sample_temperature=0", *extra]
    ref = one_process(*greedy)
    run = run_zoo("parallel=3d", "parallel.dp=1", *STEPS, *greedy)
    assert (run.summary["tp"], run.summary["pp"]) == (2, 2)
    assert run.summary["sample"] == ref.summary["sample"]
    assert len(set(ref.summary["sample"][len(ref.summary["sample_prompt"]):].split())) > 1  # not one token repeated

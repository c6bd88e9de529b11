"""model=llama end to end: 10-step runs under tp, pp and 3d against one process, and the
Hugging Face round trip (a random LlamaForCausalLM with grouped-query attention imported
under 3d, evaluated, exported: bitwise the same weights, transformers' logits unchanged;
trained 3 steps under 3d and exported: transformers gives zoo's logits)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.test_hf import export
from zoo.checkpoint.final import load_run_weights

pytestmark = pytest.mark.e2e

STEPS = ["model=llama", "trainer.log_every=1", "trainer.eval_batches=1", "trainer.sample_tokens=0",
         "optim.warmup_steps=2", "trainer.max_steps=10", "trainer.global_batch_size=24", "logger=none"]


@pytest.fixture(scope="module")
def single_process(run_zoo):
    return run_zoo("parallel=ddp", "trainer.micro_batch_size=4", *STEPS)


@pytest.mark.parametrize("layout, rtol", [(["parallel=tp", "trainer.micro_batch_size=4"], 1e-5),
                                          (["parallel=tp", "trainer.micro_batch_size=4",
                                            "parallel.sequence_parallel=true"], 1e-5),
                                          (["parallel=pp"], 1e-5), (["parallel=3d"], 1e-4),
                                          (["parallel=zero1", "trainer.micro_batch_size=4"], 1e-5),
                                          (["parallel=zero2", "trainer.micro_batch_size=4"], 1e-5),
                                          (["parallel=zero3", "trainer.micro_batch_size=4"], 1e-5)],
                         ids=["tp2", "tp2-sp", "pp2", "3d", "zero1", "zero2", "zero3"])
def test_layout_matches_one_process_over_10_steps(run_zoo, single_process, layout, rtol):
    run = run_zoo(*STEPS, *layout)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(single_process.losses()), rtol=rtol, atol=0)


def save_random_llama(out, seed: int, **config):
    """A randomly initialised LlamaForCausalLM of the tiny Llama's dimensions saved to `out`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dims = dict(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**{**dims, **config})).save_pretrained(str(out), safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def random_hf_llama(tmp_path_factory):
    return save_random_llama(tmp_path_factory.mktemp("hf_llama") / "model", seed=0)


def _hf_logits(directory, ids):
    from transformers import LlamaForCausalLM

    with torch.no_grad():
        return LlamaForCausalLM.from_pretrained(str(directory)).eval()(ids).logits


def test_import_under_3d_then_export_is_bitwise_and_transformers_agrees(run_zoo, random_hf_llama, tmp_path):
    run = run_zoo("model=llama", "parallel=3d", "parallel.num_microbatches=2", "parallel.dp=1",
                  "trainer.global_batch_size=8", "trainer.max_steps=0", "trainer.sample_tokens=0",
                  "trainer.eval_batches=1", "logger=none", f"model.init_from={random_hf_llama}",
                  run_dir=tmp_path / "imported")
    assert run.summary["steps"] == 0 and (run.summary["tp"], run.summary["pp"]) == (2, 2)
    again = export(run.run_dir / "checkpoints" / "step_0000000", tmp_path / "again")
    a, b = load_file(str(random_hf_llama / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_hf_logits(again, ids), _hf_logits(random_hf_llama, ids), rtol=0, atol=0)
    config = json.loads((again / "config.json").read_text())
    assert (config["model_type"], config["num_key_value_heads"]) == ("llama", 2)


def test_trained_under_3d_and_exported_transformers_gives_zoos_logits(run_zoo, tmp_path):
    from zoo.checkpoint.weights import load_plain
    from zoo.models.llama import LlamaForCausalLM, LlamaShape

    run = run_zoo("model=llama", "parallel=3d", "parallel.num_microbatches=2", "parallel.dp=1",
                  "trainer.global_batch_size=8", "trainer.max_steps=3", "checkpoint.every=3",
                  "trainer.sample_tokens=0", "trainer.eval_batches=1", "logger=none", run_dir=tmp_path / "run")
    out = export(run.run_dir, tmp_path / "hf")
    meta = json.loads((run.run_dir / "checkpoints" / "step_0000003" / "state.json").read_text())["shape"]
    ours = LlamaForCausalLM(LlamaShape(**meta)).eval()
    load_plain(ours, load_run_weights(run.run_dir))
    ids = torch.randint(0, meta["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(out, ids), ours(ids), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def random_hf_tied_mqa(tmp_path_factory):
    """A LlamaForCausalLM as SmolLM builds it (tied embeddings), with one key/value head."""
    return save_random_llama(tmp_path_factory.mktemp("hf_llama_tied") / "model", seed=1, num_key_value_heads=1,
                             tie_word_embeddings=True)


def test_a_tied_multi_query_import_trains_under_tp_x_pp_as_one_process_and_exports_tied(run_zoo, random_hf_tied_mqa,
                                                                                        tmp_path):
    """tp=2 cannot split the one key/value head (replicated, validation says so); the tied head
    lives on the last stage with its own copy of the embedding. 10 steps equal one process's,
    and the export stays tied: transformers gives zoo's logits."""
    from zoo.checkpoint.weights import load_plain
    from zoo.models.llama import LlamaForCausalLM, LlamaShape

    init = f"model.init_from={random_hf_tied_mqa}"
    ref = run_zoo(*STEPS, "parallel=ddp", "trainer.micro_batch_size=4", init, run_dir=tmp_path / "ref")
    run = run_zoo(*STEPS, "parallel=3d", "parallel.dp=1", init, "checkpoint.every=10", run_dir=tmp_path / "run")
    assert (run.summary["tp"], run.summary["pp"]) == (2, 2)
    assert "does not divide model.n_kv_head=1: every rank holds all 1 key/value heads' projections" in run.stderr
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=1e-4, atol=0)
    out = export(run.run_dir, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["num_key_value_heads"]) == (True, 1)
    assert "lm_head.weight" not in load_file(str(out / "model.safetensors"))
    meta = json.loads((run.run_dir / "checkpoints" / "step_0000010" / "state.json").read_text())["shape"]
    ours = LlamaForCausalLM(LlamaShape(**meta)).eval()
    load_plain(ours, load_run_weights(run.run_dir))
    ids = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(out, ids), ours(ids), rtol=1e-4, atol=1e-4)


def test_a_tied_import_under_zero3_is_built_piece_by_piece_and_trains_as_one_process(run_zoo, random_hf_tied_mqa,
                                                                                    tmp_path):
    """ZeRO-3 builds Llama a block at a time (its body sits in a wrapper, `model`, which the
    partitioned build took whole before), fills each piece from the import, and the tied head
    takes the partitioned embedding: 10 steps equal one process's."""
    init = f"model.init_from={random_hf_tied_mqa}"
    ref = run_zoo(*STEPS, "parallel=ddp", "trainer.micro_batch_size=4", init, run_dir=tmp_path / "ref")
    run = run_zoo(*STEPS, "parallel=zero3", "trainer.micro_batch_size=2", init, run_dir=tmp_path / "run")
    assert (run.summary["dp"], run.summary["zero_stage"]) == (2, 3)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(ref.losses()), rtol=1e-4, atol=0)

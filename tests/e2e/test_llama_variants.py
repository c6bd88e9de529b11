"""Qwen2, Qwen3 and Mistral in and out end to end: a random transformers model of each saved
to a directory, imported under 3d (tp2 x pp2), trained and exported: its config's model type
and pieces kept, and transformers' own class gives zoo's logits; a Qwen3 under 3d, ZeRO-3 and
tp2 with sequence parallelism trains as one process."""
from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.test_hf import export
from zoo.checkpoint.final import load_run_weights

pytestmark = pytest.mark.e2e

DIMS = dict(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
KINDS = {"qwen2": dict(tie_word_embeddings=True), "qwen3": dict(tie_word_embeddings=True, head_dim=64),
         "mistral": dict(tie_word_embeddings=False, sliding_window=64)}  # shorter than the block: built
IMPORT = ["model=llama", "parallel=3d", "parallel.num_microbatches=2", "parallel.dp=1", "trainer.global_batch_size=8",
          "trainer.sample_tokens=0", "trainer.eval_batches=1", "logger=none"]


def save_random(out, kind: str, seed: int = 0):
    import transformers

    from zoo.families.llama.hf import CLASSES, CONFIGS

    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[kind])(getattr(transformers, CONFIGS[kind])(**DIMS, **KINDS[kind]))
    with torch.no_grad():  # biases zero and norms one as initialised: random, so that losing one shows
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def zoo_logits_equal_transformers(run, out, kind: str, step: int) -> dict:
    """The export `out` of `run` loads as `kind`'s transformers class, whose logits are those of
    zoo's model on the run's final weights; returns the checkpoint's shape fields."""
    import transformers

    from zoo.checkpoint.weights import load_plain
    from zoo.families.llama.hf import CLASSES
    from zoo.models.llama import LlamaForCausalLM, LlamaShape

    meta = json.loads((run.run_dir / "checkpoints" / f"step_{step:07d}" / "state.json").read_text())["shape"]
    ours = LlamaForCausalLM(LlamaShape(**meta)).eval()
    load_plain(ours, load_run_weights(run.run_dir))
    ids = torch.randint(0, 4096, (2, 100), generator=torch.Generator().manual_seed(1))  # past the window
    with torch.no_grad():
        theirs = getattr(transformers, CLASSES[kind]).from_pretrained(str(out)).eval()(ids).logits
        torch.testing.assert_close(theirs, ours(ids), rtol=1e-5, atol=1e-5)
    return meta


@pytest.mark.parametrize("kind", ["qwen2", "mistral"])
def test_imported_and_trained_under_3d_then_exported_as_its_own_type(run_zoo, tmp_path, kind):
    """Imported under tp2 x pp2, trained 2 steps, exported: the same model type, window and
    heads in its config, and transformers gives zoo's logits."""
    source = save_random(tmp_path / "source", kind)
    run = run_zoo(*IMPORT, "trainer.max_steps=2", "checkpoint.every=2", f"model.init_from={source}",
                  run_dir=tmp_path / "run")
    assert (run.summary["tp"], run.summary["pp"]) == (2, 2)
    out = export(run.run_dir, tmp_path / "hf")
    before, after = (json.loads((d / "config.json").read_text()) for d in (source, out))
    for key in ("model_type", "architectures", "tie_word_embeddings", "sliding_window", "num_key_value_heads"):
        assert after.get(key) == before.get(key), key
    meta = zoo_logits_equal_transformers(run, out, kind, 2)
    assert meta["attention_bias"] == (kind == "qwen2") and meta["arch"] == kind


STEPS = ["trainer.max_steps=5", "trainer.log_every=1", "optim.warmup_steps=2"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return f"model.init_from={save_random(tmp_path_factory.mktemp('qwen3') / 'source', 'qwen3')}"


@pytest.fixture(scope="module")
def qwen3_one_process(run_zoo, qwen3):
    return run_zoo(*IMPORT, "parallel=ddp", "parallel.dp=1", "trainer.micro_batch_size=4", qwen3, *STEPS)


@pytest.mark.parametrize("layout", [["parallel=zero1", "parallel.dp=2", "trainer.micro_batch_size=2"],
                                    ["parallel=zero2", "parallel.dp=2", "trainer.micro_batch_size=2"],
                                    ["parallel=zero3", "parallel.dp=2", "trainer.micro_batch_size=2"],
                                    ["parallel=tp", "parallel.sequence_parallel=true", "trainer.micro_batch_size=4"],
                                    ["parallel=cp", "trainer.micro_batch_size=4"]],
                         ids=["zero1", "zero2", "zero3", "tp2-sp", "cp2"])
def test_a_qwen3_import_trains_as_one_process(run_zoo, qwen3, qwen3_one_process, layout):
    """ZeRO-1 and 2 partition the q/k norms' states and gradients with the rest; ZeRO-3 builds
    them piece by piece with their layer; tp2 with sequence parallelism sums their gradients
    over the group as it does the sequence-parallel norms'; cp2 splits the sequence with the
    norms and wider heads in place."""
    run = run_zoo(*IMPORT, qwen3, *STEPS, *layout)
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(qwen3_one_process.losses()), rtol=1e-5, atol=0)


def test_a_mistral_import_with_its_window_trains_under_cp4_as_one_process(run_zoo, tmp_path):
    """The window (64 of 128 tokens) cut into each cp rank's chunk masks, the documents too."""
    source = f"model.init_from={save_random(tmp_path / 'source', 'mistral')}"
    one = run_zoo(*IMPORT, "parallel=ddp", "parallel.dp=1", "trainer.micro_batch_size=4", source, *STEPS,
                  "data.document_mask=true")
    run = run_zoo(*IMPORT, source, *STEPS, "parallel=cp", "parallel.cp=4", "trainer.micro_batch_size=4",
                  "data.document_mask=true")
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(one.losses()), rtol=1e-5, atol=0)


def test_a_qwen3_trained_under_3d_equals_one_process_and_transformers_gives_zoos_logits(run_zoo, tmp_path, qwen3,
                                                                                       qwen3_one_process):
    run = run_zoo(*IMPORT, qwen3, *STEPS, "checkpoint.every=5", run_dir=tmp_path / "run")
    torch.testing.assert_close(torch.tensor(run.losses()), torch.tensor(qwen3_one_process.losses()), rtol=1e-5, atol=0)
    meta = zoo_logits_equal_transformers(run, export(run.run_dir, tmp_path / "hf"), "qwen3", 5)
    assert (meta["arch"], meta["qk_norm"], meta["head_size"]) == ("qwen3", True, 64)

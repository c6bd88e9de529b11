"""The Hugging Face round trip: export from any layout, then transformers; import into
any layout, evaluate and checkpoint (trainer.max_steps=0), then export again."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tests.conftest import REPO
from tests.e2e.conftest import HF_FAST as FAST
from zoo.checkpoint.final import load_run_weights
from zoo.families.registry import family_of_shape as spec_of


def export(src, out, *flags):
    proc = subprocess.run([sys.executable, "-m", "zoo.export", str(src), str(out), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("source", ["run_dir", "checkpoint"])
def test_export_from_3d_then_transformers_logits_match(trained_3d, tmp_path, source):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    from zoo.checkpoint.weights import load_plain
    from zoo.models.gpt import GPT, GPTShape

    src = trained_3d.run_dir if source == "run_dir" else trained_3d.run_dir / "checkpoints" / "step_0000003"
    out = export(src, tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    meta = json.loads((trained_3d.run_dir / "checkpoints" / "step_0000003" / "state.json").read_text())["shape"]
    zoo_model = GPT(GPTShape(**meta)).eval()
    load_plain(zoo_model, load_run_weights(trained_3d.run_dir))
    ids = torch.tensor([tok("for x in range(10): print(x)")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, zoo_model(ids), rtol=1e-5, atol=1e-5)


def test_import_evaluate_checkpoint_and_export_again(run_zoo, trained_3d, tmp_path):
    original = export(trained_3d.run_dir, tmp_path / "original")
    run_dir = tmp_path / "imported"
    # The same held-out samples as the 3D run (micro-batches of 8 / 2 = 4, 2 rounds).
    run = run_zoo(*FAST, "parallel=tp", "trainer.micro_batch_size=4", f"model.init_from={original}",
                  "trainer.max_steps=0", run_dir=run_dir)
    s = run.summary
    assert s["steps"] == 0 and s["tp"] == 2
    assert s["eval_loss"] == pytest.approx(trained_3d.summary["eval_loss"], rel=1e-5)
    assert (run_dir / "checkpoints" / "step_0000000" / "state.json").exists()
    again = export(run_dir / "checkpoints" / "step_0000000", tmp_path / "again")
    a, b = load_file(str(original / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_imported_model_trained_then_exported_ships_the_trained_weights(run_zoo, trained_3d, tmp_path):
    """model.init_from=DIR of a whole transformers directory (weights and tokenizer): the run keeps
    only the tokenizer's files, and its export holds the run's weights, not the starting ones."""
    from transformers import GPT2LMHeadModel

    from zoo.checkpoint.weights import load_plain
    from zoo.models.gpt import GPT, GPTShape

    source = export(trained_3d.run_dir, tmp_path / "source")
    run = run_zoo(*FAST, "parallel=tp", "trainer.micro_batch_size=4", f"model.init_from={source}",
                  "trainer.max_steps=3", "optim.warmup_steps=1", run_dir=tmp_path / "run")  # steps 1-2 at lr 0
    kept = sorted(p.name for p in (run.run_dir / "tokenizer").iterdir())
    assert "model.safetensors" not in kept and "config.json" not in kept and "tokenizer.json" in kept, kept
    recorded = yaml.safe_load((run.run_dir / "config.yaml").read_text())  # the imported tokenizer's vocabulary
    assert "vocab_size" not in recorded["data"] and recorded["data"]["name"] == "pydoc", recorded["data"]
    out = export(run.run_dir, tmp_path / "hf")
    started, shipped = load_file(str(source / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert not torch.equal(started["transformer.h.0.attn.c_attn.weight"], shipped["transformer.h.0.attn.c_attn.weight"])
    from safetensors import safe_open

    with safe_open(str(run.run_dir / "model.safetensors"), framework="pt") as fh:
        meta = json.loads(fh.metadata()["shape"])
    ours = GPT(GPTShape(**meta)).eval()
    load_plain(ours, load_run_weights(run.run_dir))  # the run's final weights
    ids = torch.randint(0, meta["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(GPT2LMHeadModel.from_pretrained(str(out)).eval()(ids).logits, ours(ids),
                                   rtol=1e-5, atol=1e-5)


def test_a_sharded_bf16_export_of_a_checkpoint_loads_in_transformers(trained_3d, tmp_path):
    """Written tensor by tensor into transformers' sharded layout (files of at most 200 kB)."""
    from transformers import GPT2LMHeadModel

    out = export(trained_3d.run_dir / "checkpoints" / "step_0000003", tmp_path / "hf", "--dtype", "bf16",
                 "--max-shard-size", "200kB")
    files = sorted(f.name for f in out.glob("model*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    whole = export(trained_3d.run_dir / "checkpoints" / "step_0000003", tmp_path / "whole")
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        sharded = GPT2LMHeadModel.from_pretrained(str(out), torch_dtype=torch.bfloat16).eval()
        assert next(sharded.parameters()).dtype == torch.bfloat16
        torch.testing.assert_close(sharded(ids).logits.float(), GPT2LMHeadModel.from_pretrained(str(whole))(ids).logits,
                                   rtol=0.05, atol=0.1)


@pytest.mark.parametrize("flags, says", [([], "no checkpoint"), (["--max-shard-size", "0"], "must be positive"),
                                         (["--max-shard-size", "lots"], "give a size such as 5GB")])
def test_export_errors_are_one_line(tmp_path, flags, says):
    proc = subprocess.run([sys.executable, "-m", "zoo.export", str(tmp_path), str(tmp_path / "out"), *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "zoo.export: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bert_export_then_transformers_logits_match(run_zoo, tmp_path):
    from transformers import AutoTokenizer, BertForMaskedLM

    from zoo.checkpoint.weights import load_plain
    from zoo.models.bert import BertShape
    from zoo.parallel.build import build_model

    run = run_zoo("model=bert", "debug=fast", "parallel=tp", "trainer.max_steps=2", "checkpoint.every=2")
    out = export(run.run_dir, tmp_path / "bert_hf")
    hf = BertForMaskedLM.from_pretrained(str(out)).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    meta = json.loads((run.run_dir / "checkpoints" / "step_0000002" / "state.json").read_text())["shape"]
    ours = build_model(spec_of(BertShape(**meta, pad_token_id=tok.pad_token_id)), BertShape(**meta, pad_token_id=tok.pad_token_id), seed=0, device=torch.device("cpu")).eval()
    load_plain(ours, load_run_weights(run.run_dir))
    enc = tok("the for statement is used to iterate", "over the elements of a sequence", return_tensors="pt")
    with torch.no_grad():
        expected = hf(**enc).logits
        got = ours(torch.stack([enc["input_ids"], enc["token_type_ids"]], dim=1))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bert_import_into_pp_then_export_again(run_zoo, tmp_path):
    run = run_zoo("model=bert", "debug=fast", "trainer.max_steps=2", "checkpoint.every=2")
    original = export(run.run_dir, tmp_path / "bert_original")
    imported = run_zoo("model=bert", "debug=fast", "parallel=pp", "parallel.num_microbatches=4",
                       f"model.init_from={original}",
                       "trainer.max_steps=0", run_dir=tmp_path / "bert_imported")
    assert imported.summary["steps"] == 0 and imported.summary["pp"] == 2
    again = export(imported.run_dir / "checkpoints" / "step_0000000", tmp_path / "bert_again")
    a, b = load_file(str(original / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_a_vocabulary_tp_cannot_split_is_padded_inside_and_exported_as_it_was(run_zoo, tmp_path, kind):
    """A transformers model of 4097 tokens (odd: tp=2 cannot split its rows) imports under tp=2
    without padding by hand (zoo pads it to 4224 and masks the pad), trains 2 steps and exports
    with 4097 tokens again; transformers' loss of the export equals zoo's on the same tokens."""
    from transformers import AutoModelForCausalLM

    from tests.unit.models.test_vocab_padding import save_hf
    from zoo.families.registry import family

    save_hf(kind, tmp_path / "original", vocab=4097)
    run = run_zoo(*FAST, f"model={kind}", "parallel=tp", "trainer.micro_batch_size=4", "trainer.max_steps=2",
                  "checkpoint.every=2", f"model.init_from={tmp_path / 'original'}", run_dir=tmp_path / "run")
    meta = json.loads((run.run_dir / "checkpoints" / "step_0000002" / "state.json").read_text())["shape"]
    assert (meta["vocab_size"], meta["vocab_real"], run.summary["tp"]) == (4224, 4097, 2)
    out = export(run.run_dir, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 4097
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    spec = family(kind)
    ours = spec.model(spec.shape_type(**meta)).eval()
    from zoo.checkpoint.weights import load_plain

    load_plain(ours, load_run_weights(run.run_dir))
    ids = torch.randint(0, 4097, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids[:, :-1], ids[:, 1:]), hf(ids, labels=ids).loss, rtol=1e-5, atol=1e-5)

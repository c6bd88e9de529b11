"""The data keys a run does not read are left out of its recorded config (config.yaml, wandb),
per family and source: #33 item 10."""
from __future__ import annotations

import dataclasses

from zoo.config.schema import Config, DataConfig, recorded
from zoo.families.data_keys import unread
from zoo.families.registry import family


def test_each_source_keeps_only_the_keys_it_reads():
    gpt, bert, cnn = (family(name).data_keys for name in ("gpt", "bert", "cnn"))
    assert set(unread(DataConfig(name="pydoc"), gpt)) == {"path", "text_column", "mlm_probability", "image_size",
                                                          "image_column", "label_column", "train_on", "chat_template",
                                                          "packing", "truncate"}
    assert not {"train_on", "chat_template", "packing", "truncate", "path", "tokenizer"} & set(
        unread(DataConfig(name="chat", path="c.jsonl"), gpt))
    assert "path" not in unread(DataConfig(name="files", path="c.jsonl"), gpt)
    assert set(unread(DataConfig(name="prepared", path="d"), gpt)) >= {"tokenizer", "vocab_size", "num_proc"}
    assert "mlm_probability" not in unread(DataConfig(name="pydoc"), bert)
    assert "num_proc" in unread(DataConfig(name="pydoc"), bert)  # sentence pairs are built in one process
    assert set(unread(DataConfig(name="digits"), cnn)) >= {"vocab_size", "tokenizer", "path", "image_size"}
    assert "image_column" not in unread(DataConfig(name="hub", path="x"), cnn)


def test_a_tokenizer_that_brings_its_vocabulary_drops_vocab_size(tmp_path):
    gpt = family("gpt").data_keys
    assert "vocab_size" not in unread(DataConfig(name="pydoc"), gpt)
    assert "vocab_size" in unread(DataConfig(name="pydoc", tokenizer=str(tmp_path)), gpt)
    assert "vocab_size" not in unread(DataConfig(name="pydoc"), gpt, init_from=str(tmp_path))  # weights only
    (tmp_path / "tokenizer.json").write_text("{}")
    assert "vocab_size" in unread(DataConfig(name="pydoc"), gpt, init_from=str(tmp_path))


def test_a_mixture_reads_the_keys_of_its_entries_and_not_data_path():
    mix = DataConfig(name="pydoc", mix=[{"name": "files", "path": "a.jsonl", "weight": 1.0}])
    out = unread(mix, family("gpt").data_keys)
    assert "path" in out and "text_column" not in out


def test_the_recorded_config_leaves_the_unread_keys_out():
    cfg = dataclasses.replace(Config(), data=DataConfig(name="pydoc", tokenizer="tok"))
    out = recorded(cfg, None, ("vocab_size", "path"))
    assert "vocab_size" not in out["data"] and "path" not in out["data"] and out["data"]["tokenizer"] == "tok"
    assert out["model"] == recorded(cfg, None)["model"]

"""Every config group option composes against the typed schemas; bad input fails at
composition or validation time with one message naming the key, and exit code 2."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import REPO
from zoo.config.schema import Config, ModelConfig, register_configs
from zoo.config.validate import ConfigError, resolve_layout, validate
from zoo.engine import deepspeed_config
from zoo.parallel.topology import Layout

CONF = REPO / "conf"
register_configs()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def composed(*overrides: str) -> Config:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_object(compose(config_name="config", overrides=list(overrides)))


@pytest.mark.parametrize("group", ["model", "parallel", "data", "optim", "precision", "logger", "experiment", "debug"])
def test_every_group_option_composes(group):
    assert options(group), f"conf/{group} has no options"
    for option in options(group):
        cfg = composed(f"{group}={option}")
        assert isinstance(cfg, Config)


def test_defaults_are_the_main_job():
    cfg = composed()
    assert (cfg.model.family, cfg.model.size, cfg.parallel.zero_stage, cfg.precision.dtype) == ("gpt", "tiny", 0, "fp32")


def test_each_family_brings_its_data_and_the_command_line_wins():
    assert (composed("model=cnn").data.name, composed("model=bert").data.name) == ("digits", "pydoc")
    cfg = composed("model=cnn", "data=files", "data.path=/images", "optim.lr=0.01")
    assert (cfg.data.name, cfg.data.path, cfg.optim.lr) == ("files", "/images", 0.01)


def test_cnn_warns_about_what_it_ignores():
    warnings = check(composed("model=cnn", "model.n_head=4", "trainer.sample_tokens=8"))
    assert any("model.n_head=4 is ignored" in w for w in warnings)
    assert any("trainer.sample_tokens=8 is ignored" in w for w in warnings)


def test_misspelled_key_names_the_key():
    with pytest.raises(Exception, match="max_step"):
        composed("trainer.max_step=5")


def test_wrong_type_names_the_key():
    with pytest.raises(Exception, match="max_steps"):
        composed("trainer.max_steps=lots")


def test_micro_batch_size_is_a_number_or_auto():
    """micro_batch_size is the one int-or-"auto" key: checked by validation, before any process group."""
    with pytest.raises(ConfigError, match=r"trainer.micro_batch_size='lots' must be positive \(an integer, or auto\)"):
        check(composed("trainer.micro_batch_size=lots"))
    with pytest.raises(ConfigError, match="measures the peak memory of real training steps on a CUDA device"):
        check(composed("trainer.micro_batch_size=auto"), cuda=False)
    with pytest.raises(ConfigError, match="set parallel.num_microbatches"):
        check(composed("parallel=pp", "trainer.micro_batch_size=auto"), cuda=True)
    with pytest.raises(ConfigError, match="global_batch_size=33 is not divisible by dp\\(2\\)"):
        check(composed("parallel=zero1", "trainer.micro_batch_size=auto", "trainer.global_batch_size=33"), cuda=True)
    check(composed("parallel=zero1", "trainer.micro_batch_size=auto"), cuda=True)  # any global batch divisible by dp


def check(cfg: Config, world=None, cuda=False):
    layout, _ = resolve_layout(cfg, world)
    return validate(cfg, layout, cuda_available=cuda)


@pytest.mark.parametrize("overrides, message", [
    (["trainer.global_batch_size=30", "trainer.micro_batch_size=4"],
     r"trainer.global_batch_size=30 is not divisible by trainer.micro_batch_size\(4\) \* dp\(1\) = 4"),
    (["parallel=zero2", "trainer.global_batch_size=12", "trainer.micro_batch_size=4"], r"\* dp\(2\) = 8"),
    (["precision.hysteresis=3"], r"precision.hysteresis=3 sets fp16's loss scaler, but precision.dtype=fp32 has "
                                 r"none \(it does nothing\); use precision=fp16, or drop precision.hysteresis"),
    (["precision=bf16", "precision.loss_scale=128"], r"precision.loss_scale=128.0 sets fp16's loss scaler, but "
                                                     r"precision.dtype=bf16"),
    (["precision=fp16", "precision.hysteresis=4"], r"precision.hysteresis=4 does nothing at parallel.zero_stage=0 "
                                                   r".*use parallel.zero_stage=1 or more"),
    (["precision=fp16", "precision.min_loss_scale=512", "precision.initial_scale_power=8"],
     r"precision.min_loss_scale=512 is above the first loss scale 2\*\*precision.initial_scale_power=256"),
    (["precision=fp16", "parallel=pp", "parallel.zero_stage=0"], r"precision=fp16 with parallel.pp=2 at "
                                                                  r"parallel.zero_stage=0: .*set parallel.zero_stage=1"),
    (["precision=fp16", "precision.loss_scale=-1"], r"precision.loss_scale=-1.0 must be >= 0 \(0: dynamic"),
    (["precision=fp16", "precision.initial_scale_power=40"], r"precision.initial_scale_power=40 must be in \[0, 32\]"),
    (["precision=fp16", "precision.loss_scale_window=0"], r"precision.loss_scale_window=0 must be positive"),
    (["trainer.micro_batch_size=0"], r"trainer.micro_batch_size=0 must be positive"),
    (["model.n_layer=-1"], r"model.n_layer=-1 must be positive"),
    (["model.size=huge"], r"model.size='huge' is not a GPT size"),
    (["parallel.tp=3"], r"parallel.tp=3 does not divide model.n_head \(4\)"),
    (["parallel.pp=9"], r"parallel.pp=9 is more than the 4 layers"),
    (["parallel.pp=2", "parallel.zero_stage=2"], r"supports ZeRO stage 0 or 1 only; set parallel.zero_stage=1"),
    # The other families: what each refuses, and why.
    (["model=cnn", "parallel=tp"], r"parallel.tp=2 with model.family=cnn: .* data parallelism is the right tool"),
    (["model=cnn", "parallel=3d"], r"parallel.tp=2 with model.family=cnn"),
    (["model=bert", "parallel=tp", "parallel.sequence_parallel=true"], r"implemented for model.family in \['gpt', 'llama'\] only"),
    (["model=cnn", "data=pydoc"], r"data.name='pydoc' does not fit model.family=cnn, which reads images"),
    (["model=bert", "data=digits"], r"data.name='digits' does not fit model.family=bert, which reads text"),
    (["model=cnn", "data=files"], r"data.name=files needs data.path"),
    (["model=bert", "model.size=base", "parallel.tp=5"], r"parallel.tp=5 does not divide model.n_head \(12\)"),
    (["model=cnn", "parallel.pp=4", "parallel.zero_stage=1"], r"parallel.pp=4 is more than the 3 residual blocks"),
    (["model=bert", "model.size=huge"], r"model.size='huge' is not a BERT size"),
    (["model=cnn", "model.activation_checkpointing=true"], r"would update its BatchNorm running statistics"),
    # Windows zoo does not build: Qwen's per-layer ones.
    (["model=qwen2", "model.sliding_window=64"], r"model.sliding_window=64 is shorter than model.block_size=128: a "
                                                 r"qwen2 window applies to some layers only"),
    (["model=qwen3", "model.head_dim=33"], r"model.head_dim=33: rotary embeddings need an even head size"),
    (["model=gpt", "model.qk_norm=true"], r"model.qk_norm=True: model.family=gpt has no such setting"),
    # A data key the chosen source would ignore (#33 item 3), naming the sources that read it.
    (["model=llama", "data.path=my_corpus.jsonl"], r"data.path='my_corpus.jsonl' is read by "
                                                   r"data=files\|data=hub\|data=prepared\|data=chat; you chose data=pydoc"),
    (["model=cnn", "data.path=imgs"], r"data.path='imgs' is read by data=files\|data=hub; you chose data=digits"),
    (["model=cnn", "data=files", "data.path=imgs", "data.image_column=img"],
     r"data.image_column='img' is read by data=hub; you chose data=files"),
    (["model=cnn", "data.vocab_size=1000"], r"data.vocab_size=1000 is read by no data source of model.family=cnn"),
    (["data.image_size=8"], r"data.image_size=8 is read by no data source of model.family=gpt"),
    (["model=bert", "data.num_proc=2"], r"data.num_proc=2 is read by no data source of model.family=bert"),
    (["data.mlm_probability=0.3"], r"data.mlm_probability=0.3 is read by no data source of model.family=gpt"),
    (["model=bert", "data.document_mask=true"], r"data.document_mask=True is read by no data source of "
                                                r"model.family=bert .*: attention within each document is for the "
                                                r"causal language models \(model=gpt, model=llama\).*; drop "
                                                r"data.document_mask"),
    (["model=cnn", "data.document_mask=true"], r"data.document_mask=True is read by no data source of "
                                               r"model.family=cnn"),
    (["data=prepared", "data.path=p", "data.text_column=body"], r"data.text_column='body' is read by "
                                                                 r"data=files\|data=hub; you chose data=prepared"),
    (["data.mix=[{name: pydoc}]", "data.path=a.txt"], r"data.path='a.txt' is not read with data.mix"),
    (["model=bert", "data.mix=[{name: prepared, path: p}]"], r"data.mix entry \{'name': 'prepared', 'path': 'p'\} "
                                                            r"needs name: pydoc, files, hub \(and path, weight\) for "
                                                            r"model.family=bert"),
    (["data.mix=[{name: pydoc, weight: 0}]"], r"weight=0 must be a positive number \(its share of the mixture\)"),
    (["data.mix=[{name: pydoc, weight: lots}]"], r"weight='lots' must be a positive number"),
    (["data.mix=[{name: files}]"], r"data.mix entry \{'name': 'files'\} needs a path: a file"),
    (["model.init_from=/x", "data.mix=[{name: prepared, path: p}]"], r"model.init_from=/x with a prepared "
                                                                     r"directory in data.mix"),
    (["data.tokenizer=tok", "data.vocab_size=1000"], r"data.vocab_size=1000 sizes a tokenizer trained on the data, "
                                                     r"but data.tokenizer=tok is used"),
])
def test_bad_config_messages(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check(composed(*overrides))


def test_fp16_runs_on_a_cpu_that_computes_it_and_is_refused_on_one_that_does_not(monkeypatch):
    from zoo.engine import half

    check(composed("precision=fp16", "parallel=zero1", "precision.hysteresis=3"))  # this CPU computes fp16
    monkeypatch.setattr(half, "cpu_computes_fp16", lambda: False)
    with pytest.raises(ConfigError, match=r"precision=fp16: torch does not compute float16 on this CPU .*; use "
                                          r"precision=bf16 or fp32"):
        check(composed("precision=fp16"))
    check(composed("precision=fp16"), cuda=True)  # on CUDA the probe is not asked


def test_external_launcher_world_must_fit_the_model_ranks():
    with pytest.raises(ConfigError, match=r"world size 6 is not divisible by parallel.tp\(4\) \* parallel.pp\(1\)"):
        check(composed("parallel.tp=4"), world=6)


def test_external_launcher_derives_dp_and_warns_when_set():
    layout, warnings = resolve_layout(composed("parallel=zero2"), 8)
    assert layout.dp == 8 and "parallel.dp=2 is ignored" in warnings[0]


def test_deepspeed_config_derives_accumulation_and_passes_raw_keys():
    cfg = composed("parallel=zero2", "trainer.global_batch_size=64", "trainer.micro_batch_size=4",
                   "+deepspeed.zero_optimization.overlap_comm=true")
    ds = deepspeed_config(cfg, Layout(tp=1, pp=1, dp=2, zero_stage=2))
    assert ds["gradient_accumulation_steps"] == 8 and ds["train_batch_size"] == 64
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert ds["optimizer"]["params"]["torch_adam"] is True


def test_pipeline_does_not_split_sequence_parallel_activations_over_tp():
    """DeepSpeed's pipe_partitioned gathers a stage's activations as if every tp rank held the
    same tensor; a sequence-parallel rank holds its own shard (the 3d + sp runs of
    tests/e2e/parallel/test_document_mask.py match one process only without it)."""
    layout = Layout(tp=2, pp=2, dp=2, zero_stage=1)
    assert "pipe_partitioned" not in deepspeed_config(composed("parallel=3d"), layout)["pipeline"]
    ds = deepspeed_config(composed("parallel=3d", "parallel.sequence_parallel=true"), layout)
    assert ds["pipeline"]["pipe_partitioned"] is False and ds["pipeline"]["grad_partitioned"] is False


def _hf_dir(path: Path, **config) -> Path:
    """A transformers directory's config.json and a weights file (validation reads no weights:
    that one is present, not valid)."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"")
    return path


def _weights_only(path: Path) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    return path


def _bin_only(path: Path) -> Path:
    _hf_dir(path, **GPT2_SMALL)
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"not read")
    return path


GPT2_SMALL = dict(model_type="gpt2", n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)


def test_init_from_is_checked_with_the_imported_models_dimensions(tmp_path):
    """model.init_from: validation reads the directory's config.json and checks the layout
    against the imported model's dimensions, not model.size's."""
    gpt2 = _hf_dir(tmp_path / "gpt2", **GPT2_SMALL)
    padded = _hf_dir(tmp_path / "gpt2_padded", **{**GPT2_SMALL, "vocab_size": 50304})
    cases = [
        (["model.init_from=" + str(tmp_path / "nothing")], r"model.init_from=.*nothing: no such directory"),
        (["model.init_from="], r"model.init_from is empty: give a local transformers model directory"),
        ([f"model.init_from={_weights_only(tmp_path / 'weights')}"], r"model.init_from=.*weights: no config.json there"),
        ([f"model.init_from={_bin_only(tmp_path / 'bin')}"], r"model.init_from=.*bin holds no \*.safetensors weights"),
        (["model=bert", f"model.init_from={gpt2}"], r"holds a gpt model and model.family=bert; use model=gpt"),
        ([f"model.init_from={_hf_dir(tmp_path / 't5', model_type='t5')}"], r"model_type 't5' is not supported"),
        ([f"model.init_from={_hf_dir(tmp_path / 'broken', model_type='gpt2', n_layer=2)}"], r"its config.json has no 'n_head'"),
        (["parallel=tp", "model.vocab_pad_multiple=1", f"model.init_from={gpt2}"],
         r"parallel.tp=2 does not divide the vocabulary of model.init_from=.*\(50257 tokens\).*zoo pads an imported "
         r"vocabulary to a multiple of model.vocab_pad_multiple=1: set it to a multiple of 2"),
        (["parallel.tp=8", f"model.init_from={padded}"], r"parallel.tp=8 does not divide the imported model's heads \(12\)"),
        (["parallel.pp=13", f"model.init_from={padded}"], r"parallel.pp=13 is more than the 12 layers of model.init_from="),
        (["model=cnn", f"model.init_from={gpt2}"], r"the CNN has no transformers counterpart"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            check(composed(*overrides))
    check(composed("parallel=tp", f"model.init_from={gpt2}"))  # 50257 tokens: padded to 50304 at import
    # model.size=tiny has 4 heads and 4 layers: these layouts fit the imported model, not tiny.
    check(composed("parallel.tp=6", "parallel.pp=6", "trainer.global_batch_size=36", f"model.init_from={_hf_dir(tmp_path / 'v', **{**GPT2_SMALL, 'vocab_size': 50304 * 3})}"))


def test_init_from_memory_warning_uses_the_imported_model(tmp_path):
    from zoo.plan.fit import fit_warning

    xl = _hf_dir(tmp_path / "gpt2_xl", **{**GPT2_SMALL, "n_layer": 48, "n_head": 25, "n_embd": 1600})
    tiny = composed("parallel=ddp", "trainer.micro_batch_size=1")
    imported = composed("parallel=ddp", "trainer.micro_batch_size=1", f"model.init_from={xl}")
    layout, _ = resolve_layout(tiny, None)
    assert fit_warning(tiny, layout, 8e9) is None
    warning = fit_warning(imported, layout, 8e9)
    assert warning is not None and "predicted" in warning, warning


def test_the_shown_config_states_the_models_real_dimensions():
    from zoo.config.schema import to_yaml, with_model_shape
    from zoo.models.gpt import gpt_shape

    cfg = Config(model=ModelConfig(family="gpt", size="tiny", n_layer=6))
    shown = with_model_shape(cfg, gpt_shape("tiny", 4096, n_layer=6))
    assert (shown.model.size, shown.model.n_layer, shown.model.n_embd, shown.model.vocab_size) == ("tiny", 6, 128, 4096)
    assert cfg.model.n_embd is None  # the run's own config is untouched
    assert "n_embd: 128" in to_yaml(shown) and with_model_shape(cfg, None) is cfg


def test_bf16_at_zero_stage_0_warns_that_it_accumulates_gradients_in_bf16():
    warned = check(composed("precision=bf16", "trainer.global_batch_size=32", "trainer.micro_batch_size=8"))
    assert any("sums the 4 micro-batches' gradients of each step in bf16" in w for w in warned), warned
    for quiet in (["parallel=zero1"], ["trainer.global_batch_size=8"]):  # fp32 sums; nothing to accumulate
        assert not [w for w in check(composed("precision=bf16", "trainer.global_batch_size=32",
                                              "trainer.micro_batch_size=8", *quiet)) if "in bf16" in w]

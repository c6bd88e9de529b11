"""One validation pass over the composed config, before any process or process group starts.

Each rule raises `ConfigError` with what is wrong, the numbers and the fix; `zoo.train`
prints it as one line and exits 2. Rules that only warn return their messages. What differs
between model families is each family's own check (`FamilySpec.check`, zoo.families).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from zoo.config.paths import check_paths
from zoo.config.ranges import check_ranges, range_warnings
from zoo.config.schema import Config, PrecisionConfig
from zoo.parallel.topology import Layout
from zoo.run.errors import ConfigError, require

DTYPES = ("fp32", "bf16", "fp16")
LOGGERS = ("wandb", "none")


def resolve_layout(cfg: Config, world_size: Optional[int]) -> tuple[Layout, List[str]]:
    """The layout of this run. `world_size` is the launcher's (None for a local run, where
    `parallel.dp` says how many replicas to start)."""
    check_ranges(cfg)  # every numeric key first: the rules below may rely on them
    p = cfg.parallel
    warnings: List[str] = []
    if world_size is None:
        dp = p.dp or 1
    else:
        model_ranks = p.tp * p.cp * p.pp
        cp = f" * parallel.cp({p.cp})" if p.cp > 1 else ""
        require(world_size % model_ranks == 0,
                 f"world size {world_size} is not divisible by parallel.tp({p.tp}){cp} * parallel.pp({p.pp}) "
                 f"= {model_ranks}; launch a multiple of {model_ranks} ranks or change tp/{'cp/' if cp else ''}pp")
        dp = world_size // model_ranks
        if p.dp is not None and p.dp != dp:
            warnings.append(f"parallel.dp={p.dp} is ignored under an external launcher: dp = world size "
                            f"{world_size} / (tp {p.tp}{f' * cp {p.cp}' if cp else ''} * pp {p.pp}) = {dp}")
    return Layout(tp=p.tp, pp=p.pp, dp=dp, zero_stage=p.zero_stage, cp=p.cp), warnings


def validate(cfg: Config, layout: Layout, *, cuda_available: bool) -> List[str]:
    """Check every cross-key rule; returns warnings, raises ConfigError on the first error."""
    from zoo.families.registry import check_size, family

    warnings: List[str] = range_warnings(cfg)
    t, p, m = cfg.trainer, cfg.parallel, cfg.model
    spec = family(m.family)
    require(cfg.precision.dtype in DTYPES,
             f"precision.dtype={cfg.precision.dtype!r} is unknown; choose one of {list(DTYPES)}")
    require(cfg.logger.kind in LOGGERS, f"logger.kind={cfg.logger.kind!r} is unknown; choose one of {list(LOGGERS)}")
    _check_choices(cfg, cuda_available)
    if not m.init_from:
        check_size(m.family, m.size)
    _check_data(cfg, spec)
    check_paths(cfg, spec)
    _check_micro_batch(cfg, layout, cuda_available)
    _check_scaler(cfg, layout, cuda_available)
    if m.init_from and spec.hf is not None and Path(m.init_from).expanduser().is_dir():  # the family it holds
        from zoo.checkpoint.hf_weights import family_of_hf
        from zoo.families.registry import FAMILIES

        found = family_of_hf(m.init_from, FAMILIES.values())
        require(found.name == m.family, f"model.init_from={m.init_from} holds a {found.name} model and "
                                         f"model.family={m.family}; use model={found.name}")
    _check_context(cfg, layout, spec, warnings)
    layers, what = spec.check(cfg, layout, warnings)
    require(spec.tp_rules is not None or layout.tp == 1,
             f"parallel.tp={layout.tp}: model.family={m.family} has no tensor-parallel rules; use parallel.tp=1")
    if p.sequence_parallel and not spec.sequence_parallel:
        from zoo.families.registry import FAMILIES

        raise ConfigError(f"parallel.sequence_parallel=true is implemented for model.family in "
                          f"{sorted(n for n, s in FAMILIES.items() if s.sequence_parallel)} only; model.family="
                          f"{m.family} has no sequence-parallel rules; set parallel.sequence_parallel=false")
    if t.profile.start and t.profile.memory and not cuda_available:
        warnings.append("trainer.profile.memory=true records CUDA's allocator and no GPU is visible: the window "
                        "is profiled without it (the trace's memory view, profile_memory, is what the CPU has)")
    ck = cfg.checkpoint
    if ck.async_save and not ck.every:
        warnings.append("checkpoint.async_save=true is ignored without checkpoint.every=N: the checkpoints it writes "
                        "in the background are the periodic ones (a signal's or the last step's is written at once)")
    elif ck.async_save and (ck.native or (ck.native is None and layout.zero_stage == 3)):
        warnings.append("checkpoint.async_save=true: the sharded files are written in the background, but "
                        "checkpoint.native's DeepSpeed files (on by default under ZeRO-3) at once; set "
                        "checkpoint.native=false to keep the step from waiting for them")
    if not spec.generates_text and t.sample_tokens > 0:
        warnings.append(f"trainer.sample_tokens={t.sample_tokens} is ignored: model.family={m.family} "
                        f"generates no text")
    _check_eval_tasks(cfg, spec)
    require(layout.pp <= layers,
             f"parallel.pp={layout.pp} is more than the {layers} {what}; use pp <= {layers}")
    if layout.pp > 1:
        require(p.zero_stage <= 1,
                 f"parallel.zero_stage={p.zero_stage} with parallel.pp={layout.pp}: DeepSpeed's pipeline engine supports "
                 f"ZeRO stage 0 or 1 only; set parallel.zero_stage=1 or parallel.pp=1")
    _check_batches(cfg, layout, warnings)
    if m.compile:
        _check_compile(cuda_available)
        if layout.zero_stage == 3:
            warnings.append("model.compile=true with parallel.zero_stage=3: DeepSpeed gathers each submodule's "
                            "parameters in hooks that run outside the compiled graph, which breaks it at every "
                            "submodule (measured 0.52x eager, tiny GPT on 2 CPU cores); compile pays with ZeRO 0-2")
        if layout.pp > 1:
            warnings.append(f"model.compile=true with parallel.pp={layout.pp}: each block is compiled on its own "
                            f"(the stage's layers share one forward) and measured 0.50x eager (tiny GPT on 2 CPU "
                            f"cores); without pp the whole model compiles as one graph")
    from zoo.engine.raw_keys import check_raw_keys

    warnings += check_raw_keys(cfg, layout)
    return warnings


def _check_eval_tasks(cfg: Config, spec) -> None:
    """trainer.eval_tasks: a causal language model, evaluation on, each task readable (its file
    checked line by line), no name twice; trainer.eval_metric one the run reports."""
    t = cfg.trainer
    if t.eval_tasks:
        from zoo.evaluate.tasks import load_task, train_split, with_shots

        require(spec.generates_text, f"trainer.eval_tasks scores what a language model continues and "
                                     f"model.family={cfg.model.family} continues no text; use model=gpt or "
                                     f"model=llama, or set trainer.eval_tasks=[]")
        require(t.eval_batches != 0, "trainer.eval_tasks are scored at evaluations and trainer.eval_batches=0 "
                                     "turns them off; leave trainer.eval_batches unset (or > 0)")
        tasks = [load_task(str(entry)) for entry in t.eval_tasks]
        if t.eval_task_shots:
            for entry, task in zip(t.eval_tasks, tasks):
                with_shots(task, train_split(str(entry)), t.eval_task_shots)  # the split holds enough, of its kind
        names = [task.name for task in tasks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"trainer.eval_tasks names {twice[0]!r} twice (a task is named by its file's stem): "
                              f"rename one of the files")
    if t.eval_metric != "eval_loss":
        from zoo.evaluate.tasks import metric_names

        known = ["eval_loss"] + (metric_names(tasks) if t.eval_tasks else [])
        require(t.eval_metric in known, f"trainer.eval_metric={t.eval_metric!r} is none of the run's metrics; "
                                        f"choose one of {known}" + ("" if t.eval_tasks else
                                                                   " (a task's needs trainer.eval_tasks)"))


def _check_compile(cuda_available: bool) -> None:
    """model.compile: what inductor needs to build its kernels, found before any rank starts
    (else each rank fails at its first step with inductor's traceback)."""
    import importlib.util

    from zoo.models.compile import c_compiler

    if cuda_available:
        require(importlib.util.find_spec("triton") is not None,
                 "model.compile=true on a GPU needs Triton (torch.compile's inductor writes its GPU kernels in it) "
                 "and it is not installed; pip install triton (the version your torch pins) or set "
                 "model.compile=false")
    elif c_compiler() is None:
        import os

        cxx = os.environ.get("CXX")
        found = f"CXX={cxx} is not an executable" if cxx else "CXX is unset and g++, inductor's default, is not on PATH"
        raise ConfigError(f"model.compile=true on the CPU needs a C++ compiler (torch.compile's inductor builds its "
                          f"kernels with it) and none was found: {found}; install one (e.g. apt install g++) or set CXX to "
                          f"one, or set model.compile=false")


WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")
BACKENDS = ("gloo", "nccl", "mpi")
PARTITION_METHODS = ("parameters", "uniform")


def _check_choices(cfg: Config, cuda_available: bool) -> None:
    """String keys with a fixed set of values (torch, DeepSpeed or wandb would refuse the
    others only on the ranks, with a traceback)."""
    import re

    p, mode = cfg.parallel, cfg.logger.mode
    require(mode is None or mode in WANDB_MODES,
             f"logger.mode={mode!r} is unknown; choose one of {list(WANDB_MODES)} (or null: online when wandb "
             f"credentials exist, else offline)")
    require(p.backend is None or p.backend in BACKENDS,
             f"parallel.backend={p.backend!r} is unknown; choose one of {list(BACKENDS)} (or null: nccl on CUDA, gloo "
             f"on CPU)")
    require(p.backend != "nccl" or cuda_available,
             "parallel.backend=nccl needs CUDA and no GPU is visible; use parallel.backend=gloo (or null) here")
    if p.backend == "mpi":
        import torch.distributed as dist

        require(dist.is_mpi_available(), "parallel.backend=mpi: this torch was built without MPI; use "
                                          "parallel.backend=gloo (CPU) or nccl (CUDA), or null")
    if not cuda_available:  # an unknown name, or a named malloc this machine lacks
        from zoo.run.allocator import resolve

        resolve(cfg.run.cpu_allocator)
    from zoo.engine.schedules import SCHEDULES

    require(cfg.optim.name in ("adamw", "sgd"),
             f"optim.name={cfg.optim.name!r} is unknown; choose optim=adamw or optim=sgd")
    require(not (cfg.optim.name == "sgd" and cfg.optim.nesterov and cfg.optim.momentum == 0),
             "optim.nesterov=true needs momentum: set optim.momentum > 0 (e.g. 0.9)")
    require(cfg.optim.schedule in SCHEDULES,
             f"optim.schedule={cfg.optim.schedule!r} is unknown; choose one of {list(SCHEDULES)}")
    method = p.partition_method
    if method.startswith("type:"):
        try:
            re.compile(method[len("type:"):])
        except re.error as err:
            raise ConfigError(f"parallel.partition_method={method!r}: {err} in the regular expression; give "
                              f"type:REGEX matching layer class names, e.g. type:Block") from None
    else:
        require(method in PARTITION_METHODS,
                 f"parallel.partition_method={method!r} is unknown; choose one of {list(PARTITION_METHODS)} "
                 f"or type:REGEX (stages balanced by the layers whose class name matches)")


def _check_chat(cfg: Config) -> None:
    """data=chat renders conversations with a model's tokenizer and its chat template."""
    from data_pipelines.chat import TRAIN_ON
    from data_pipelines.chat_blocks import TRUNCATE
    from zoo.families.data_keys import own_tokenizer

    d = cfg.data
    require(d.train_on in TRAIN_ON, f"data.train_on={d.train_on!r} is unknown; choose one of {list(TRAIN_ON)}")
    require(d.truncate in TRUNCATE, f"data.truncate={d.truncate!r} is unknown; choose one of {list(TRUNCATE)}")
    require(not d.path or own_tokenizer(d, cfg.model.init_from) is not None,
            f"data=chat data.path={d.path} renders conversations with a model's tokenizer: set model.init_from=DIR "
            f"(a model directory with its tokenizer) or data.tokenizer=DIR (without data.path: a generated set with a "
            f"ChatML tokenizer trained here)")
    require(d.mix is None or not d.mix, "data.mix does not mix conversations; give one data.path of conversation files")


def _check_data(cfg: Config, spec) -> None:
    from zoo.families.registry import FAMILIES

    d, family = cfg.data, cfg.model.family
    sources = spec.data_sources
    if d.name not in sources:
        known = sorted({s for other in FAMILIES.values() for s in other.data_sources})
        require(d.name in known, f"data.name={d.name!r} is unknown; choose one of {known}")
        hint = ", ".join(f"data={s}" for s in sources)
        raise ConfigError(f"data.name={d.name!r} does not fit model.family={family}, which reads {spec.reads}; "
                          f"use {hint}" + (" (files and hub with data.path)" if "files" in sources else ""))
    if d.name in ("files", "hub", "prepared") and not d.mix:
        what = {"files": "a directory with one sub-directory of images per class" if spec.reads == "images"
                else "a text file, a directory or a glob (txt, jsonl, parquet, csv)",
                "hub": "a Hugging Face dataset name or a local dataset directory",
                "prepared": "the output directory of `python -m data_pipelines.prepare`"}[d.name]
        require(bool(d.path), f"data.name={d.name} needs data.path: {what}")
    if d.name == "chat":
        _check_chat(cfg)
    if d.name == "prepared" and d.path:
        from data_pipelines.chat_blocks import is_chat

        require(not is_chat(Path(d.path).expanduser()),
                f"data.path={d.path} holds conversations prepared for fine-tuning (their target masks beside the "
                f"tokens); read it with data=chat data.path={d.path}")
    require(not (d.name == "prepared" and cfg.model.init_from),
             f"model.init_from={cfg.model.init_from} with data=prepared: a prepared file trains zoo's own "
             f"initialisation only (an import's weights and tokenizer are read on text sources); give the text as "
             f"data=files or data=hub with model.init_from, or drop model.init_from")
    _check_data_keys(cfg, spec)
    if d.mix:
        require(bool(spec.mix_sources), f"data.mix mixes text sources for the families that read several "
                                        f"({sorted(n for n, s in FAMILIES.items() if s.mix_sources)}); "
                                        f"model.family={family} reads one source")
        names = ", ".join(spec.mix_sources)
        for m in d.mix:
            require(isinstance(m, dict) and m.get("name") in spec.mix_sources,
                     f"data.mix entry {m} needs name: {names} (and path, weight) for model.family={family}")
            weight = m.get("weight", 1.0)
            require(isinstance(weight, (int, float)) and not isinstance(weight, bool) and weight > 0,
                     f"data.mix entry {m}: weight={weight!r} must be a positive number (its share of the mixture)")
            require(m["name"] == "pydoc" or bool(m.get("path")),
                     f"data.mix entry {m} needs a path: a file, directory or glob (files), a dataset (hub) or "
                     f"the output of python -m data_pipelines.prepare (prepared)")
        require(not (cfg.model.init_from and any(m["name"] == "prepared" for m in d.mix)),
                 f"model.init_from={cfg.model.init_from} with a prepared directory in data.mix: a prepared file "
                 f"trains zoo's own initialisation only; give its text as a files or hub entry, or drop model.init_from")


def _check_data_keys(cfg: Config, spec) -> None:
    """A data key the chosen source would ignore is refused, naming the sources that read it."""
    from zoo.config.schema import DataConfig
    from zoo.families.data_keys import CHECKED, ONLY_FOR, tokenizer_brought

    d, defaults, family = cfg.data, DataConfig(), cfg.model.family
    chosen = "data.mix" if d.mix else f"data={d.name}"
    for key in CHECKED:
        value = getattr(d, key)
        if value == getattr(defaults, key):
            continue
        readers = spec.data_keys.get(key, ())
        if not readers:
            why = f": {ONLY_FOR[key]}" if key in ONLY_FOR else ""
            raise ConfigError(f"data.{key}={value!r} is read by no data source of model.family={family} "
                              f"(it reads {spec.reads}: {', '.join('data=' + s for s in spec.data_sources)}){why}; "
                              f"drop data.{key}")
        if key == "path" and d.mix:
            raise ConfigError(f"data.path={value!r} is not read with data.mix, whose entries name their own "
                              f"sources ({{name: files, path: ..., weight: ...}}); put it in data.mix or drop "
                              f"data.mix")
        if not d.mix and d.name not in readers:
            raise ConfigError(f"data.{key}={value!r} is read by {'|'.join('data=' + s for s in readers)}; you "
                              f"chose {chosen}: choose one of those (e.g. data={readers[0]} data.{key}={value}) "
                              f"or drop data.{key}")
    brings = tokenizer_brought(d, cfg.model.init_from)
    if brings and d.vocab_size != defaults.vocab_size and "vocab_size" in spec.data_keys:
        raise ConfigError(f"data.vocab_size={d.vocab_size} sizes a tokenizer trained on the data, but {brings} "
                          f"is used with its own vocabulary; drop data.vocab_size (model.vocab_size pads the "
                          f"model's vocabulary)")


SCALER_KEYS = ("loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")


def _check_scaler(cfg: Config, layout: Layout, cuda_available: bool) -> None:
    """fp16 where this machine computes it; its loss scaler's keys only where they act."""
    prec = cfg.precision
    if prec.dtype == "fp16" and not cuda_available:
        from zoo.engine.half import cpu_computes_fp16

        require(cpu_computes_fp16(), "precision=fp16: torch does not compute float16 on this CPU (the probe's "
                                      "fp16 matmul failed or overflowed wrongly); use precision=bf16 or fp32")
    if prec.dtype == "fp16" and layout.pp > 1 and layout.zero_stage == 0:
        raise ConfigError(f"precision=fp16 with parallel.pp={layout.pp} at parallel.zero_stage=0: DeepSpeed's pipeline "
                          f"engine does not scale the loss for its ZeRO-0 fp16 optimizer (gradients would reach it "
                          f"2**{prec.initial_scale_power} too small); set parallel.zero_stage=1, as the pp presets do")
    defaults = PrecisionConfig()
    changed = [k for k in SCALER_KEYS if getattr(prec, k) != getattr(defaults, k)]
    if prec.dtype != "fp16" and changed:
        key = changed[0]
        raise ConfigError(f"precision.{key}={getattr(prec, key)} sets fp16's loss scaler, but precision.dtype="
                          f"{prec.dtype} has none (it does nothing); use precision=fp16, or drop precision.{key}")
    if prec.dtype == "fp16" and layout.zero_stage == 0 and prec.hysteresis != defaults.hysteresis:
        raise ConfigError(f"precision.hysteresis={prec.hysteresis} does nothing at parallel.zero_stage=0 "
                          f"(DeepSpeed's fp16 optimizer there halves the scale at every overflow); use "
                          f"parallel.zero_stage=1 or more, or drop precision.hysteresis")
    if prec.dtype == "fp16" and prec.loss_scale == 0 and prec.min_loss_scale > 2 ** prec.initial_scale_power:
        raise ConfigError(f"precision.min_loss_scale={prec.min_loss_scale:g} is above the first loss scale "
                          f"2**precision.initial_scale_power={2 ** prec.initial_scale_power}; lower "
                          f"precision.min_loss_scale or raise precision.initial_scale_power")


def _check_micro_batch(cfg: Config, layout: Layout, cuda_available: bool) -> None:
    mb, p = cfg.trainer.micro_batch_size, cfg.parallel
    if mb != "auto":  # a positive number (zoo.config.ranges)
        require(isinstance(mb, int) and not isinstance(mb, bool),
                 f"trainer.micro_batch_size={mb!r} must be an integer, or auto")
        return
    require(cuda_available, "trainer.micro_batch_size=auto measures the peak memory of real training steps on a "
                             "CUDA device and none is visible; set a number (python -m zoo.plan suggests one)")
    require(layout.pp == 1 and p.num_microbatches is None,
             f"trainer.micro_batch_size=auto: with parallel.pp={layout.pp} / parallel.num_microbatches="
             f"{p.num_microbatches} the micro-batch is global / (dp x micro-batches) and not set directly; "
             f"drop auto and set parallel.num_microbatches (2-4 x the stages)")
    require(cfg.trainer.global_batch_size % layout.dp == 0,
             f"trainer.global_batch_size={cfg.trainer.global_batch_size} is not divisible by dp({layout.dp}); "
             f"set it to a multiple of {layout.dp}")


def _check_batches(cfg: Config, layout: Layout, warnings: List[str]) -> None:
    t, p = cfg.trainer, cfg.parallel
    if t.micro_batch_size == "auto":  # the finder picks a divisor of global / dp (checked above)
        return
    from zoo.engine.config import micro_batch_count

    count = micro_batch_count(p, layout)
    if count is None:
        per_step, what = t.micro_batch_size * layout.dp, f"trainer.micro_batch_size({t.micro_batch_size}) * dp({layout.dp})"
    else:
        per_step, what = count * layout.dp, f"micro-batches({count}) * dp({layout.dp})"
        require(count >= layout.pp,
                 f"{count} micro-batches per step is fewer than the {layout.pp} pipeline stages: stages would sit "
                 f"idle; set parallel.num_microbatches to at least {2 * layout.pp} (2-4 x pp)")
        if count < 2 * layout.pp:
            bubble = (layout.pp - 1) / (count + layout.pp - 1)
            warnings.append(f"{count} micro-batches for {layout.pp} pipeline stages: the expected bubble is "
                            f"(p-1)/(m+p-1) = {bubble:.0%} of the step; use parallel.num_microbatches >= {2 * layout.pp}")
    require(t.global_batch_size % per_step == 0,
             f"trainer.global_batch_size={t.global_batch_size} is not divisible by {what} = {per_step}; "
             f"set trainer.global_batch_size to a multiple of {per_step}, "
             f"e.g. {max(1, round(t.global_batch_size / per_step)) * per_step}")
    accumulated = t.global_batch_size // per_step if count is None else count
    if cfg.precision.dtype == "bf16" and layout.zero_stage == 0 and accumulated > 1:
        # DeepSpeed sums the micro-batches' gradients in fp32 from ZeRO-1 on (its BF16 optimizer);
        # at stage 0 it refuses fp32 accumulation and sums them in bf16.
        warnings.append(f"precision=bf16 with parallel.zero_stage=0 sums the {accumulated} micro-batches' gradients "
                        f"of each step in bf16 (8 significant bits; measured on the tiny GPT: 0.25% off fp32's loss "
                        f"after 20 steps, against 0.00% at ZeRO-1); parallel.zero_stage=1 sums them in fp32")


def _check_context(cfg: Config, layout: Layout, spec, warnings: List[str]) -> None:
    """parallel.cp: a causal decoder (its blocks' split: check_transformer)."""
    if layout.cp == 1:
        if not cfg.parallel.cp_recompute:
            warnings.append("parallel.cp_recompute=false is read with parallel.cp > 1 only; this run has cp=1")
        return
    from zoo.families.registry import FAMILIES

    m = cfg.model
    require(spec.context_parallel,
            f"parallel.cp={layout.cp}: model.family={m.family} has no context parallelism (it is for the causal "
            f"decoders {sorted(n for n, s in FAMILIES.items() if s.context_parallel)}); set parallel.cp=1")

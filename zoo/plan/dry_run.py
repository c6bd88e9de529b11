"""`python -m zoo.train ... --dry-run` (`trainer.dry_run=true`): the run validated and planned,
printed, and nothing started or written: the layout and the batch, the planner's memory per
device against the device, the data and its size. A planner command checked before a GPU
(or 32 CPU processes) is spent on it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from zoo.config.schema import Config, DataConfig
from zoo.plan.fit import GPT2_VOCAB, run_memory


def planned_vocab(d: DataConfig) -> int:
    """The vocabulary the run's model will have, as far as it is known before the data is read:
    data.tokenizer's or a prepared directory's tokenizer, else the one trained here
    (data.vocab_size), else GPT-2's."""
    found = [Path(d.tokenizer) / "tokenizer.json"] if d.tokenizer else []
    found += [Path(d.path) / "tokenizer" / "tokenizer.json"] if d.name == "prepared" and d.path else []
    for path in found:
        if path.expanduser().is_file():
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(path.expanduser())).get_vocab_size()
    return d.vocab_size if not d.tokenizer and d.name != "prepared" else GPT2_VOCAB


def _unplanned_vocab(cfg: Config, spec, mem) -> str | None:
    """One line when the model this run builds is not the one `python -m zoo.plan` plans for its
    size preset: model.vocab_size is left to the run's tokenizer, whose vocabulary is not the
    published model's (the planner's printed command sets model.vocab_size to what it planned)."""
    m = cfg.model
    published = spec.published.get(m.size)
    if mem is None or published is None or m.vocab_size is not None or m.init_from:
        return None
    from zoo.families.transformer import padded_vocab
    from zoo.plan.describe import describe_model

    ours, theirs = planned_vocab(cfg.data), published[0]
    if padded_vocab(ours, m) == padded_vocab(theirs, m):
        return None
    planned = describe_model(m, theirs).num_params
    return (f"model: NOT the planned model: the vocabulary is the run's tokenizer's {ours:,} tokens ({'data.tokenizer' if cfg.data.tokenizer else f'data={cfg.data.name}'}), "
            f"not {m.size}'s published {theirs:,}, so it builds {mem['num_params']:,} parameters where "
            f"python -m zoo.plan plans {planned:,} for model.size={m.size}: add model.vocab_size="
            f"{padded_vocab(theirs, m)} to build the planned model (or plan with plan.vocab_size={ours})")


def _bytes(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _source_size(name: str, path: str | None, reads: str) -> str:
    """How big a source is, read off the disk only (no tokenizing)."""
    if name == "pydoc":
        from pydoc_data.topics import topics

        return f"the Python documentation inside CPython, {len(topics)} topics, {_bytes(sum(map(len, topics.values())))} of text"
    if name == "digits":
        return "scikit-learn's 1,797 8x8 digits"
    p = Path(str(path)).expanduser()
    if name == "prepared":
        meta = json.loads((p / "meta.json").read_text())
        return f"{path}: {meta['documents']:,} documents, {meta['tokens']:,} tokens, prepared"
    if name == "hub" and not p.exists():
        return f"{path}: a Hub dataset (its size is known once loaded)"
    if reads == "images" or name == "hub":
        files = [f for f in p.rglob("*") if f.is_file()]
    else:
        from data_pipelines.text_sources import expand_paths

        files = expand_paths(str(path))
    return f"{path}: {len(files):,} file(s), {_bytes(sum(f.stat().st_size for f in files))}"


def dry_run_lines(cfg: Config, layout, spec, device_mem_bytes: float, device: str) -> List[str]:
    """What the run would do, in a few lines (after validation)."""
    t, d = cfg.trainer, cfg.data
    lines = []
    try:
        fits, mem, _, _ = run_memory(cfg, layout, device_mem_bytes, vocab_size=planned_vocab(cfg.data))
    except (ValueError, KeyError):  # a family the planner does not describe (the CNN: its shape comes from the data)
        fits = mem = None
    if t.micro_batch_size == "auto":
        batch = "micro-batch auto (measured at the start)"
    else:
        from zoo.engine import micro_batching

        micro, accum = micro_batching(cfg.trainer, cfg.parallel, layout)
        batch = (f"{accum} micro-batches of {micro} through {layout.pp} stages x dp {layout.dp}" if layout.pp > 1
                 else f"micro {micro} x accum {accum} x dp {layout.dp}")
    context = f" x cp {layout.cp}" if layout.cp > 1 else ""
    lines.append(f"layout {layout.name}: world {layout.world_size} = tp {layout.tp}{context} x pp {layout.pp} x dp {layout.dp}, "
                 f"global batch {t.global_batch_size} = {batch}, {cfg.precision.dtype}, {t.max_steps} steps")
    if mem is None:
        lines.append(f"memory: the planner does not describe model.family={cfg.model.family} (its shape comes from "
                     f"the data); a few steps show the peak (summary.json: peak_mem_bytes)")
    else:
        parts = ", ".join(f"{k} {_bytes(mem[k])}" for k in ("params", "grads", "optimizer", "activations", "buffers",
                                                              "engine", "runtime"))
        lines.append(f"memory: {cfg.model.label}, {mem['num_params']:,} parameters: predicted "
                     f"{_bytes(mem['total'])} per device ({parts}) against {_bytes(mem['limit'])} usable of the "
                     f"{_bytes(device_mem_bytes)} {device} ({mem['limit'] / device_mem_bytes:.0%}): "
                     + ("fits" if fits else "does NOT fit (see the warning above)"))
    differs = _unplanned_vocab(cfg, spec, mem)
    if differs:
        lines.append(differs)
    if d.mix:
        source = "data.mix: " + "; ".join(f"{_source_size(m['name'], m.get('path'), spec.reads)} x{m.get('weight', 1)}"
                                          for m in d.mix)
    else:
        source = f"data={d.name}: {_source_size(d.name, d.path, spec.reads)}"
    held = f"data.eval_path={d.eval_path}" if d.eval_path else f"data.eval_fraction={d.eval_fraction:g}"
    lines.append(f"{source}; held out: {held}")
    return lines

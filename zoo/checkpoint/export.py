"""Export a run or a checkpoint to a Hugging Face transformers directory.

    python -m zoo.export RUN_DIR_OR_CHECKPOINT OUT_DIR

Reads the layout-free weights (a run's model.safetensors or a checkpoint's stage files),
whatever layout wrote them, and writes `config.json`, `model.safetensors` and the
tokenizer, loadable with `GPT2LMHeadModel.from_pretrained(OUT_DIR)` (GPT),
`LlamaForCausalLM` (Llama) or `BertForMaskedLM` (BERT). An imported model's vocabulary
padding (zoo.checkpoint.hf.read_hf) is stripped: the export has its original vocabulary.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Tuple

from zoo.checkpoint.hf import State
from zoo.errors import ZooError


def read_zoo(src: Path) -> Tuple[str, dict, State, Path]:
    """(family, model meta, plain state, run directory) of a run directory or checkpoint."""
    from safetensors.torch import load_file

    from zoo.checkpoint.layout_free import read_state, resolve

    final = src / "model.safetensors"
    if final.exists() and not (src / "state.json").exists():  # a finished run's consolidated weights
        from safetensors import safe_open

        with safe_open(str(final), framework="pt") as fh:
            info = fh.metadata() or {}
        if "shape" in info:
            return info["family"], json.loads(info["shape"]), load_file(str(final)), src
    ckpt, notes = (src, []) if (src / "state.json").exists() else resolve(str(src), src)
    for line in notes:
        print(f"zoo.export: {line}", file=sys.stderr)
    if ckpt is None:
        raise ZooError(f"{src}: no checkpoint found (train with checkpoint.every=N)")
    state_json = read_state(ckpt)
    return state_json["family"], state_json["shape"], dict(checkpoint_weights(ckpt, state_json)), ckpt.parent.parent


def checkpoint_weights(ckpt: Path, state_json: dict):
    """(plain name, full fp32 tensor) of each weight and buffer of a checkpoint, one at a time."""
    from zoo.checkpoint import format1, sharded

    if state_json["format"] == format1.FORMAT:
        yield from format1.stage_tensors(ckpt, "model")
        return
    index = sharded.Index(ckpt)
    for tensor in sorted(index.shapes):
        kind, name = tensor.split("/", 1)
        if kind == sharded.MODEL:
            yield name, index.full(tensor)


def export(src: Path, out: Path) -> Path:
    from zoo.families import FAMILIES

    family, meta, state, run_dir = read_zoo(src)
    spec = FAMILIES.get(family)
    if spec is None or spec.hf is None:
        supported = sorted(name for name, s in FAMILIES.items() if s.hf is not None)
        raise ZooError(f"export of family {family!r} is not supported; supported: {supported}")
    tokenizer = run_dir / "tokenizer"
    special = {}
    if tokenizer.is_dir():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer))
        special = {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    from zoo.checkpoint.hf import strip_vocab_padding

    meta, state = strip_vocab_padding(spec, meta, state)
    config, hf_state = spec.hf.to_hf(state, meta, **special)
    from safetensors.torch import save_file

    from data_pipelines.tokenizer import tokenizer_files

    out.mkdir(parents=True, exist_ok=True)
    # The tokenizer's own files only: a run of an older zoo kept an imported model's whole
    # directory as its tokenizer/, starting weights and config.json included.
    for f in tokenizer_files(tokenizer) if tokenizer.is_dir() else []:
        shutil.copy2(f, out / f.name)
    config.save_pretrained(str(out))
    save_file({k: v.contiguous() for k, v in hf_state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.export", description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="a run directory or a checkpoint directory")
    parser.add_argument("out", type=Path, help="the transformers directory to write")
    args = parser.parse_args(argv)
    try:
        out = export(args.src, args.out)
    except (ZooError, ValueError, OSError) as err:
        print(f"zoo.export: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args.src} -> {out}")


if __name__ == "__main__":
    main()

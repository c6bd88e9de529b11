"""Export a run or a checkpoint to a Hugging Face transformers directory, tensor by tensor.

    python -m zoo.export RUN_DIR_OR_CHECKPOINT OUT_DIR [--dtype fp32|bf16|fp16] [--max-shard-size 5GB]

Reads the layout-free weights (a run's final weights, or a checkpoint's shards, whatever
layout wrote them) one tensor at a time and writes them under transformers' names as they
come (zoo.checkpoint.stream_write), so the export holds one tensor, never the model:
`model.safetensors`, or where the weights pass --max-shard-size, transformers' sharded
layout (`model-0000i-of-0000n.safetensors` and `model.safetensors.index.json`), with
`config.json` and the tokenizer's own files. It loads with `GPT2LMHeadModel`,
`LlamaForCausalLM` or `BertForMaskedLM.from_pretrained(OUT_DIR)`. An imported model's
vocabulary padding (zoo.checkpoint.hf_weights.padded_meta) is stripped: the export has its original
vocabulary.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from zoo.engine.config import TORCH_DTYPES as DTYPES
from zoo.run.errors import ZooError

Source = Dict[str, Tuple[Tuple[int, ...], Callable[[], torch.Tensor]]]  # name -> (shape, read it)


def _from_file(path: Path) -> Source:
    """The tensors of one safetensors file, each read when asked (pread, nothing mapped)."""
    from zoo.checkpoint.sharded import ShardReader

    reader = ShardReader(path)
    return {k: (tuple(v["shape"]), lambda k=k, shape=tuple(v["shape"]): reader.read(k, tuple(slice(0, s) for s in shape)))
            for k, v in reader.header.items() if k != "__metadata__"}


def open_zoo(src: Path) -> Tuple[str, dict, Source, Path]:
    """(family, model meta, its weights by plain name, run directory) of a run directory or a checkpoint."""
    from zoo.checkpoint import format1, sharded
    from zoo.checkpoint.final import weight_files
    from zoo.checkpoint.layout_free import read_state, resolve
    from zoo.checkpoint.sharded import ShardReader

    finals = weight_files(src) if not (src / "state.json").exists() else []
    if finals:  # a finished run's final weights (a file per pipeline stage under pp)
        info = ShardReader(finals[0]).header.get("__metadata__") or {}
        if "shape" in info:
            source: Source = {}
            for f in finals:
                source.update(_from_file(f))
            return info["family"], json.loads(info["shape"]), source, src
    ckpt, notes = (src, []) if (src / "state.json").exists() else resolve(str(src), src, key="")
    for line in notes:
        print(f"zoo.export: {line}", file=sys.stderr)
    if ckpt is None:
        raise ZooError(f"{src}: no checkpoint found (train with checkpoint.every=N)")
    state = read_state(ckpt)
    if state["format"] == format1.FORMAT:
        source = {}
        for f in sorted(ckpt.glob("model-*.safetensors")):
            source.update(_from_file(f))
    else:
        index = sharded.Index(ckpt)
        source = {t.split("/", 1)[1]: (shape, lambda t=t: index.full(t)) for t, shape in index.shapes.items()
                  if t.startswith(sharded.MODEL + "/")}
    return state["family"], state["shape"], source, ckpt.parent.parent


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000000' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"--max-shard-size {text!r}: give a size such as 5GB or 500MB")
    unit = m.group(2).upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30,
             "TI": 2**40}[unit]
    size = int(float(m.group(1)) * scale)
    if size <= 0:
        raise ValueError(f"--max-shard-size {text!r} must be positive")
    return size


def _plan(spec, meta: dict, source: Source, dtype: torch.dtype, shard_bytes: int) -> List[List[tuple]]:
    """The output files: lists of (transformers key, plain name, its shape there, rows kept)."""
    from zoo.checkpoint.hf_weights import real_rows

    size = torch.empty((), dtype=dtype).element_size()
    files: List[List[tuple]] = [[]]
    used = 0
    for name, (shape, _) in source.items():
        rows = real_rows(spec, meta, name)
        out_shape = ((rows, *shape[1:]) if rows is not None else tuple(shape))
        out_shape = out_shape[::-1] if spec.hf.transposed(name) else out_shape
        for key in spec.hf.export_keys(name):
            nbytes = torch.Size(out_shape).numel() * size
            if files[-1] and used + nbytes > shard_bytes:
                files.append([])
                used = 0
            files[-1].append((key, name, out_shape, rows))
            used += nbytes
    return files


def export(src: Path, out: Path, *, dtype: str = "fp32", max_shard_bytes: int = 5 * 10**9) -> Path:
    from zoo.checkpoint.stream_write import StreamWriter
    from zoo.families.registry import FAMILIES

    family, meta, source, run_dir = open_zoo(src)
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
    from data_pipelines.tokenizer import tokenizer_files

    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("model*.safetensors")) + [out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)  # an earlier export's shards
    # The tokenizer's own files only: a run of an older zoo kept an imported model's whole
    # directory as its tokenizer/, starting weights and config.json included.
    for f in tokenizer_files(tokenizer) if tokenizer.is_dir() else []:
        shutil.copy2(f, out / f.name)
    exported_meta = {k: v for k, v in meta.items() if k != "vocab_real"}
    if meta.get("vocab_real") is not None:
        exported_meta["vocab_size"] = meta["vocab_real"]
    spec.hf.config(exported_meta, **special).save_pretrained(str(out))
    torch_dtype = DTYPES[dtype]
    files = _plan(spec, meta, source, torch_dtype, max_shard_bytes)
    names = (["model.safetensors"] if len(files) == 1 else
             [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])
    weight_map, total = {}, 0
    for name, entries in zip(names, files):
        writer = StreamWriter(out / name, [(key, torch_dtype, shape) for key, _, shape, _ in entries],
                              metadata={"format": "pt"})
        for key, plain, shape, rows in entries:
            t = source[plain][1]()  # one tensor at a time
            t = t[:rows] if rows is not None else t
            t = t.t() if spec.hf.transposed(plain) else t
            writer.write(key, t.to(torch_dtype))
            weight_map[key] = name
            total += t.numel() * torch.empty((), dtype=torch_dtype).element_size()
            del t
        writer.close()
    if len(files) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.export", description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="a run directory or a checkpoint directory")
    parser.add_argument("out", type=Path, help="the transformers directory to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="the exported weights' dtype")
    parser.add_argument("--max-shard-size", default="5GB",
                        help="the largest weights file (transformers' sharded layout beyond it); default 5GB")
    args = parser.parse_args(argv)
    try:
        out = export(args.src, args.out, dtype=args.dtype, max_shard_bytes=parse_size(args.max_shard_size))
    except (ZooError, ValueError, OSError) as err:
        print(f"zoo.export: error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args.src} -> {out}")


if __name__ == "__main__":
    main()

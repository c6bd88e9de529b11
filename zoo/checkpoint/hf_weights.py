"""Reading a local Hugging Face transformers directory: which family its config.json names,
the model's shape fields, and its weights, slice by slice (HFWeights: each rank reads only its
own parameters' slices). Each family's converter (`FamilySpec.hf`, e.g.
`zoo/families/gpt/hf.py`) knows the names and the transposed tensors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from zoo.run.errors import ConfigError

State = Dict[str, torch.Tensor]


def _model_type(directory: Path):
    if not (directory / "config.json").exists():
        raise ConfigError(f"model.init_from={directory}: no config.json there; give a local transformers directory")
    return json.loads((directory / "config.json").read_text()).get("model_type")


def family_of_hf(directory: str | Path, specs):
    """Of `specs` (the families' specs: the caller's registry), the one whose converter
    imports this directory's `model_type`."""
    model_type = _model_type(Path(directory))
    for spec in specs:
        if spec.hf is not None and model_type in spec.hf.model_types:
            return spec
    known = sorted(t for spec in specs if spec.hf for t in spec.hf.model_types)
    raise ConfigError(f"model.init_from={directory}: model_type {model_type!r} is not supported; the zoo imports {known}")


def padded_meta(spec, meta: dict, multiple: int | None) -> dict:
    """The shape fields with the vocabulary padded up to `multiple` (model.vocab_pad_multiple,
    which every tensor-parallel size divides), `vocab_real` keeping the model's own count; the
    fields as they are where no multiple is given, the family pads nothing or the vocabulary
    is a multiple already."""
    vocab = meta["vocab_size"]
    if not multiple or not spec.hf.vocab_rows or vocab % multiple == 0:
        return meta
    return {**meta, "vocab_size": -(-vocab // multiple) * multiple, "vocab_real": vocab}


def hf_meta(directory: str | Path, spec, pad_multiple: int | None = None) -> dict:
    """The model shape fields of family `spec` from a transformers directory's config.json
    alone; with `pad_multiple`, the vocabulary as the import pads it."""
    model_type = _model_type(Path(directory))
    if spec.hf is None or model_type not in spec.hf.model_types:
        raise ConfigError(f"model.init_from={directory} holds model_type {model_type!r}, which model.family="
                          f"{spec.name} does not import" + (f" (it imports {list(spec.hf.model_types)})" if spec.hf
                                                            else ""))
    meta = spec.hf.meta_from_config(json.loads((Path(directory) / "config.json").read_text()))
    return padded_meta(spec, meta, pad_multiple)


def read_hf(directory: str | Path, spec, pad_multiple: int | None = None) -> Tuple[dict, "HFWeights"]:
    """(model shape fields, its weights to read slice by slice) of a local transformers directory
    holding a model of family `spec`; with `pad_multiple`, its per-token tensors padded with
    zero rows (padded_meta)."""
    meta = hf_meta(directory, spec, pad_multiple)
    return meta, HFWeights(Path(directory), spec, meta)


def real_rows(spec, meta: dict, name: str) -> Optional[int]:
    """How many rows of `name` an export keeps: the model's own vocabulary for a per-token
    tensor of an imported, padded one (None: all)."""
    real = meta.get("vocab_real")
    return real if real is not None and spec.hf is not None and name in spec.hf.vocab_rows else None


class HFWeights:
    """A transformers directory's weights, read slice by slice: each rank reads only the
    slices of the tensors its parameters hold (its tensor-parallel shard of its stage's
    tensors), with pread (zoo.checkpoint.sharded.ShardReader: nothing memory-mapped stays
    resident), converted to zoo's layout (renamed, transposed) one slice at a time; a
    per-token tensor's rows past the model's own vocabulary (the padding, padded_meta) are
    zeros. It holds the files' headers only."""

    def __init__(self, directory: Path, spec, meta: dict):
        from zoo.checkpoint.sharded import ShardReader

        self.spec, self.meta = spec, meta
        self.real_vocab = meta.get("vocab_real") or meta["vocab_size"]
        self.readers = [ShardReader(f) for f in sorted(Path(directory).glob("*.safetensors"))]
        self.where = {key: r for r in self.readers for key in r.header if key != "__metadata__"}
        if not self.where:
            raise ConfigError(f"model.init_from={directory} holds no *.safetensors weights (a pytorch_model.bin is "
                              f"not read: it would need unpickling); save the model with "
                              f"save_pretrained(safe_serialization=True)")

    def key(self, name: str) -> Optional[str]:
        """The transformers key holding zoo's tensor `name` (None: the directory has none)."""
        return next((k for k in self.spec.hf.hf_keys(name) if k in self.where), None)

    def __contains__(self, name: str) -> bool:
        return self.key(name) is not None

    def full_shape(self, name: str) -> Tuple[int, ...]:
        """The shape of zoo's (unsharded, vocabulary-padded) tensor `name`."""
        shape = list(self.where[self.key(name)].header[self.key(name)]["shape"])
        shape = shape[::-1] if self.spec.hf.transposed(name) else shape
        if name in self.spec.hf.vocab_rows:
            shape[0] = self.meta["vocab_size"]
        return tuple(shape)

    @torch.no_grad()
    def fill(self, name: str, target: torch.Tensor) -> None:
        """Fill `target` (a parameter or buffer, tagged `tp_shard` where sharded) with its values."""
        local = tuple(target.shape)
        self._fill_box(name, getattr(target, "tp_shard", None), local, ((0,) * len(local), local), target)

    @torch.no_grad()
    def fill_flat(self, name: str, spec, local: Tuple[int, ...], start: int, out: torch.Tensor) -> None:
        """Fill `out` (flat) with elements [start, start + len(out)) of the tensor-parallel shard
        `spec` (of shape `local`) of `name`: a ZeRO-3 partition reads only its own range."""
        from zoo.checkpoint.boxes import flat_views

        for box, dest in flat_views(local, start, out):
            self._fill_box(name, spec, local, box, dest)

    def _fill_box(self, name: str, spec, local: Tuple[int, ...], box, dest: torch.Tensor) -> None:
        """Fill `dest` (the shape of `box`, a box of the shard `spec` of shape `local`) from the files."""
        from zoo.checkpoint.boxes import full_shape, to_full
        from zoo.run.errors import CheckpointError

        key = self.key(name)
        if key is None:
            raise CheckpointError(f"the weights have no tensor {name!r} for this model")
        full = full_shape(local, spec)
        if full != self.full_shape(name):
            raise CheckpointError(f"model.init_from's {key} has shape {list(self.full_shape(name))}, this model's "
                                  f"{name} {list(full)}")
        transposed = self.spec.hf.transposed(name)
        rows = self.real_vocab if name in self.spec.hf.vocab_rows else full[0]
        for full_box, within in to_full(box, spec, full):
            part = dest[tuple(slice(o, o + s) for o, s in zip(*within))]
            (r0, *rest_o), (rn, *rest_s) = full_box
            have = max(0, min(r0 + rn, rows) - r0)  # rows past the real vocabulary stay zero
            part[have:].zero_()
            if have:
                index = tuple(slice(o, o + s) for o, s in zip((r0, *rest_o), (have, *rest_s)))
                piece = self.where[key].read(key, index[::-1] if transposed else index)
                part[:have].copy_(piece.t() if transposed else piece)

    def full(self, name: str) -> torch.Tensor:
        """Zoo's whole tensor `name` (tests, small models)."""
        out = torch.empty(self.full_shape(name), dtype=torch.float32)
        self.fill(name, out)
        return out

    def close(self) -> None:
        for r in self.readers:
            r.close()
        self.readers, self.where = [], {}

"""A safetensors file written tensor by tensor: its header (every name, dtype, shape and
offset) first, then each tensor's bytes as it comes, so a writer holds one tensor at a
time, not a dict of all of them (safetensors' save_file takes the whole dict). The file's
xxh3-64 digest is computed on the way, so the checkpoint's checksums need no second read.
The result is an ordinary safetensors file (safe_open, load_file read it)."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}


class StreamWriter:
    """`StreamWriter(path, [(name, dtype, shape), ...], metadata)`, then `write(name, tensor)`
    in the declared order, then `close()` (returns the file's size and digest)."""

    def __init__(self, path: Path, entries: Sequence[Tuple[str, torch.dtype, Sequence[int]]],
                 metadata: Optional[Dict[str, str]] = None):
        import xxhash

        header: Dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
        self.order: List[Tuple[str, torch.dtype, Tuple[int, ...]]] = []
        offset = 0
        for name, dtype, shape in entries:
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self.order.append((name, dtype, tuple(shape)))
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self.path, self.fh, self.next = path, open(path, "wb"), 0
        self.hash = xxhash.xxh3_64()
        self._emit(struct.pack("<Q", len(text)) + text)

    def _emit(self, data) -> None:
        self.fh.write(data)
        self.hash.update(data)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        want, dtype, shape = self.order[self.next]
        if name != want or tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(f"StreamWriter: expected {want} {dtype} {shape}, got {name} {tensor.dtype} "
                             f"{tuple(tensor.shape)}")
        self.next += 1
        if tensor.numel():
            self._emit(memoryview(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))

    def close(self) -> Dict[str, object]:
        if self.next != len(self.order):
            raise ValueError(f"StreamWriter: {len(self.order) - self.next} declared tensor(s) not written")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        size = self.fh.tell()
        self.fh.close()
        return {"bytes": size, "xxh3_64": self.hash.hexdigest()}

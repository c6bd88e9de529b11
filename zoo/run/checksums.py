"""Sizes and checksums of the files of a directory: what checkpoints and cache entries record
when they are written and check before they are read (xxh3-64, several GB/s)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

_CHUNK = 8 << 20


def digest(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def manifest(directory: Path, *, exclude: tuple = (),
             keep: Optional[Callable[[str, int], bool]] = None) -> Dict[str, dict]:
    """{relative path: {"bytes": size, "xxh3_64": digest}} of every file under `directory`;
    `keep(relative path, its position in path order)`: only the files it keeps are read."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and str(p.relative_to(directory)) not in exclude
                   and p.name not in exclude)
    return {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "xxh3_64": digest(p)}
            for i, p in enumerate(files) if keep is None or keep(str(p.relative_to(directory)), i)}


def mismatch(directory: Path, record: Dict[str, dict], verified: Optional[Dict[str, list]] = None) -> Optional[str]:
    """The first file under `directory` that differs from `record`, said in words; None if all match.
    `verified` ({name: [size, mtime_ns]} of files whose digest was read before): those still of that
    size and modification time are not read again; the files read here are added to it."""
    for name, want in record.items():
        f = directory / name
        if not f.is_file():
            return f"{name} is missing"
        st = f.stat()
        if st.st_size != want["bytes"]:
            return f"{name} has {st.st_size} bytes, {want['bytes']} were written"
        if verified is not None and verified.get(name) == [st.st_size, st.st_mtime_ns]:
            continue
        if digest(f) != want["xxh3_64"]:
            return f"{name} does not match its checksum (its bytes changed after it was written)"
        if verified is not None:
            verified[name] = [st.st_size, st.st_mtime_ns]
    return None

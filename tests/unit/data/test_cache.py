"""The on-disk cache heals itself: a damaged entry is rebuilt (once, under the lock) with one
line; leftovers of killed builds are removed."""
from __future__ import annotations

import numpy as np
import pytest

from data_pipelines.cache import MARKER, cached_dir


class Builder:
    def __init__(self):
        self.calls = 0

    def __call__(self, tmp):
        self.calls += 1
        np.save(tmp / "train.npy", np.arange(1000, dtype=np.int32))
        (tmp / "tokenizer.json").write_text('{"model": "bpe"}')


def _truncate(entry):
    f = entry / "train.npy"
    f.write_bytes(f.read_bytes()[:100])


def _zeros(entry):
    f = entry / "train.npy"
    f.write_bytes(bytes(f.stat().st_size))


def _delete(entry):
    (entry / "tokenizer.json").unlink()


def _old_marker(entry):
    (entry / MARKER).write_text("ok\n")


@pytest.mark.parametrize("damage", [_truncate, _zeros, _delete, _old_marker], ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_entry_is_rebuilt_once(tmp_path, capsys, damage):
    build, entry = Builder(), tmp_path / "lm-abc"
    assert cached_dir(entry, build) == entry and build.calls == 1
    assert cached_dir(entry, build) == entry and build.calls == 1  # intact: used as it is
    damage(entry)
    capsys.readouterr()
    cached_dir(entry, build)
    assert build.calls == 2 and "rebuilding it" in capsys.readouterr().err
    assert np.array_equal(np.load(entry / "train.npy"), np.arange(1000, dtype=np.int32))
    cached_dir(entry, build)
    assert build.calls == 2


def test_leftovers_of_killed_builds_are_removed(tmp_path):
    entry = tmp_path / "lm-abc"
    leftover = tmp_path / "lm-abc.tmpk1ll3d"
    leftover.mkdir()
    (leftover / "train.npy").write_bytes(b"half")
    cached_dir(entry, Builder())
    assert not leftover.exists() and (entry / MARKER).exists()

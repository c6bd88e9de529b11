"""A resume's ranks verify a checkpoint together (#50 item 3): each hashes its own shard and
index and every world-th other file, so rank 0 no longer reads the whole checkpoint; a damaged
file is found by the rank that owns it, and every rank gets the same answer."""
from __future__ import annotations

import json

from zoo.checkpoint import verify
from zoo.checkpoint.verify import damage, owner, shared_damage, write_checksums


def _checkpoint(tmp_path, ranks=4):
    step = tmp_path / "step_0000004"
    step.mkdir()
    for r in range(ranks):
        (step / f"shard-{r:05d}.safetensors").write_bytes(bytes([r]) * 1000)
        (step / f"index-{r:05d}.json").write_text(json.dumps({"rank": r}))
    (step / "rng.safetensors").write_bytes(b"rng")
    (step / "state.json").write_text(json.dumps({"step": 4}))
    write_checksums(step)
    return step


def test_the_shares_cover_every_file_once_and_a_rank_hashes_only_its_own(tmp_path, monkeypatch):
    step = _checkpoint(tmp_path)
    names = sorted(json.loads((step / "checksums.json").read_text()))
    world = 2
    shares = [[n for i, n in enumerate(names) if owner(n, i, world) == r] for r in range(world)]
    assert sorted(shares[0] + shares[1]) == names and not set(shares[0]) & set(shares[1])
    assert {"shard-00001.safetensors", "index-00001.json", "shard-00003.safetensors"} <= set(shares[1])
    read = []
    monkeypatch.setattr(verify, "mismatch", lambda d, record: read.extend(record) or None)
    assert damage(step, (1, world)) is None and sorted(read) == shares[1]


def test_a_damaged_file_is_found_by_its_owner_and_told_to_every_rank(tmp_path):
    step = _checkpoint(tmp_path)
    f = step / "shard-00001.safetensors"
    f.write_bytes(b"\xff" + f.read_bytes()[1:])
    mine = [damage(step, (r, 2)) for r in range(2)]
    assert mine[0] is None and "shard-00001.safetensors does not match its checksum" in mine[1]
    # the gather as two ranks would see it: each rank's answer, then the first problem for all
    gathered = lambda out, _: out.__setitem__(slice(None), mine)  # noqa: E731
    assert [shared_damage(step, r, 2, gathered) for r in range(2)] == [mine[1], mine[1]]
    assert damage(step) == mine[1]  # one process alone: every file

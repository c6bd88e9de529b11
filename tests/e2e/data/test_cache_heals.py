"""A damaged cache entry (here the token shard of the corpus, truncated) no longer fails every later
run: the next run rebuilds it, says so, and trains on the same data."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

FAST = ["debug=fast", "trainer.sample_tokens=0", "trainer.max_steps=2", "logger=none"]


def test_a_truncated_entry_is_rebuilt_by_the_next_run(run_zoo, tmp_path):
    cache = tmp_path / "cache"
    first = run_zoo(*FAST, env={"ZOO_CACHE": str(cache)})
    blocks = sorted(cache.rglob("tokens-00000.bin"))
    assert blocks, sorted(str(p) for p in cache.rglob("*"))[:20]
    blocks[0].write_bytes(blocks[0].read_bytes()[:1000])
    second = run_zoo(*FAST, env={"ZOO_CACHE": str(cache)})
    assert "rebuilding it" in second.stderr and "tokens-00000.bin has 1000 bytes" in second.stderr
    assert second.losses() == first.losses()

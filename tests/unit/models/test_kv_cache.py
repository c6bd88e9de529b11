"""The decode cache (zoo.models.kv_cache): the prompt then one token at a time gives the
logits of the whole context's forward, for GPT's learned positions and Llama's rotary
angles with grouped-query heads; generation with it equals generation without it, also past
the block (where the window slides and every position moves); the vocab-parallel argmax
equals the full vocabulary's, ties to the lowest id."""
from __future__ import annotations

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from zoo.models.causal_lm import decode, pick_tokens
from zoo.models.gpt import GPT, gpt_shape
from zoo.models.kv_cache import DecodeCache, decoding
from zoo.models.llama import LlamaForCausalLM, llama_shape


def _models():
    torch.manual_seed(0)
    return {"gpt": GPT(gpt_shape("tiny", 300, block_size=24)).eval(),
            "llama-gqa": LlamaForCausalLM(llama_shape("tiny", 300, block_size=24, n_head=4, n_kv_head=2)).eval()}


@pytest.mark.parametrize("name", ["gpt", "llama-gqa"])
def test_cached_logits_equal_the_whole_forward(name):
    model = _models()[name]
    idx = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(idx)
        with decoding(model, 24) as cache:
            parts = [model(idx[:, :7])]
            cache.advance(7)
            for t in range(7, 12):
                parts.append(model(idx[:, t:t + 1]))
                cache.advance(1)
        assert all(m.decode_cache is None for m in model.modules() if hasattr(m, "decode_cache"))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt", "llama-gqa"])
def test_generation_with_the_cache_equals_without_past_the_block(name):
    model = _models()[name]
    idx = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(2))

    def greedy(logits):
        return pick_tokens(logits[:, -1], temperature=0, top_k=0, generator=None)

    cached = model.generate(idx, 30, temperature=0)  # 35 tokens: the last 11 with a sliding window
    plain = decode(model, greedy, idx, 30, block_size=24, cache=None)
    assert cached.shape == (1, 35) and torch.equal(cached, plain)
    sampled = [model.generate(idx, 30, generator=torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(*sampled)


def test_a_cache_refuses_what_it_cannot_hold():
    cache = DecodeCache(4)
    k = torch.zeros(1, 2, 3, 8)
    cache.extend(object(), k, k)
    cache.advance(3)
    with pytest.raises(ValueError, match="one token, got 3"):
        cache.extend(object(), k, k)
    cache.extend(owner := object(), k[:, :, :1], k[:, :, :1])
    cache.advance(1)
    with pytest.raises(ValueError, match="holds 4 positions; 4 \\+ 1 exceed it"):
        cache.extend(owner, k[:, :, :1], k[:, :, :1])


def _argmax_ranks(rank: int, world: int) -> None:
    import torch.distributed as dist

    from zoo.parallel.cross_entropy import vocab_parallel_argmax

    full = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    full[0, 0, :] = 1.0  # every id ties: the lowest wins
    full[1, 1, 2] = full[1, 1, 6] = 50.0  # a tie across the two shards
    full[2, 3, 7] = 60.0  # on the second shard only
    shard = full.chunk(world, dim=-1)[rank]
    got = vocab_parallel_argmax(shard, dist.group.WORLD)
    assert torch.equal(got, full.argmax(-1)), (got, full.argmax(-1))
    assert got[0, 0] == 0 and got[1, 1] == 2 and got[2, 3] == 7


def test_vocab_parallel_argmax_is_the_full_vocabularys():
    run_ranks(2, _argmax_ranks)


def test_decoding_stops_at_the_stop_token_once_chosen():
    """A chat sample ends at the turn's end (Sampling.stop), not at max_new_tokens."""
    from zoo.models.causal_lm import decode

    picks = iter([5, 7, 2, 9, 9])
    out = decode(lambda tokens: None, lambda _out: torch.tensor([[next(picks)]]), torch.tensor([[1, 1]]), 5,
                 block_size=8, cache=None, stop=2)
    assert out.tolist() == [[1, 1, 5, 7, 2]]

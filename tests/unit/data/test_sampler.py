"""Tests for data_pipelines.sampler: rank coverage, determinism, resume, budgets, padding."""

import itertools

import numpy as np
import pytest

from data_pipelines.sampler import BucketedBatchSampler, padding_efficiency


def skewed_lengths(num_samples: int, seed: int = 0) -> list[int]:
    """Sequence lengths shaped like real text: lognormal, clipped to [8, 512]."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=4.5, sigma=0.8, size=num_samples), 8, 512).astype(int).tolist()


def make(lengths, dp_rank=0, dp_size=1, seed=0, **kwargs):
    kwargs.setdefault("batch_size", None if "max_tokens" in kwargs else 8)
    return BucketedBatchSampler(lengths, dp_rank=dp_rank, dp_size=dp_size, seed=seed, **kwargs)


def rank_batches(lengths, dp_size, epoch=0, **kwargs):
    """Batches of every rank for one epoch, as a list per rank."""
    out = []
    for rank in range(dp_size):
        sampler = make(lengths, dp_rank=rank, dp_size=dp_size, **kwargs)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def flatten(batches):
    return [i for batch in batches for i in batch]


LENGTHS = skewed_lengths(1003)  # 1003 is prime: partial batches and remainders show up
MODES = [dict(batch_size=8), dict(max_tokens=1024, pool_size=10)]


# --- coverage across data-parallel ranks -------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=["batch_size", "max_tokens"])
@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_ranks_are_disjoint_and_cover_the_epoch(dp_size, mode):
    (reference,) = rank_batches(LENGTHS, 1, **mode)  # the global batch order
    per_rank = rank_batches(LENGTHS, dp_size, **mode)

    assert len({len(batches) for batches in per_rank}) == 1, "ranks must get equal counts"
    assert len(per_rank[0]) == len(make(LENGTHS, dp_size=dp_size, **mode))
    seen = flatten(flatten(per_rank))
    assert len(seen) == len(set(seen)), "a sample was given to two ranks"
    # Everything but the documented remainder: the last len % dp_size global batches.
    kept = len(reference) - len(reference) % dp_size
    assert set(seen) == set(flatten(reference[:kept]))
    # Rank r takes global batches r, r + dp_size, ...
    for rank, batches in enumerate(per_rank):
        assert batches == reference[rank:kept:dp_size]


def test_batch_size_mode_drops_only_the_incomplete_batch_on_one_rank():
    (batches,) = rank_batches(LENGTHS, 1, batch_size=8)
    assert all(len(batch) == 8 for batch in batches)
    assert len(flatten(batches)) == 1003 - 1003 % 8


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_no_drop_last_covers_every_sample_and_pads_with_the_first_batches(dp_size):
    (reference,) = rank_batches(LENGTHS, 1, drop_last=False)
    per_rank = rank_batches(LENGTHS, dp_size, drop_last=False)

    assert len({len(batches) for batches in per_rank}) == 1
    assert set(flatten(flatten(per_rank))) == set(range(len(LENGTHS)))
    padding = -len(reference) % dp_size
    global_order = [b for step in itertools.zip_longest(*per_rank) for b in step]
    assert global_order == reference + reference[:padding]


def test_tiny_dataset_without_drop_last_still_gives_every_rank_a_batch():
    per_rank = rank_batches([5, 6, 7], 4, batch_size=2, drop_last=False)
    assert [len(batches) for batches in per_rank] == [1, 1, 1, 1]
    assert set(flatten(flatten(per_rank))) == {0, 1, 2}


# --- determinism -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES, ids=["batch_size", "max_tokens"])
def test_same_seed_and_epoch_give_the_same_batches(mode):
    assert rank_batches(LENGTHS, 2, epoch=3, **mode) == rank_batches(LENGTHS, 2, epoch=3, **mode)
    sampler = make(LENGTHS, **mode)
    assert list(sampler) == list(sampler), "iterating twice must replay the epoch"


@pytest.mark.parametrize("mode", MODES, ids=["batch_size", "max_tokens"])
def test_other_epoch_or_seed_changes_the_order_not_the_content(mode):
    (epoch0,) = rank_batches(LENGTHS, 1, epoch=0, **mode)
    (epoch1,) = rank_batches(LENGTHS, 1, epoch=1, **mode)
    (seed1,) = rank_batches(LENGTHS, 1, epoch=0, seed=1, **mode)
    assert epoch0 != epoch1 and epoch0 != seed1
    if "batch_size" in mode:  # token-budget batches may drop a different partial count
        assert len(epoch0) == len(epoch1)


def test_without_shuffle_the_epoch_does_not_matter_but_batches_are_still_bucketed():
    (epoch0,) = rank_batches(LENGTHS, 1, epoch=0, shuffle=False)
    (epoch5,) = rank_batches(LENGTHS, 1, epoch=5, shuffle=False)
    assert epoch0 == epoch5
    assert epoch0[0] == sorted(range(8 * 100), key=lambda i: LENGTHS[i])[:8]


# --- resuming mid-epoch ------------------------------------------------------------


def take_and_save(lengths, dp_size, steps, **kwargs):
    """Every rank takes `steps` batches; returns the samples taken and the saved state."""
    taken, states = [], []
    for rank in range(dp_size):
        sampler = make(lengths, dp_rank=rank, dp_size=dp_size, **kwargs)
        sampler.set_epoch(2)
        taken += flatten(itertools.islice(sampler, steps))
        states.append(sampler.state_dict())
    assert all(state == states[0] for state in states), "ranks must agree on the position"
    return taken, states[0]


def resume_rest(lengths, dp_size, state, **kwargs):
    rest = []
    for rank in range(dp_size):
        sampler = make(lengths, dp_rank=rank, dp_size=dp_size, **kwargs)
        sampler.load_state_dict(state)
        sampler.set_epoch(state["epoch"])  # the usual loop header must keep the position
        rest += flatten(sampler)
    return rest


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_resume_continues_exactly_where_it_stopped(dp_size):
    expected = rank_batches(LENGTHS, dp_size, epoch=2)
    for rank in range(dp_size):
        sampler = make(LENGTHS, dp_rank=rank, dp_size=dp_size)
        sampler.set_epoch(2)
        head = list(itertools.islice(sampler, 5))
        state = sampler.state_dict()
        assert state == {"epoch": 2, "batches_consumed": 5 * dp_size, "seed": 0}

        resumed = make(LENGTHS, dp_rank=rank, dp_size=dp_size)
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected[rank]
        assert resumed.state_dict()["batches_consumed"] == len(expected[rank]) * dp_size
        assert list(resumed) == expected[rank], "the next iteration starts the epoch over"


@pytest.mark.parametrize("old_dp, new_dp", [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_resume_with_another_dp_size_neither_repeats_nor_skips(old_dp, new_dp):
    # 60 batches of 10; after 6 steps the rest (54, 48 or 42) divides by the new dp_size,
    # so nothing is dropped and the union must be the whole epoch.
    lengths = skewed_lengths(600)
    before, state = take_and_save(lengths, old_dp, steps=6, batch_size=10)
    after = resume_rest(lengths, new_dp, state, batch_size=10)
    assert len(before) == 6 * old_dp * 10
    assert len(before + after) == len(set(before + after)), "a sample was seen twice"
    assert set(before + after) == set(range(600))


@pytest.mark.parametrize("old_dp, new_dp", [(2, 1), (1, 2), (3, 2)])
def test_resume_with_another_dp_size_in_token_mode(old_dp, new_dp):
    mode = dict(max_tokens=1024, pool_size=10)
    (reference,) = rank_batches(LENGTHS, 1, epoch=2, **mode)
    before, state = take_and_save(LENGTHS, old_dp, steps=6, **mode)
    after = resume_rest(LENGTHS, new_dp, state, **mode)
    assert len(before + after) == len(set(before + after))
    # Everything up to the new layout's dropped remainder of the global order.
    rest = len(reference) - state["batches_consumed"]
    assert set(before + after) == set(flatten(reference[: len(reference) - rest % new_dp]))


def test_resume_without_drop_last_pads_with_the_epochs_first_batches():
    (reference,) = rank_batches(LENGTHS, 1, epoch=2, drop_last=False)  # 126 batches
    before, state = take_and_save(LENGTHS, 2, steps=4, drop_last=False)
    after = resume_rest(LENGTHS, 3, state, drop_last=False)  # 118 left: 2 padding batches
    assert sorted(before + after) == sorted(flatten(reference) + flatten(reference[:2]))


def test_moving_to_a_new_epoch_forgets_the_restored_position():
    sampler = make(LENGTHS)
    sampler.load_state_dict({"epoch": 0, "batches_consumed": 10, "seed": 0})
    sampler.set_epoch(1)
    assert list(sampler) == rank_batches(LENGTHS, 1, epoch=1)[0]


# --- token budget and padding --------------------------------------------------------


def test_token_budget_is_never_exceeded_except_by_a_lone_overlong_sample():
    lengths = skewed_lengths(3000) + [700, 900, 520, 2000]  # four samples over the budget
    max_tokens = 512
    (batches,) = rank_batches(lengths, 1, max_tokens=max_tokens, pool_size=5)
    overlong = [b for b in batches if max(lengths[i] for i in b) * len(b) > max_tokens]
    assert sorted(overlong) == [[3000], [3001], [3002], [3003]]
    assert len(flatten(batches)) == len(lengths), "token mode with dp_size=1 drops nothing"


def test_bucketing_keeps_padding_low_where_random_batching_does_not():
    lengths = skewed_lengths(20_000, seed=1)
    (bucketed,) = rank_batches(lengths, 1, batch_size=32)
    (by_tokens,) = rank_batches(lengths, 1, max_tokens=8192)
    order = np.random.default_rng(0).permutation(len(lengths))
    random_batches = [order[i : i + 32] for i in range(0, len(order) - 31, 32)]

    assert padding_efficiency(bucketed, lengths) >= 0.9
    assert padding_efficiency(by_tokens, lengths) >= 0.9
    assert padding_efficiency(random_batches, lengths) < 0.6


def test_padding_efficiency_by_hand():
    assert padding_efficiency([[0, 1], [2]], [2, 4, 3]) == pytest.approx((2 + 4 + 3) / (8 + 3))


def test_works_as_a_dataloader_batch_sampler():
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.arange(100))
    sampler = make([10] * 100, batch_size=16)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    assert len(loader) == 6
    assert [b[0].tolist() for b in loader] == list(sampler)


# --- bad arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=8, max_tokens=512), "exactly one of"),
        (dict(batch_size=None), "exactly one of"),
        (dict(batch_size=0), r"batch_size=0 must be >= 1"),
        (dict(max_tokens=-1), r"max_tokens=-1 must be >= 1"),
        (dict(pool_size=0), r"pool_size=0 must be >= 1"),
        (dict(dp_rank=2, dp_size=2), r"dp_rank=2 is outside \[0, dp_size=2\)"),
        (dict(dp_size=0), r"dp_size=0 must be >= 1"),
        (dict(seed=-3), r"seed=-3 must be >= 0"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(LENGTHS, **kwargs)


@pytest.mark.parametrize(
    "lengths, message",
    [
        ([], "non-empty 1-D"),
        ([[1, 2]], "non-empty 1-D"),
        ([1.5, 2.0], "must be ints"),
        ([4, 0, 3], r"lengths\[1\]=0 must be >= 1"),
    ],
)
def test_bad_lengths_are_rejected(lengths, message):
    with pytest.raises(ValueError, match=message):
        make(lengths)


def test_too_few_batches_for_the_ranks_is_rejected():
    with pytest.raises(ValueError, match=r"12 samples make 3 batches .* fewer than dp_size=4"):
        make([5] * 12, batch_size=4, dp_rank=0, dp_size=4)


def test_bad_state_is_rejected():
    sampler = make(LENGTHS)
    with pytest.raises(ValueError, match=r"missing \['batches_consumed'\]"):
        sampler.load_state_dict({"epoch": 0, "seed": 0})
    with pytest.raises(ValueError, match="saved with seed=7 but this sampler has seed=0"):
        sampler.load_state_dict({"epoch": 0, "batches_consumed": 4, "seed": 7})
    with pytest.raises(ValueError, match="batches_consumed=-2"):
        sampler.load_state_dict({"epoch": 0, "batches_consumed": -2, "seed": 0})
    with pytest.raises(ValueError, match="epoch=-1 must be >= 0"):
        sampler.set_epoch(-1)


def test_padding_efficiency_rejects_empty_batches():
    with pytest.raises(ValueError, match="the 1 batches hold no tokens"):
        padding_efficiency([[]], [3])

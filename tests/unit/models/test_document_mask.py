"""data.document_mask (zoo.models.documents): a token attends to its own document only and its
position counts from the document's start, so a document packed after another gets the logits
it gets alone; under tensor and sequence parallelism as under one process."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.unit.parallel._dist import run_ranks
from tests.unit.parallel.test_gpt_tp import check_tp_equivalence
from zoo.families.registry import family_of_shape as spec_of
from zoo.models.documents import document_mask, document_positions
from zoo.models.gpt import gpt_shape
from zoo.models.llama import llama_shape
from zoo.parallel.build import build_model

CPU = torch.device("cpu")
END = 1
SHAPES = {"gpt": lambda: gpt_shape("tiny", 256, n_layer=2, block_size=32),
          "llama": lambda: llama_shape("tiny", 256, n_layer=2, block_size=32)}


def test_positions_restart_after_each_end_token_and_attention_stays_inside_the_document():
    idx = torch.tensor([[5, 6, END, 7, 8, 9, END, 3], [END, 2, 3, 4, 5, 6, 7, END]])
    positions = document_positions(idx, END)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 0, 1, 2, 3, 4, 5, 6]]
    mask = document_mask(positions)
    assert mask.shape == (2, 1, 8, 8)
    allowed = {(i, j) for i in range(8) for j in range(8) if mask[0, 0, i, j]}
    docs = [range(0, 3), range(3, 7), range(7, 8)]  # the end token belongs to the document it ends
    assert allowed == {(i, j) for d in docs for i in d for j in d if j <= i}
    assert not mask[1, 0, 1, 0] and mask[1, 0, 7, 1]  # a leading end token is a document of its own


def _documents():
    g = torch.Generator().manual_seed(0)
    first, second = torch.randint(2, 256, (1, 9), generator=g), torch.randint(2, 256, (1, 12), generator=g)
    return first, second, torch.cat([first, torch.tensor([[END]]), second], dim=1)


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_a_packed_document_gets_the_logits_it_gets_alone(family):
    shape = SHAPES[family]()
    plain = build_model(spec_of(shape), shape, seed=3, device=CPU)
    masked = build_model(spec_of(shape), shape, seed=3, device=CPU, document_end=END)
    first, second, block = _documents()
    with torch.no_grad():
        packed, alone = masked(block), masked(second)
        torch.testing.assert_close(packed[:, 10:], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(packed[:, :10], plain(block)[:, :10], rtol=1e-5, atol=1e-5)  # causal anyway
        assert (packed[:, 10:] - plain(block)[:, 10:]).abs().max() > 0.1  # without the mask it sees the first
        no_end = torch.cat([first, second], dim=1)
        torch.testing.assert_close(masked(no_end), plain(no_end), rtol=1e-5, atol=1e-5)
    loss = masked(block, torch.roll(block, -1, 1))  # the mask is differentiable through (and checkpointable)
    masked.activation_checkpointing = True
    masked.train()
    torch.testing.assert_close(masked(block, torch.roll(block, -1, 1)), loss)


def _tp_documents(rank, world, family, sequence_parallel):
    check_tp_equivalence(SHAPES[family](), sequence_parallel, document_end=END)
    shape = SHAPES[family]()
    import torch.distributed as dist

    from zoo.parallel.mappings import gather_from_tp_region

    tp = build_model(spec_of(shape), shape, seed=3, device=CPU, tp_group=dist.group.WORLD,
                     sequence_parallel=sequence_parallel, document_end=END)
    _, second, block = _documents()
    block, second = block[:, :20], second[:, :10]  # a length the two ranks' sequence shards divide
    with torch.no_grad():
        packed = gather_from_tp_region(tp(block), dist.group.WORLD)
        alone = gather_from_tp_region(tp(second), dist.group.WORLD)
    torch.testing.assert_close(packed[:, 10:], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_document_masking_under_tp2_with_sequence_parallelism_matches_one_process(family):
    run_ranks(2, _tp_documents, family, True)


def saved_tensors(model, inputs, targets) -> list:
    """(storage address, storage bytes, shape) of each tensor one step keeps for its backward
    (the backward is then run)."""
    kept = []

    def pack(t):
        kept.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), tuple(t.shape)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(inputs, targets)
    loss.backward()
    return kept


def _saved_masks(model, block) -> tuple[int, int]:
    """(mask-sized tensors autograd keeps for the backward, distinct storages among them)."""
    B, T = block.shape
    masks = [ptr for ptr, _, shape in saved_tensors(model, block, torch.roll(block, -1, 1))
             if len(shape) == 4 and shape[0] == B and shape[-2:] == (T, T)]
    return len(masks), len(set(masks))


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_the_backward_keeps_one_mask_a_micro_batch_not_one_a_layer(family, monkeypatch):
    """SDPA keeps its float form of the mask for the backward, a (B, 1, T, T) tensor per
    attention layer when each layer passes a boolean mask of its own (at 8,192 tokens, 268 MB
    a layer): every layer gets the one additive mask built from the micro-batch's positions,
    with the gradients the boolean masks give, to the bit."""
    import importlib

    shape = dataclasses.replace(SHAPES[family](), n_layer=4)
    _, _, block = _documents()
    masked = build_model(spec_of(shape), shape, seed=3, device=CPU, document_end=END)
    assert _saved_masks(masked, block) == (4, 1)
    module = importlib.import_module("zoo.models.kv_cache")  # the attention layers' keys_and_mask
    monkeypatch.setattr(module, "attention_mask", lambda positions, dtype: document_mask(positions))
    boolean = build_model(spec_of(shape), shape, seed=3, device=CPU, document_end=END)
    assert _saved_masks(boolean, block) == (4, 4)  # what the test guards against
    for a, b in zip(masked.parameters(), boolean.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)

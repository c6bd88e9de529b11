"""Context parallelism's pieces (zoo.parallel.context) against the unsharded computation: the
chunks a rank holds, the gathered keys' order, and on 2 and 4 gloo ranks the attention of a
rank's queries over the gathered keys and values (causal, and within documents that span the
ranks; the gathered keys kept, or gathered again in the backward), with its gradients for q, k
and v, and the block's mean loss, each equal to one device's full attention and loss on the
rank's chunks."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.unit.parallel._dist import run_ranks
from zoo.models.documents import document_mask, document_positions
from zoo.parallel.context import ContextShard, _global_order, _rank_order


def test_a_rank_holds_its_chunk_and_the_mirrored_one():
    x = torch.arange(16)[None]
    assert [ContextShard(None, r, 4).take(x).tolist() for r in range(4)] == [
        [[0, 1, 14, 15]], [[2, 3, 12, 13]], [[4, 5, 10, 11]], [[6, 7, 8, 9]]]
    with pytest.raises(ValueError, match="does not split into 2 x parallel.cp = 8 equal chunks"):
        ContextShard(None, 0, 4).take(torch.arange(12)[None])


@pytest.mark.parametrize("size", [2, 3, 4])
def test_the_gathered_chunks_go_to_global_order_and_back(size):
    x = torch.arange(2 * size * 3, dtype=torch.float32).view(1, 1, -1, 1)
    gathered = torch.cat([ContextShard(None, r, size).take(x, dim=2) for r in range(size)], dim=2)  # rank order
    assert torch.equal(_global_order(gathered, size), x)
    assert torch.equal(_rank_order(x, size), gathered)


def _attention_matches(rank: int, world: int, documents: bool, unbuilt: bool = False, recompute: bool = False,
                       window=None) -> None:
    torch.manual_seed(0)  # the same block on every rank
    B, H, T, D = 2, 3, 8 * world, 4
    q, k, v, w = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(4))
    idx = torch.randint(1, 9, (B, T))
    if documents:
        idx[0, [3, T // 2 + 1, T - 5]] = 0  # documents that cross the ranks' chunks
        idx[1, [T // 3]] = 0
    positions = document_positions(idx, 0) if documents else None
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = document_mask(positions) if documents else None
    if window is not None:  # Mistral's: no key `window` or more positions back
        i = torch.arange(T)
        band = ((i[:, None] - i[None, :]) < window) & (i[None, :] <= i[:, None])
        mask = band if mask is None else mask & band
    y = F.scaled_dot_product_attention(*full, attn_mask=mask, is_causal=mask is None)
    (y * w).sum().backward()

    shard = ContextShard(dist.group.WORLD, rank, world, recompute=recompute)  # gathered again in the backward
    shard.unbuilt_causal = unbuilt  # CUDA's causal_lower_right, or the mask the CPU's kernels get built
    shard.share(idx, positions)
    local = [shard.take(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    y_local = shard.attention(*local, lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                              window=window)
    (y_local * shard.take(w, dim=2)).sum().backward()
    torch.testing.assert_close(y_local, shard.take(y, dim=2))
    for mine, whole in zip(local, full):
        torch.testing.assert_close(mine.grad, shard.take(whole.grad, dim=2))


def _loss_matches(rank: int, world: int) -> None:
    torch.manual_seed(1)
    per_token, targets = torch.rand(3, 4 * world, dtype=torch.float64), torch.randint(0, 5, (3, 4 * world))
    targets[0, :5] = -100
    shard = ContextShard(dist.group.WORLD, rank, world)
    mine = shard.take(per_token).requires_grad_()
    loss = shard.mean_loss(mine, targets)
    kept = targets != -100
    torch.testing.assert_close(loss, per_token[kept].mean())
    loss.backward()  # this rank's share of the mean's gradient
    torch.testing.assert_close(mine.grad, shard.take(kept.double() / kept.sum()))


@pytest.mark.parametrize("world, unbuilt, recompute", [(2, True, False), (4, False, True)])
def test_attention_over_the_gathered_keys_is_one_devices_on_a_ranks_chunks(world, unbuilt, recompute):
    run_ranks(world, _attention_matches, False, unbuilt, recompute)


def test_attention_within_documents_that_span_the_ranks_is_one_devices():
    run_ranks(2, _attention_matches, True, False, True)


@pytest.mark.parametrize("world, documents, unbuilt", [(2, True, False), (4, False, True)])
def test_a_sliding_window_across_the_ranks_is_one_devices(world, documents, unbuilt):
    """Mistral's window shorter than the sequence (7 of 8 x world tokens): each chunk's mask also
    drops the keys that far back, on CUDA too (no unbuilt causal bias takes a window)."""
    run_ranks(world, _attention_matches, documents, unbuilt, True, 7)


def test_the_blocks_mean_loss_is_on_every_rank_and_its_gradient_shared():
    run_ranks(2, _loss_matches)


def test_the_cpu_masks_are_boolean_unless_each_layer_keeps_its_own():
    """Recomputed (or not differentiated), SDPA's float copy of a mask is a transient of one call:
    the shard keeps a byte an element. Kept for the backward by every layer's SDPA, the additive
    mask in the attention's dtype is the one they keep."""
    def dtype_of(recompute: bool, grad: bool) -> torch.dtype:
        shard = ContextShard(None, 0, 2, recompute=recompute)
        shard.unbuilt_causal = False
        shard.share(torch.zeros(1, 16, dtype=torch.int64), None)
        with torch.set_grad_enabled(grad):
            masks = shard.masks(4, torch.bfloat16, torch.device("cpu"))
        assert [tuple(m.shape) for m in masks] == [(4, 4), (4, 16)]
        return masks[0].dtype

    assert dtype_of(recompute=True, grad=True) == torch.bool
    assert dtype_of(recompute=False, grad=False) == torch.bool
    assert dtype_of(recompute=False, grad=True) == torch.bfloat16

"""Llama's grouped-query attention with a document mask: repeating the key/value heads (what
CUDA runs, so that the memory-efficient kernel takes the mask instead of the math kernel)
gives what SDPA's own enable_gqa gives, forward and backward; unmasked and off CUDA SDPA
repeats nothing."""
from __future__ import annotations

import torch

from zoo.models.documents import attention_mask
from zoo.models.llama import attend


def _inputs():
    torch.manual_seed(0)
    q = torch.randn(2, 8, 16, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(2))
    positions = torch.tensor([[*range(5), *range(7), *range(4)], [*range(16)]])  # three documents, then one
    return q, k, v, attention_mask(positions, q.dtype)


def test_repeated_kv_heads_equal_sdpa_s_grouped_query_attention_with_a_mask():
    outs, grads = [], []
    for expand in (True, False):
        q, k, v, mask = _inputs()
        y = attend(q, k, v, mask=mask, causal=False, groups=4, expand=expand)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([t.grad for t in (q, k, v)])
    torch.testing.assert_close(outs[0], outs[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_only_a_masked_grouped_call_on_cuda_repeats(monkeypatch):
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, *a, **kw: seen.append(
        (k.shape[1], kw.get("enable_gqa"))) or real(q, k, *a, **kw))
    q, k, v, mask = _inputs()
    attend(q, k, v, mask=mask, causal=False, groups=4)  # a CPU tensor: SDPA's grouped path
    attend(q, k, v, mask=None, causal=True, groups=4)
    assert seen == [(2, True), (2, True)]

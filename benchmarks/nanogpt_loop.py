"""A nanoGPT-style GPT-2 (Karpathy's model.py, written again here): one fused c_attn, sdpa
attention, tanh GELU, pre-LayerNorm, learned positions, tied head, the loss by
F.cross_entropy. The reference a hand-written single-device loop reaches; benchmarks time
it against zoo's GPT of the same dimensions."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Block(nn.Module):
    def __init__(self, C: int, H: int):
        super().__init__()
        self.n_head = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class NanoGPT(nn.Module):
    def __init__(self, *, vocab: int, block: int, layers: int, embd: int, heads: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(block, embd)
        self.h = nn.ModuleList(_Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        self.lm_head = nn.Linear(embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

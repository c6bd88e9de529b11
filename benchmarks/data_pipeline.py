"""Data pipelines on the embedded corpus: padding efficiency of random batching, bucketed
batching and packing (BERT-style samples at lengths 128 and 512), and tokenization
throughput against the rate at which training consumes tokens.

    python benchmarks/data_pipeline.py

Targets: bucketing >= 0.9 efficiency; tokenization >= 10x faster than training consumes.
"""
from __future__ import annotations

import tempfile
import time

import numpy as np
import torch

from zoo.families.registry import family_of_shape as spec_of


def main() -> None:
    from data_pipelines.corpus import pydoc_documents
    from data_pipelines.lm import pack, tokenize_documents
    from data_pipelines.sampler import BucketedBatchSampler, padding_efficiency
    from data_pipelines.tokenizer import train_gpt_tokenizer

    docs = pydoc_documents()
    with tempfile.TemporaryDirectory() as cache:
        tok_dir = str(train_gpt_tokenizer(docs, 4096, "bench", cache))
        tokenize_documents(docs[:4], tok_dir, num_proc=1)  # warm-up: loading the tokenizer, datasets
        t0 = time.perf_counter()
        doc_ids = tokenize_documents(docs, tok_dir, num_proc=1)
        tok_s = time.perf_counter() - t0
        n_tokens = sum(map(len, doc_ids))
        # BERT-style samples: paragraphs, each truncated to the sequence length.
        paragraphs = [p for d in docs for p in d.split("\n\n") if p.strip()]
        para_ids = tokenize_documents(paragraphs, tok_dir, num_proc=1)
        eos = 0
        print(f"corpus: {len(docs)} documents, {len(paragraphs)} paragraphs, {n_tokens:,} tokens")
        print(f"{'length':>6} {'random':>8} {'bucketed':>9} {'packed':>7}   (real tokens / padded slots, batch 32)")
        for length in (128, 512):
            lengths = np.array([min(len(p) + 2, length) for p in para_ids])  # + [CLS] [SEP]
            rng = np.random.default_rng(0)
            order = rng.permutation(len(lengths))
            random_batches = [order[i:i + 32] for i in range(0, len(order) - 31, 32)]
            bucketed = list(BucketedBatchSampler(lengths, batch_size=32, dp_rank=0, dp_size=1, seed=0))
            blocks, tail = pack(para_ids, eos, length - 1)
            packed = blocks.size / (blocks.size + tail)  # every slot is a real token; only the tail is dropped
            print(f"{length:>6} {padding_efficiency(random_batches, lengths):>8.3f} "
                  f"{padding_efficiency(bucketed, lengths):>9.3f} {packed:>7.3f}")

    # Training consumption of the default main job (tiny GPT, global batch 32 x 128 tokens).
    from zoo.models.gpt import gpt_shape
    from zoo.parallel.build import build_model

    model = build_model(spec_of(gpt_shape("tiny", 4096)), gpt_shape("tiny", 4096), seed=0, device=torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 4096, (32, 128))
    model(x, x).backward()
    t0 = time.perf_counter()
    for _ in range(3):
        model(x, x).backward()
        opt.step()
        opt.zero_grad()
    train_tps = 3 * 32 * 128 / (time.perf_counter() - t0)
    tok_tps = n_tokens / tok_s
    print(f"tokenization: {tok_tps:,.0f} tokens/s (datasets.map, batched, 1 process); training consumes "
          f"{train_tps:,.0f} tokens/s: {tok_tps / train_tps:.0f}x faster")


if __name__ == "__main__":
    main()

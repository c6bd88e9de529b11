"""What `data.document_mask=true` costs: a training step (forward + backward) of GPT and Llama
with attention kept inside documents against the same step with plain causal attention, same
model, batch and threads, in alternating rounds (the median of each).

The batch is random tokens with an end-of-text token every `--doc-tokens` tokens on average
(positions drawn at random), so blocks hold several documents as packed data does. Also
printed: the share of the masked step spent building masks (once per attention layer) and
which attention kernel SDPA uses (on CPU the flash kernel takes a boolean mask; on CUDA a
boolean mask selects the memory-efficient kernel, flash attention takes none).

    python benchmarks/document_mask.py [--layers 4 --embd 256 --heads 4 --block 512 --batch 8 --rounds 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.documents import document_mask, document_positions
from zoo.models.gpt import gpt_shape
from zoo.models.llama import llama_shape
from zoo.parallel.build import build_model

END = 0


def _batch(a) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 4096, (a.batch, a.block + 1), generator=g)
    ends = torch.rand(x.shape, generator=g) < 1.0 / a.doc_tokens
    return x.masked_fill(ends, END)


def _step_seconds(model, x) -> float:
    t0 = time.perf_counter()
    model(x[:, :-1], x[:, 1:]).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    from gpt_vs_hf import positive  # benchmarks/ is the script's own directory on sys.path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=positive, default=4)
    p.add_argument("--embd", type=positive, default=256)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--block", type=positive, default=512)
    p.add_argument("--batch", type=positive, default=8)
    p.add_argument("--doc-tokens", type=positive, default=128, help="mean document length in tokens")
    p.add_argument("--rounds", type=positive, default=7)
    a = p.parse_args()
    if a.embd % a.heads or (a.embd // a.heads) % 2:
        p.error(f"--embd {a.embd} must divide into --heads {a.heads} heads of an even width (Llama's rotary pairs); "
                f"e.g. --embd {a.heads * 64}")
    x = _batch(a)
    docs = int((x[:, :-1] == END).sum()) + a.batch
    print(f"{torch.get_num_threads()} thread(s); batch {a.batch} x {a.block} tokens, {docs} documents "
          f"(about {a.batch * a.block / docs:.0f} tokens each); {a.layers} layers, d {a.embd}, {a.heads} heads")
    positions = document_positions(x[:, :-1], END)
    t0 = time.perf_counter()
    for _ in range(20):
        document_mask(positions)
    mask_s = (time.perf_counter() - t0) / 20
    shapes = {"gpt": gpt_shape("tiny", 4096, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block),
              "llama": llama_shape("tiny", 4096, n_layer=a.layers, n_head=a.heads, n_kv_head=a.heads, n_embd=a.embd,
                                   intermediate_size=int(a.embd * 8 / 3), block_size=a.block)}
    print(f"{'':8}{'causal ms':>11}{'masked ms':>11}{'ratio':>8}{'mask build':>12}")
    for name, shape in shapes.items():
        causal = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"))
        masked = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"), document_end=END)
        for m in (causal, masked):
            _step_seconds(m, x)  # warm-up
        times = {"causal": [], "masked": []}
        for _ in range(a.rounds):
            times["causal"].append(_step_seconds(causal, x))
            times["masked"].append(_step_seconds(masked, x))
        c, m = (statistics.median(times[k]) for k in ("causal", "masked"))
        print(f"{name:8}{c * 1e3:11.1f}{m * 1e3:11.1f}{m / c:8.3f}{a.layers * mask_s / m:11.1%}")
    print("ratio: the masked step's time over the causal step's (median of the rounds); mask build: its share of "
          "the masked step (one (B, 1, T, T) mask per attention layer)")


if __name__ == "__main__":
    main()

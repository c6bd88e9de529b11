"""What `data.document_mask=true` costs: a training step (forward + backward) of GPT and Llama
with attention kept inside documents against the same step with plain causal attention, same
model, batch and threads, in alternating rounds (the median of each).

The batch is random tokens with an end-of-text token every `--doc-tokens` tokens on average
(positions drawn at random), so blocks hold several documents as packed data does. Also
printed: the share of the masked step spent building its mask (once per micro-batch) and
which attention kernel SDPA uses (on CPU the flash kernel takes a boolean mask; on CUDA a
boolean mask selects the memory-efficient kernel, flash attention takes none).

Then memory: what a step keeps for its backward (autograd's saved tensors, each storage
counted once), causal against masked, and masked as it was before the mask was shared: a
boolean mask per attention layer, which SDPA turns into a float copy per call and keeps.

    python benchmarks/document_mask.py [--layers 4 --embd 256 --heads 4 --block 512 --batch 8 --rounds 7]
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time
from unittest import mock

import torch

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.documents import attention_mask, document_mask, document_positions
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


def _saved_mb(model, x) -> float:
    """MB that autograd keeps between the forward and the backward of one step."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values()) / 1e6


def _memory(shapes, x) -> None:
    print(f"{'saved MB':8}{'causal':>11}{'masked':>11}{'a mask':>9}{'before':>10}{'masked/causal':>15}{'before/causal':>15}")
    for name, shape in shapes.items():
        causal = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"))
        masked = build_model(spec_of(shape), shape, seed=0, device=torch.device("cpu"), document_end=END)
        c, m = _saved_mb(causal, x), _saved_mb(masked, x)
        module = importlib.import_module("zoo.models.kv_cache")  # where the attention layers build it
        with mock.patch.object(module, "attention_mask", lambda positions, dtype: document_mask(positions)):
            before = _saved_mb(masked, x)
        one = x.shape[0] * (x.shape[1] - 1) ** 2 * 4 / 1e6
        print(f"{name:8}{c:11.1f}{m:11.1f}{one:9.1f}{before:10.1f}{m / c:15.3f}{before / c:15.3f}")
    print("saved MB: kept for the backward of one step; a mask: one fp32 (B, 1, T, T) mask; before: a boolean "
          "mask passed to each attention layer, as up to this benchmark's commit")


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
    fresh = [positions.clone() for _ in range(20)]  # the mask is kept on its positions tensor: a new one each
    t0 = time.perf_counter()
    for pos in fresh:
        attention_mask(pos, torch.float32)
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
        print(f"{name:8}{c * 1e3:11.1f}{m * 1e3:11.1f}{m / c:8.3f}{mask_s / m:11.1%}")
    print("ratio: the masked step's time over the causal step's (median of the rounds); mask build: its share of "
          "the masked step (one (B, 1, T, T) mask per pipeline stage and micro-batch)")
    _memory(shapes, x)


if __name__ == "__main__":
    main()

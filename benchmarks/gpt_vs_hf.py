"""GPT training throughput: zoo (our GPT through the DeepSpeed engine, the path
`python -m zoo.train` takes) against Hugging Face's GPT2LMHeadModel with a plain torch
loop, same dimensions, batch, AdamW, dtype and thread count, in one run.

    python benchmarks/gpt_vs_hf.py [--layers 4 --embd 256 --heads 4 --block 256 --batch 8 --steps 20]

Prints tokens/s of both and the ratio zoo / HF (target >= 1.0: the engine adds no overhead).
"""
from __future__ import annotations

import argparse
import os
import socket
import time

import torch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interleaved(steps_a, steps_b, steps: int, rounds: int = 5, warmup: int = 2):
    """Median seconds per step of a and b, timed in alternating rounds so that a busy
    machine slows both alike."""
    for _ in range(warmup):
        steps_a()
        steps_b()
    per_round = max(1, steps // rounds)
    times = {0: [], 1: []}
    for _ in range(rounds):
        for i, step in enumerate((steps_a, steps_b)):
            t0 = time.perf_counter()
            for _ in range(per_round):
                step()
            times[i].append((time.perf_counter() - t0) / per_round)
    return [sorted(t)[len(t) // 2] for t in (times[0], times[1])]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    a = p.parse_args()
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    from zoo.build import build_model
    from zoo.engine import param_groups
    from zoo.models.gpt import gpt_shape

    deepspeed.init_distributed("gloo")
    threads = torch.get_num_threads()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)

    shape = gpt_shape("tiny", a.vocab, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block)
    model = build_model(shape, seed=0, device=torch.device("cpu"))
    ds = {"train_batch_size": a.batch, "train_micro_batch_size_per_gpu": a.batch, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "torch_adam": True}},
          "bf16": {"enabled": a.dtype == "bf16"}, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, config=ds, model_parameters=param_groups(model, 0.1))

    def zoo_step():
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    hf = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.block, n_embd=a.embd, n_layer=a.layers,
                                    n_head=a.heads, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                    attn_implementation="sdpa")).to(dtype)
    opt = torch.optim.AdamW(param_groups(hf, 0.1), lr=1e-4)

    def hf_step():
        loss = hf(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    hf_s, zoo_s = interleaved(hf_step, zoo_step, a.steps)
    hf_tps, zoo_tps = a.batch * a.block / hf_s, a.batch * a.block / zoo_s
    print(f"GPT L={a.layers} C={a.embd} H={a.heads} T={a.block} V={a.vocab}, batch {a.batch}, {a.dtype}, "
          f"{threads} threads, median of 5 alternating rounds over {a.steps} steps each")
    print(f"huggingface GPT2LMHeadModel + torch AdamW: {hf_tps:,.0f} tokens/s")
    print(f"zoo GPT + DeepSpeed engine:               {zoo_tps:,.0f} tokens/s")
    print(f"ratio zoo / huggingface: {zoo_tps / hf_tps:.3f}")


if __name__ == "__main__":
    main()

"""Training throughput: zoo's GPT (or Llama) through the DeepSpeed engine, the path
`python -m zoo.train` takes, against transformers' GPT2LMHeadModel (or LlamaForCausalLM)
with a plain torch loop, same dimensions, batch, AdamW, dtype and thread count, in one run.

    python benchmarks/gpt_vs_hf.py [--layers 4 --embd 256 --heads 4 --block 256 --batch 8 --steps 20]
    python benchmarks/gpt_vs_hf.py --family llama [--kv-heads 2 --inter 704]   # GQA, SwiGLU, RoPE
    python benchmarks/gpt_vs_hf.py --compile [--layers 6 --embd 384 --heads 6]  # zoo also with model.compile
    python benchmarks/gpt_vs_hf.py --device cuda --dtype bf16 --compile           # on a GPU (benchmarks/gpu_check)

Prints tokens/s of each and the ratios zoo / HF and, for the GPT, zoo / a nanoGPT-style
model in a plain loop (benchmarks/nanogpt_loop.py). With --compile zoo runs twice, eager
and compiled (as model.compile does it; compilation in the warm-up, not timed), against
the eager references: the targets are >= 1.0 eager and, compiled, >= 1.5x HF and >= 1.2x
the nanoGPT loop.
"""
from __future__ import annotations

import argparse
import os
import socket
import time
from statistics import median

import torch

from zoo.families.registry import family_of_shape as spec_of


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interleaved(steps: dict, steps_per_round: int, rounds: int = 5, warmup: int = 2, sync: bool = False) -> dict:
    """Seconds per step of each of `steps` (name -> fn) in every round, timed in alternating
    rounds (the order reversed every other round) so that a busy machine slows all alike;
    `sync`: wait for the GPU's queue before each clock reading."""
    wait = torch.cuda.synchronize if sync else (lambda: None)
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {name: [] for name in steps}
    for r in range(rounds):
        for name in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            wait()
            t0 = time.perf_counter()
            for _ in range(steps_per_round):
                steps[name]()
            wait()
            times[name].append((time.perf_counter() - t0) / steps_per_round)
    return times


def positive(text: str) -> int:
    """argparse's type for a count: a whole number >= 1 (else the usage line and exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be >= 1")
    return n


def arguments(argv=None, extra=None) -> argparse.Namespace:
    """The command line; `extra(parser)` adds a script's own options (benchmarks/compile_ceiling.py)."""
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=positive, default=4)
    p.add_argument("--embd", type=positive, default=256)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--block", type=positive, default=256)
    p.add_argument("--vocab", type=positive, default=4096)
    p.add_argument("--batch", type=positive, default=8)
    p.add_argument("--steps", type=positive, default=20)
    p.add_argument("--rounds", type=positive, default=5, help="alternating rounds; --steps are split across them")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: zoo's bf16 (DeepSpeed's, fp32 master weights); the references in autocast "
                        "with fp32 weights, as nanoGPT's train.py and transformers' Trainer train in bf16")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--family", choices=["gpt", "llama"], default="gpt")
    p.add_argument("--kv-heads", type=positive, default=2, help="llama: grouped-query attention's key/value heads")
    p.add_argument("--inter", type=positive, default=704, help="llama: the SwiGLU MLP's intermediate size")
    p.add_argument("--compile", action="store_true", help="zoo also compiled (model.compile)")
    if extra is not None:
        extra(p)
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; run on a GPU machine or drop --device")
    if a.embd % a.heads:
        p.error(f"--embd {a.embd} is not divisible by --heads {a.heads}: pick heads that divide it")
    return a


def start_single_rank(device: str) -> None:
    """One rank's process group, as zoo's ranks start (DeepSpeed's shm op and Muon skipped)."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    import deepspeed

    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()
    lean_start.skip_muon_import({})
    deepspeed.init_distributed("nccl" if device == "cuda" else "gloo")


def batch_of(a) -> tuple:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.block), generator=g)
    return x.to(a.device), y.to(a.device)


def zoo_step_of(a, shape, x, y, *, compiled: bool):
    """One training step of zoo's model through the DeepSpeed engine, as zoo.train builds it:
    zoo's AdamW handed to DeepSpeed, no all-reduce over one replica, model.compile's compile."""
    import deepspeed

    from zoo.engine import optimizers, param_groups, skip_single_replica_allreduce
    from zoo.parallel.build import build_model

    model = build_model(spec_of(shape), shape, seed=0, device=torch.device(a.device))
    if compiled:
        from zoo.models.compile import compile_model

        compile_model(model)
    groups = param_groups(model, 0.1)
    config = {"train_batch_size": a.batch, "train_micro_batch_size_per_gpu": a.batch, "gradient_clipping": 1.0,
              "bf16": {"enabled": a.dtype == "bf16"}, "zero_optimization": {"stage": 0}, "steps_per_print": 10**9}
    optimizer = optimizers.build({"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "torch_adam": True}},
                                 groups)
    engine, *_ = deepspeed.initialize(model=model, config=config, optimizer=optimizer, model_parameters=groups)
    skip_single_replica_allreduce(engine, dp=1)

    def zoo_step():
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
    return zoo_step


def plain_step_of(a, model, loss_of):
    """A hand-written loop's step: fp32 weights, torch's AdamW, the norm clipped; in bf16 the
    forward under autocast (mixed precision, as nanoGPT's train.py and transformers' Trainer)."""
    from zoo.engine import param_groups

    model.to(a.device)
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step():
        with autocast:
            loss = loss_of(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def reference_steps(a, hf, name, x, y) -> dict:
    """The references' steps: transformers' model and, for the GPT, the nanoGPT-style one."""
    steps = {name: plain_step_of(a, hf, lambda m: m(input_ids=x, labels=y).loss)}
    if a.family == "gpt":
        from nanogpt_loop import NanoGPT

        nano = NanoGPT(vocab=a.vocab, block=a.block, layers=a.layers, embd=a.embd, heads=a.heads)
        steps["nanoGPT loop"] = plain_step_of(a, nano, lambda m: m(x, y))
    return steps


def main() -> None:
    a = arguments()
    start_single_rank(a.device)
    threads = torch.get_num_threads()
    x, y = batch_of(a)
    shape, hf, name = models(a)
    steps = reference_steps(a, hf, name, x, y)
    steps["zoo"] = zoo_step_of(a, shape, x, y, compiled=False)
    if a.compile:
        steps["zoo compiled"] = zoo_step_of(a, shape, x, y, compiled=True)
    per_round = max(1, a.steps // a.rounds)
    times = interleaved(steps, per_round, rounds=a.rounds, sync=a.device == "cuda")
    tps = {n: a.batch * a.block / median(t) for n, t in times.items()}
    extra = f" KV={a.kv_heads} FFN={a.inter}" if a.family == "llama" else ""
    where = torch.cuda.get_device_name() if a.device == "cuda" else f"{threads} threads"
    print(f"{a.family} L={a.layers} C={a.embd} H={a.heads}{extra} T={a.block} V={a.vocab}, batch {a.batch}, "
          f"{a.dtype}, {where}, median of {a.rounds} alternating rounds of {per_round} steps each")
    for n, v in tps.items():
        print(f"{n:>24}: {v:,.0f} tokens/s")
    for mine in [n for n in tps if n.startswith("zoo")]:
        for ref in [n for n in tps if not n.startswith("zoo")]:
            paired = sorted(b / m for m, b in zip(times[mine], times[ref]))  # the same round's two timings
            print(f"ratio {mine} / {ref}: {tps[mine] / tps[ref]:.3f}   (per round: median {median(paired):.3f}, "
                  f"{sum(r >= 1 for r in paired)} of {len(paired)} rounds >= 1, range {paired[0]:.3f}-{paired[-1]:.3f})")


def models(a):
    """(zoo's shape, transformers' model, its class name) of the same dimensions."""
    if a.family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        from zoo.models.llama import llama_shape

        shape = llama_shape("tiny", a.vocab, n_layer=a.layers, n_head=a.heads, n_kv_head=a.kv_heads, n_embd=a.embd,
                            intermediate_size=a.inter, block_size=a.block)
        hf = LlamaForCausalLM(LlamaConfig(vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.inter,
                                          num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                          num_key_value_heads=a.kv_heads, max_position_embeddings=a.block,
                                          tie_word_embeddings=False, attn_implementation="sdpa"))
        return shape, hf, "LlamaForCausalLM"
    from transformers import GPT2Config, GPT2LMHeadModel

    from zoo.models.gpt import gpt_shape

    shape = gpt_shape("tiny", a.vocab, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=a.vocab, n_positions=a.block, n_embd=a.embd, n_layer=a.layers,
                                    n_head=a.heads, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0,
                                    attn_implementation="sdpa"))
    return shape, hf, "GPT2LMHeadModel"


if __name__ == "__main__":
    main()

"""Context parallelism (`parallel.cp`): how much longer a sequence trains, what a rank keeps, and
its step time against tensor parallelism's sequence parallelism on the same ranks.

1. The longest `model.block_size` whose activations fit a rank's budget (`--budget-mb`), for a
   GPT of fixed width under cp = 1, 2 and 4, with the gathered keys and values gathered again in
   the backward (parallel.cp_recompute=true, the default) and kept (false): on cp gloo ranks
   each forward keeps what autograd saves for its backward (each storage once, the weights left
   out; the largest over the ranks), found by doubling then bisecting the block (in steps of
   `--step` tokens). cp=1 is one rank holding whole sequences, as a rank of a data-parallel job.
2. At each length found, that rank's kept bytes against the planner's estimate
   (`zoo.plan.memory.layout_memory`: its activations less the backward's transient, the
   logits' gradient, which a forward does not hold).
3. The training step at one length (`--time-block`): `python -m zoo.train` under parallel.cp=2
   (recomputing, and keeping) and under tp=2 with sequence parallelism, all on 2 ranks, same
   model and batch, the median step of `--steps` (the first left out).

Attention is the all-gather variant (zoo.parallel.context): the keys and values gathered over
the cp group, each local chunk against the keys up to its end. On this CPU its causal mask is
built once a forward (c x (2cp+1)c elements, c = block / 2cp; boolean where the attention is
recomputed, floats where each layer keeps it: the planner counts it, cluster
`builds_causal_masks`); on CUDA torch's causal_lower_right needs none.

    python benchmarks/context_parallel.py [--embd 512 --layers 2 --heads 8 --budget-mb 400]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB = 4096
REPO = Path(__file__).resolve().parents[1]


def _model(a, block: int, shard):
    from zoo.models.documents import ReadsContext
    from zoo.models.gpt import GPT, gpt_shape

    torch.manual_seed(0)
    model = GPT(gpt_shape("tiny", VOCAB, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=block))
    if shard is not None:
        for m in model.modules():
            if isinstance(m, ReadsContext):
                m.context = shard
    return model


def _kept_bytes(a, block: int, shard, masks: bool) -> int:
    """What one forward of a micro-batch of 1 keeps for its backward on this rank; `masks`: with
    the causal masks the CPU builds (a checkpointed attention holds them outside autograd's
    saved tensors; CUDA builds none)."""
    model = _model(a, block, shard)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, VOCAB, (1, block + 1), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x[:, :-1], x[:, 1:])
    built = {m.untyped_storage().data_ptr(): m.untyped_storage().nbytes() for m in shard._masks or []} if shard else {}
    del loss
    if masks:
        storages.update(built)
    else:
        storages = {ptr: n for ptr, n in storages.items() if ptr not in built}
    return sum(storages.values())


def _longest(rank: int, cp: int, recompute: bool, masks: bool, port: int, a, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    from zoo.parallel.context import ContextShard

    shard = ContextShard(dist.group.WORLD, rank, cp, recompute=recompute) if cp > 1 else None
    budget = a.budget_mb * 1e6
    measured = {}

    def fits(block: int) -> bool:
        kept = torch.tensor(float(_kept_bytes(a, block, shard, masks)))
        dist.all_reduce(kept, op=dist.ReduceOp.MAX)  # the heaviest rank; every rank decides alike
        measured[block] = kept.item()
        return kept.item() <= budget

    lo, hi = 0, a.step  # the longest that fits is in [lo, hi)
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > a.step:
        mid = (lo + hi) // 2 // a.step * a.step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if rank == 0:
        out.put((cp, lo, measured.get(lo)))
    from zoo.worker import leave_process_group

    leave_process_group()  # not left to the interpreter's teardown (tests/README.md: gloo's threads then abort)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def longest(a, cp: int, recompute: bool, masks: bool):
    queue = mp.get_context("spawn").Queue()
    mp.spawn(_longest, args=(cp, recompute, masks, _free_port(), a, queue), nprocs=cp, join=True)
    return queue.get()


def planned_kept(a, block: int, cp: int, recompute: bool, masks: bool) -> float:
    """The planner's activations of one rank (micro-batch 1, fp32) less the backward's transient."""
    from zoo.config.schema import ModelConfig
    from zoo.plan.describe import describe_model
    from zoo.plan.layout import PlanLayout
    from zoo.plan.memory import layout_memory

    model = ModelConfig(family="gpt", size="tiny", n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=block,
                        vocab_size=VOCAB)
    desc = describe_model(model, VOCAB)
    mem = layout_memory(desc, PlanLayout(tp=1, pp=1, dp=1, cp=cp), dtype="fp32", sequence_parallel=False,
                        builds_causal_masks=masks, cp_recompute=recompute)
    transient = block / cp * desc.head.backward_extra.bytes_per_token(4, 1, False)
    if cp > 1 and recompute:  # one layer's gathered keys and values, a transient of the backward
        transient += block * (1 - 1 / cp) * desc.kv_width * 4
    return mem.activations - transient


def step_ms(a, layout) -> float:
    """The median step of a short zoo.train run (its first step left out), in milliseconds."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "zoo.train", f"hydra.run.dir={d}", "model=gpt", f"model.n_layer={a.layers}",
               f"model.n_head={a.heads}", f"model.n_embd={a.embd}", f"model.block_size={a.time_block}",
               f"trainer.max_steps={a.steps}", "trainer.global_batch_size=2", "trainer.micro_batch_size=2",
               "trainer.log_every=1", "trainer.eval_batches=0", "trainer.sample_tokens=0", "logger=none",
               "trainer.progress=false", "optim.warmup_steps=1", *layout]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{' '.join(layout)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in (Path(d) / "metrics.jsonl").read_text().splitlines()]
        times = [r["step_time_s"] * 1e3 for r in records if "step_time_s" in r][1:]
        return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--embd", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--budget-mb", type=float, default=400.0, help="a rank's activation budget")
    p.add_argument("--step", type=int, default=256, help="block sizes searched in steps of this (a multiple of 8)")
    p.add_argument("--cps", default="1,2,4", help="the cp sizes of parts 1 and 2 (empty: the step time only)")
    p.add_argument("--time-block", type=int, default=2048)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    print(f"GPT n_embd={a.embd} n_layer={a.layers} n_head={a.heads} vocab {VOCAB}, fp32, micro-batch 1; a rank's "
          f"budget {a.budget_mb:.0f} MB of activations; attention: all-gathered keys and values", flush=True)
    base = None
    variants = [(True, True, "recomputed, the CPU's causal mask counted"),
                (True, False, "recomputed, without the CPU's mask (what CUDA keeps)"),
                (False, True, "kept, the CPU's mask counted")]
    for cp in (int(c) for c in a.cps.split(",") if c):
        for recompute, masks, what in (variants if cp > 1 else variants[:1]):
            _, block, kept = longest(a, cp, recompute, masks)
            base = base or (block if cp == 1 else None)
            plan = planned_kept(a, block, cp, recompute, masks)
            ratio = f", {block / base:.2f}x cp=1's" if base and cp > 1 else ""
            how = f" (keys and values {what})" if cp > 1 else ""
            print(f"cp={cp}{how}: longest block {block} tokens{ratio}; kept {kept / 1e6:.0f} MB a rank, the planner "
                  f"{plan / 1e6:.0f} MB (measured / planned {kept / plan:.3f})", flush=True)
    times = {name: step_ms(a, layout) for name, layout in (
        ("cp=2", ["parallel=ddp", "parallel.cp=2"]),
        ("cp=2 keeping the keys", ["parallel=ddp", "parallel.cp=2", "parallel.cp_recompute=false"]),
        ("tp=2 with sequence parallelism", ["parallel=tp", "parallel.zero_stage=0", "parallel.sequence_parallel=true"]))}
    tp = times["tp=2 with sequence parallelism"]
    print(f"step at block {a.time_block}, 2 ranks, micro-batch 2: "
          + ", ".join(f"{name} {ms:.0f} ms ({ms / tp:.2f}x tp's)" for name, ms in times.items()))


if __name__ == "__main__":
    main()

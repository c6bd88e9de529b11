"""What a training step holds per parameter beyond the model states the planner counts, by ZeRO
stage and data-parallel degree: the data for the planner's `engine_bytes_per_param`
(conf/cluster/cpu.yaml), at TinyLlama-1.1B's width (d 2048, 32 heads, 4 kv heads, MLP 5632).

    python benchmarks/step_memory.py [--only z0-tp4 z1-dp2 ...] [--micro 2] [--optim adamw] [--allocator auto]

Each case builds the model on its gloo ranks (zoo.parallel.build, the engine through
zoo.engine.initialize_engine: torch's fused AdamW, fp32), runs two steps of 4 micro-batches of
2 x 128 tokens, and reads each rank's high-water resident memory (VmHWM) against its memory
before the model (VmRSS at the start). Per parameter of the rank's share (its tp/pp share,
before ZeRO-3 partitions it): the measured bytes, what the planner counts without its engine
term and the runtime (zoo.plan.memory: the states, the reduce bucket where ZeRO fills it,
ZeRO-3's two gathered layers, the activations), and the rest: what the engine holds beyond
them (DeepSpeed's flat gradient partitions and their fp32 copies, the gradients of a layer
before their reduce-scatter, the allocator), which the cpu preset's engine_bytes_per_param
gives as a + b / dp. The ranks run on the malloc zoo's launcher would give them
(`--allocator`, run.cpu_allocator: auto preloads tcmalloc where installed; glibc's keeps much of
what a step frees, engine_bytes_per_param_glibc).
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path

CASES = {  # name: (layers, vocab, tp, dp, zero_stage)
    "z0-tp4": (4, 32000, 4, 1, 0),
    "z1-tp4": (4, 32000, 4, 1, 1),
    "z1-dp2": (1, 8000, 1, 2, 1),
    "z1-dp4": (1, 8000, 1, 4, 1),
    "z2-dp2": (1, 8000, 1, 2, 2),
    "z2-dp4": (1, 8000, 1, 4, 2),
    "z3-dp2": (1, 8000, 1, 2, 3),
    "z3-dp4": (1, 8000, 1, 4, 3),
}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise KeyError(key)


def _rank(rank: int, world: int, port: int, name: str, out: str, micro: int = 2, optim: str = "adamw") -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from memory_phases import join_gloo

    join_gloo(rank, world, port)
    import torch
    import torch.distributed as dist

    from zoo.config.schema import Config, ModelConfig
    from zoo.engine import deepspeed_config, initialize_engine
    from zoo.engine import state as engine_state
    from zoo.families.registry import family, model_dims
    from zoo.parallel.build import ZeroThree, build
    from zoo.parallel.topology import Layout, build_grid, tp_group

    layers, vocab, tp, dp, zero = CASES[name]
    layout = Layout(tp=tp, pp=1, dp=dp, zero_stage=zero)
    model_cfg = ModelConfig(family="llama", size="tinyllama-1.1b", n_layer=layers, block_size=128)
    shape = model_dims(model_cfg, vocab)
    cfg = Config(model=model_cfg)
    cfg.optim.name = optim
    cfg.trainer.micro_batch_size, cfg.trainer.global_batch_size = micro, 4 * micro * dp
    grid = build_grid(layout)
    start = _status("VmRSS")
    zero3 = ZeroThree(config=deepspeed_config(cfg, layout), group=grid.get_data_parallel_group(),
                      dtype=torch.float32, mpu=grid) if zero == 3 else None
    model = build(family("llama"), shape, layout, seed=0, device=torch.device("cpu"), tp_group=tp_group(grid),
                  partition_method="parameters", activation_checkpointing=False, zero3=zero3)
    def held(p):  # the rank's tp share of a parameter, before ZeRO-3 partitions it
        return engine_state.full_shape(p).numel() if zero == 3 else p.numel()

    share = sum(held(p) for p in {id(p): p for p in model.parameters()}.values())
    largest = max(sum(held(p) for p in layer.parameters()) for layer in model.model.layers)
    engine = initialize_engine(model, cfg, layout, grid)
    x = torch.randint(0, vocab, (micro, 128), generator=torch.Generator().manual_seed(rank))
    for _ in range(2):
        for _ in range(4):
            engine.backward(engine(x, x))
            engine.step()
    row = {"name": name, "rank": rank, "share": share, "largest_layer": largest, "rise": _status("VmHWM") - start}
    Path(out, f"{name}-{rank}.json").write_text(json.dumps(row))
    dist.barrier()
    from zoo.worker import leave_process_group

    leave_process_group()


def counted_bytes(name: str, micro: int = 2, optim: str = "adamw") -> float:
    """What the planner counts for the case's rank without the engine term and the runtime
    (zoo.plan.memory.layout_memory: states, buffers, activations)."""
    from zoo.config.schema import ModelConfig
    from zoo.plan.describe import describe_model
    from zoo.plan.layout import PlanLayout
    from zoo.plan.memory import layout_memory, moment_bytes

    layers, vocab, tp, dp, zero = CASES[name]
    desc = describe_model(ModelConfig(family="llama", size="tinyllama-1.1b", n_layer=layers, block_size=128), vocab)
    lay = PlanLayout(tp=tp, pp=1, dp=dp, zero_stage=zero, micro_batch_size=micro, grad_accum=4,
                     activation_checkpointing=False)
    return layout_memory(desc, lay, dtype="fp32", sequence_parallel=False, resident_on_write=True,
                         moments=moment_bytes(optim, 0.9)).total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--rows", type=Path, default=None, help="print the rows of an earlier run's folder")
    parser.add_argument("--micro", type=int, default=2, help="samples of 128 tokens a micro-batch (4 a step)")
    parser.add_argument("--optim", default="adamw", choices=("adamw", "sgd"))
    parser.add_argument("--allocator", default="auto", help="the ranks' malloc, as run.cpu_allocator")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    from zoo.run.allocator import preload_for_ranks

    allocator = preload_for_ranks(args.allocator, cuda=False)  # mp.spawn's interpreters inherit LD_PRELOAD

    out = str(args.rows) if args.rows else tempfile.mkdtemp(prefix="zoo-step-memory-")
    for name in [] if args.rows else args.only:
        _, _, tp, dp, _ = CASES[name]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_rank, args=(tp * dp, port, name, out, args.micro, args.optim), nprocs=tp * dp)
    print(f"rows in {out}; micro-batch {args.micro} x 128 tokens, optim={args.optim}, the ranks' malloc: {allocator}")
    print(f"{'case':8} {'share M':>8} {'measured B/p':>12} {'counted B/p':>11} {'rest B/p':>9}")
    for name in args.only:
        rows = [json.loads(f.read_text()) for f in sorted(Path(out).glob(f"{name}-*.json"))]
        r = max(rows, key=lambda r: r["rise"])
        measured = r["rise"] / r["share"]
        counted = counted_bytes(name, args.micro, args.optim) / r["share"]
        print(f"{name:8} {r['share'] / 1e6:>8.1f} {measured:>12.1f} {counted:>11.1f} {measured - counted:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-rank memory of the transitions around the training step: a GPT of about 60M parameters
on 4 gloo ranks, under tp2 x dp2 (ZeRO-1), zero3 x dp4 and pp2 x dp2 (ZeRO-1).

    python benchmarks/memory_phases.py [--layers 8 --embd 768] [--only tp2-dp2 ...]

Each rank samples its resident memory every 20 ms (RssAnon and RssFile of /proc/self/status;
MALLOC_MMAP_THRESHOLD_=65536 so that freed blocks leave RSS) and prints, for each phase,
its peak rise over the memory it held when the phase began, as a multiple of its share
(its own parameters x 4 B + its optimizer partition x 12 B: fp32 master and AdamW's two
moments) and against the largest tensor's fp32 bytes: build (model and engine), steps,
save (the sharded checkpoint), resume on the same layout, resume under another layout (the
next layout in the list reads this one's checkpoint), save_final (the final weights, streamed
to rank 0 tensor by tensor), sample (the end-of-run sample, 16 prompt tokens and 32 greedy
ones, decoded on the distributed model in place with a decode cache), and the time of save (the median of three synchronous saves, each
its slowest rank, also per byte of the largest rank's shard) and load; and an asynchronous save: the
step's stall (staging the shard in host memory; the median of three saves) against the
synchronous save's time, and
what staging holds (the rank's share once more, by design: not counted against the bound);
a Hugging Face import (the model built from the export of the checkpoint, less what a plain
build takes) and the export itself (rank 0, one process, against the full weights). Target (#35): every transition raises a rank's
peak by at most max(0.25 x share, the largest tensor's fp32 bytes); save time under tp and
ZeRO-3 within 1.2x of the same model's save under ddp.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

LAYOUTS = {  # name: (tp, pp, dp, zero_stage)
    "tp2-dp2": (2, 1, 2, 1),
    "zero3-dp4": (1, 1, 4, 3),
    "pp2-dp2": (1, 2, 2, 1),
    "ddp4": (1, 1, 4, 0),
}


class Sampler:
    """The process's peak RssAnon + RssFile since the last mark, sampled every 20 ms; `split`:
    the (anonymous, file-backed) parts of the last phase's peak rise."""

    def __init__(self):
        self.peak, self.at_peak = self.now(), self.parts()
        self.stop = False
        threading.Thread(target=self._run, daemon=True).start()

    @staticmethod
    def parts() -> tuple:
        fields = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024
        return fields["RssAnon"], fields["RssFile"]

    @classmethod
    def now(cls) -> int:
        return sum(cls.parts())

    def _run(self):
        while not self.stop:
            parts = self.parts()
            if sum(parts) > self.peak:
                self.peak, self.at_peak = sum(parts), parts
            time.sleep(0.02)

    def phase(self, fn):
        """(fn's result, the peak rise while it ran, its seconds)."""
        import gc

        gc.collect()
        base_parts = self.parts()
        self.peak, self.at_peak = sum(base_parts), base_parts
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        parts = self.parts()
        if sum(parts) > self.peak:
            self.peak, self.at_peak = sum(parts), parts
        self.split = (self.at_peak[0] - base_parts[0], self.at_peak[1] - base_parts[1])
        return out, self.peak - sum(base_parts), took


def join_gloo(rank: int, world: int, port: int) -> None:
    """This spawned process as gloo rank `rank` of `world` on 127.0.0.1:`port`, one thread
    (the bootstrap benchmarks/step_memory.py shares)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    import deepspeed

    from zoo.engine import lean_start

    lean_start.skip_shm_comm_op()
    lean_start.skip_muon_import({})
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)


def _rank(rank: int, world: int, port: int, args, layout_name: str, ckpt_dir: str, read_from: str, out: str) -> None:
    join_gloo(rank, world, port)
    import torch
    import torch.distributed as dist

    from zoo import checkpoint
    from zoo.checkpoint.boxes import full_shape
    from zoo.checkpoint.final import write_final
    from zoo.config.schema import Config, ModelConfig
    from zoo.engine import initialize_engine
    from zoo.engine import state as engine_state
    from zoo.families.registry import family, model_dims
    from zoo.parallel.build import build
    from zoo.parallel.topology import Layout, build_grid, tp_group

    tp, pp, dp, zero = LAYOUTS[layout_name]
    layout = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero)
    model_cfg = ModelConfig(family="gpt", size="tiny", n_layer=args.layers, n_head=args.heads, n_embd=args.embd,
                            block_size=args.block)
    shape = model_dims(model_cfg, args.vocab)
    cfg = Config(model=model_cfg)
    cfg.trainer.micro_batch_size = 1
    cfg.trainer.global_batch_size = dp * (3 * pp if pp > 1 else 1)
    sampler = Sampler()
    grid = build_grid(layout)

    from zoo.engine import deepspeed_config
    from zoo.parallel.build import ZeroThree

    zero3 = ZeroThree(config=deepspeed_config(cfg, layout), group=grid.get_data_parallel_group(),
                      dtype=torch.float32, mpu=grid) if zero == 3 else None

    def model(weights=None):
        return build(family("gpt"), shape, layout, seed=0, device=torch.device("cpu"), tp_group=tp_group(grid),
                     partition_method="parameters", activation_checkpointing=False, zero3=zero3, weights=weights)

    def make():
        return initialize_engine(model(), cfg, layout, grid)

    engine, build_rise, _ = sampler.phase(make)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(0, args.vocab, (1, shape.block_size), generator=gen)

    def steps():
        for _ in range(2):
            if pp > 1:
                engine.train_batch(iter([(x, x)] * (3 * pp)))
            else:
                engine.backward(engine(x, x))
                engine.step()

    _, step_rise, _ = sampler.phase(steps)
    steps_peak = sampler.peak  # the absolute peak of the steps: what the sample is held against
    share = 0
    largest = 0
    for p in {id(p): p for p in engine.module.parameters()}.values():
        start, numel, _ = engine_state.held_range(p)
        share += engine_state.held(p).numel() * 4 + numel * 12
        largest = max(largest, math.prod(full_shape(engine_state.full_shape(p), getattr(p, "tp_shard", None))) * 4)
    meta = {"family": "gpt", "shape": {k: v for k, v in vars(shape).items() if k != "dropout"}, "optimizer": "adamw"}
    root = Path(ckpt_dir)
    row = {"rank": rank, "layout": layout_name, "share": share, "largest": largest, "build": build_rise,
           "steps": step_rise}
    if read_from:  # a resume under this layout from the previous layout's checkpoint
        path = Path(read_from)
        state = checkpoint.read_state(path)
        dist.barrier()
        _, row["resume_other"], row["resume_other_s"] = sampler.phase(
            lambda: checkpoint.load(engine, grid, path, state))
        row["resume_other_split"] = sampler.split
    saved, row["save"], row["save_s"] = sampler.phase(
        lambda: checkpoint.save(engine, grid, root, step=2, consumed=0, meta=meta, keep=1))
    row["save_split"] = sampler.split
    row["shard_bytes"] = (saved / f"shard-{rank:05d}.safetensors").stat().st_size
    # Two more synchronous saves (a save's time on two shared cores and one disk varies by 2x
    # from one save to the next: the time compared is the median of three), kept apart from
    # `saved` and not pruned, so that each writes the same files into an empty place.
    row["save_again_s"] = []
    for step in (3, 4):
        dist.barrier()
        t0 = time.perf_counter()
        checkpoint.save(engine, grid, root / "again", step=step, consumed=0, meta=meta, keep=3)
        row["save_again_s"].append(time.perf_counter() - t0)
    dist.barrier()
    if rank == 0:
        import shutil

        shutil.rmtree(root / "again")
    root_async = root / "async"
    def first_async():  # the save and its staging copy, waited for in full (what staging holds)
        pending = checkpoint.save(engine, grid, root_async, step=2, consumed=0, meta=meta, keep=1, background=True)
        pending.wait_staged()
        return pending

    pending, row["async_save"], row["async_first_stall_s"] = sampler.phase(first_async)
    row["async_save_split"] = sampler.split
    steps()  # training goes on while the shards are written
    checkpoint.finish(pending)
    dist.barrier()
    # The next async saves copy into the buffer the first one kept, as the trainer does; three
    # of them, as one stall on two shared cores is a noisy sample. The stall: the save's own
    # call and the next optimizer step's wait for the staging copy; beside it, how long the two
    # steps run with the copy and the write in flight, against two steps without.
    row["async_stall_s"], row["async_copy_s"], row["async_steps_s"], row["plain_steps_s"] = [], [], [], []
    for step in (3, 4, 5):
        dist.barrier()
        t0 = time.perf_counter()
        steps()
        row["plain_steps_s"].append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        again = checkpoint.save(engine, grid, root_async, step=step, consumed=0, meta=meta, keep=1, background=True,
                                staging=pending.staging)
        called = time.perf_counter() - t0
        t0 = time.perf_counter()
        steps()
        row["async_steps_s"].append(time.perf_counter() - t0)
        row["async_stall_s"].append(called + again.waited_s)
        row["async_copy_s"].append(again.waited_s)  # of which the optimizer step's wait for the copy
        checkpoint.finish(again)
    row["async_write_s"] = again.seconds
    state = checkpoint.read_state(saved)
    dist.barrier()
    _, row["resume_same"], row["resume_same_s"] = sampler.phase(lambda: checkpoint.load(engine, grid, saved, state))
    row["resume_same_split"] = sampler.split

    def final():
        write_final(engine, grid, root, meta)

    dist.barrier()
    _, row["save_final"], _ = sampler.phase(final)
    row["save_final_split"] = sampler.split
    from zoo.parallel.generate import InPlaceDecoder, Sampling, sample_in_place

    decoder = InPlaceDecoder(engine.module, grid, layout, torch.device("cpu"), sequence_parallel=False,
                             document_mask=False)
    want = Sampling(prompt=list(range(1, 17)), max_new_tokens=32, block_size=shape.block_size, temperature=0)
    dist.barrier()
    _, row["sample"], row["sample_s"] = sampler.phase(lambda: sample_in_place(decoder, want))
    row["sample_split"] = sampler.split
    row["sample_over_steps"] = max(0, sampler.peak - steps_peak)  # #50's target: against the steady step
    hf = root / "hf"
    if rank == 0:  # the export: one process, the whole model tensor by tensor
        from zoo.export import export

        _, row["export"], _ = sampler.phase(lambda: export(saved, hf))
        row["full_bytes"] = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
    dist.barrier()
    from zoo.checkpoint.hf_weights import read_hf

    _, plain_build, _ = sampler.phase(lambda: model())  # what the model itself takes, to subtract
    _, with_import, _ = sampler.phase(lambda: model(read_hf(hf, family("gpt"), cfg.model.vocab_pad_multiple)[1]))
    row["hf_import"] = max(0, with_import - plain_build)
    row["model_build"] = plain_build  # the model alone, without the engine (ZeRO-3: built partitioned)
    bytes_on_disk = sum(f.stat().st_size for f in saved.glob("shard-*.safetensors")) if rank == 0 else 0
    row["checkpoint_bytes"] = bytes_on_disk
    Path(out, f"{layout_name}-{rank}.json").write_text(json.dumps(row))
    sampler.stop = True
    from zoo.worker import leave_process_group

    leave_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(args, name: str, ckpt_dir: str, read_from: str, out: str) -> None:
    import torch.multiprocessing as mp

    tp, pp, dp, _ = LAYOUTS[name]
    mp.spawn(_rank, args=(tp * pp * dp, _free_port(), args, name, ckpt_dir, read_from, out), nprocs=tp * pp * dp)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--only", nargs="+", choices=sorted(LAYOUTS), default=["ddp4", "tp2-dp2", "zero3-dp4",
                                                                                "pp2-dp2"])
    args = parser.parse_args(argv)
    for key in ("layers", "embd", "heads", "block", "vocab"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be positive, got {getattr(args, key)}")
    if args.embd % args.heads:
        parser.error(f"--embd {args.embd} must be a multiple of --heads {args.heads}")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # freed blocks leave RSS (the ranks inherit it)
    work = Path(tempfile.mkdtemp(prefix="zoo-memory-"))
    out = work / "rows"
    out.mkdir()
    previous = ""
    for name in args.only:
        ckpt = work / name
        run_layout(args, name, str(ckpt), previous, str(out))
        previous = str(ckpt / "step_0000002")
    rows = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    params = None
    print(f"GPT {args.layers}L d{args.embd} vocab {args.vocab}, 4 ranks; rise of each rank's peak RSS in a phase as "
          f"a multiple of its share (params x 4 B + optimizer partition x 12 B); target <= max(0.25, largest "
          f"tensor / share)")
    phases = ["build", "steps", "save", "async_save", "resume_same", "resume_other", "save_final", "sample",
              "hf_import"]
    print(f"{'layout':10} {'rank':>4} {'share MiB':>9} {'bound':>6} " + " ".join(f"{p:>12}" for p in phases)
          + f" {'save s':>7} {'load s':>7}")
    worst = {}
    for r in rows:
        bound = max(0.25, r["largest"] / r["share"])
        cells = []
        for p in phases:
            if p not in r:
                cells.append(f"{'-':>12}")
                continue
            ratio = r[p] / r["share"]
            cells.append(f"{ratio:>11.2f}{'*' if ratio > bound else ' '}")
            if p not in ("build", "steps", "async_save"):  # staging holds the share once more, by design
                worst[(r["layout"], p)] = max(worst.get((r["layout"], p), 0), ratio / bound)
        print(f"{r['layout']:10} {r['rank']:>4} {r['share'] / 2**20:>9.1f} {bound:>6.2f} " + " ".join(cells)
              + f" {r['save_s']:>7.2f} {r['resume_same_s']:>7.2f}")
        params = params or r
    print("(* above the bound)")
    for r in rows:
        for p in ("save", "resume_same", "resume_other", "save_final", "sample", "async_save", "hf_import"):
            if p + "_split" not in r:
                continue
            if p in r and r[p] / r["share"] > max(0.25, r["largest"] / r["share"]):
                anon, file = r[p + "_split"]
                print(f"  {r['layout']} rank {r['rank']} {p}: +{anon / 2**20:.0f} MiB anonymous, "
                      f"+{file / 2**20:.0f} MiB file-backed")
    save_s, save_bytes = {}, {}
    for name in args.only:  # each save's slowest rank; the median of the three saves
        mine = [r for r in rows if r["layout"] == name]
        times = sorted(max([r["save_s"], *r["save_again_s"]][i] for r in mine) for i in range(3))
        save_s[name], save_bytes[name] = times[1], max(r["shard_bytes"] for r in mine)
        print(f"save {name}: {save_s[name]:.2f} s (the median of {', '.join(f'{t:.2f}' for t in times)}), "
              f"the largest shard {save_bytes[name] / 2**20:.0f} MiB")
    for name in args.only:
        mine = [r for r in rows if r["layout"] == name]
        stalls = [max(r["async_stall_s"][i] for r in mine) for i in range(len(mine[0]["async_stall_s"]))]
        stall = sorted(stalls)[len(stalls) // 2]  # the median save's slowest rank
        first = max(r["async_first_stall_s"] for r in mine)
        copy = sorted(max(r["async_copy_s"][i] for r in mine) for i in range(len(stalls)))[len(stalls) // 2]
        during = sorted(max(r["async_steps_s"][i] for r in mine) for i in range(len(stalls)))[len(stalls) // 2]
        plain = sorted(max(r["plain_steps_s"][i] for r in mine) for i in range(len(stalls)))[len(stalls) // 2]
        print(f"async save {name}: the step stalled {stall:.3f} s = {stall / save_s[name]:.3f} of the synchronous "
              f"save's {save_s[name]:.2f} s (target <= 0.10; the median of {len(stalls)} saves, each its slowest "
              f"rank: {', '.join(f'{x / save_s[name]:.3f}' for x in stalls)}; the first, which allocates the buffer, "
              f"its copy waited for in full: {first:.3f} s = {first / save_s[name]:.3f}; of the stall, the optimizer step's wait for the staging copy "
              f"{copy:.3f} s; two steps with the save in flight {during:.2f} s, without {plain:.2f} s); staging held "
              f"{max(r['async_save'] / r['share'] for r in rows if r['layout'] == name):.2f}x the share")
    if "ddp4" in save_s:
        for name in args.only:
            if name != "ddp4":
                per_byte = (save_s[name] / save_bytes[name]) / (save_s["ddp4"] / save_bytes["ddp4"])
                print(f"save time {name} / ddp4: {save_s[name] / save_s['ddp4']:.2f}, the largest shard's bytes "
                      f"{save_bytes[name] / save_bytes['ddp4']:.2f}x ddp4's, per byte {per_byte:.2f} (target <= 1.2)")
    over = sorted(k for k, v in worst.items() if v > 1)
    for name in args.only:
        worst_model = max(r["model_build"] / r["share"] for r in rows if r["layout"] == name)
        print(f"{name}: building the model alone (no engine) raises a rank's peak by {worst_model:.2f}x its share")
    for r in rows:
        if "export" in r:
            print(f"export ({r['layout']}'s checkpoint, one process): +{r['export'] / 2**20:.0f} MiB = "
                  f"{r['export'] / r['full_bytes']:.2f}x the full weights ({r['full_bytes'] / 2**20:.0f} MiB), "
                  f"{r['export'] / r['largest']:.2f}x the largest tensor")
    print("transitions over the bound: " + (", ".join(f"{a} {b}" for a, b in over) if over else "none"))
    print("the end-of-run sample's peak above the steps' peak, x the share (target <= 0.25): " + ", ".join(
        f"{name} {max(r['sample_over_steps'] / r['share'] for r in rows if r['layout'] == name):.2f}"
        for name in args.only))


if __name__ == "__main__":
    sys.exit(main())

"""How much model.compile can gain on this CPU at all: an op-level profile of one training
step of zoo's model, eager and compiled, and of the references (benchmarks/gpt_vs_hf.py's),
split into matmuls, attention kernels and everything else.

    python benchmarks/compile_ceiling.py [--layers 6 --embd 384 --heads 6] [--dtype bf16]

Compilation fuses the pointwise ops, norms, the loss and the optimizer's loops, but it calls
the same matmul (oneDNN/MKL) and attention kernels as eager. So a compiled step cannot take
less than the time its matmuls and attention kernels take: that bound, set against a
reference's eager step, is the largest ratio compile can reach here ("ceiling"). The matmul
rate (the profiler's FLOP count over the matmuls' time) is printed against the machine's
measured matmul peak (zoo.observe.flops, cached per machine), to show how far faster
matmuls could go. Wall times are the alternating rounds of gpt_vs_hf.py. The split comes from
profiles (the fastest of --profiles per step): the matmuls' and attention kernels' own times in
them (long kernels, so the profiler's per-call cost is small against them), and the rest of the
wall time as other (the profiler's overhead falls on the many small ops, so their profiled times
are not used). CPU only: on a GPU the kernels run asynchronously and profile differently.
"""
from __future__ import annotations

import re
import sys
from statistics import median

import torch

MATMUL = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|_addmm_activation)$|^mkldnn::|linear_pointwise")
ATTENTION = re.compile(r"scaled_dot_product|_flash_attention|_efficient_attention")


def split(events, steps: int) -> dict:
    """{"matmul_s", "attention_s": seconds per step, "matmul_flops": FLOPs per step} of a
    profiler's key_averages() over `steps` steps: the leaf kernels' self CPU time by name."""
    matmul = attention = flops = 0.0
    for e in events:
        if MATMUL.search(e.key):
            matmul += e.self_cpu_time_total
            flops += e.flops or 0
        elif ATTENTION.search(e.key):
            attention += e.self_cpu_time_total
    if matmul <= 0:
        raise ValueError("the profile holds no matmul: was a step run inside it?")
    return {"matmul_s": matmul / 1e6 / steps, "attention_s": attention / 1e6 / steps, "matmul_flops": flops / steps}


def profiled(step, steps: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(steps):
            step()
    return split(prof.key_averages(), steps)


def main() -> None:
    import gpt_vs_hf

    from zoo.observe.flops import cached_cpu_peak_flops

    def extra(p):
        p.add_argument("--profiles", type=gpt_vs_hf.positive, default=3,
                       help="3-step profiles of each step, the fastest kernels kept")
        p.set_defaults(device="cpu")

    a = gpt_vs_hf.arguments(extra=extra)
    if a.device != "cpu":
        print("compile_ceiling.py: --device cpu only (GPU kernels run asynchronously and profile differently; "
              "on a GPU use the run's trainer.profile window)", file=sys.stderr)
        raise SystemExit(2)
    gpt_vs_hf.start_single_rank(a.device)
    x, y = gpt_vs_hf.batch_of(a)
    shape, hf, name = gpt_vs_hf.models(a)
    steps = gpt_vs_hf.reference_steps(a, hf, name, x, y)
    steps["zoo"] = gpt_vs_hf.zoo_step_of(a, shape, x, y, compiled=False)
    steps["zoo compiled"] = gpt_vs_hf.zoo_step_of(a, shape, x, y, compiled=True)
    times = gpt_vs_hf.interleaved(steps, max(1, a.steps // a.rounds), rounds=a.rounds)
    wall = {n: median(t) for n, t in times.items()}
    prof = {}
    for r in range(a.profiles):  # alternating order; a step's fastest kernels count (this VM's runs spread)
        for n in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
            p = profiled(steps[n], 3)
            prof[n] = min(prof.get(n, p), p, key=lambda q: q["matmul_s"] + q["attention_s"])
    peak, how = cached_cpu_peak_flops(a.dtype)
    print(f"{a.family} L={a.layers} C={a.embd} H={a.heads} T={a.block} V={a.vocab}, batch {a.batch}, {a.dtype}, "
          f"{torch.get_num_threads()} threads; wall: median of {a.rounds} alternating rounds; matmul and attention: "
          f"the fastest of {a.profiles} 3-step profiles")
    print(f"{'step':>16} {'ms/step':>8} {'matmul':>8} {'attention':>10} {'other':>8}   matmul GFLOP/s")
    for n in steps:
        p, ms = prof[n], wall[n] * 1e3
        mm, att = p["matmul_s"] * 1e3, p["attention_s"] * 1e3
        rate = p["matmul_flops"] / p["matmul_s"] / 1e9
        print(f"{n:>16} {ms:8.1f} {mm:8.1f} {att:10.1f} {ms - mm - att:8.1f}   {rate:.0f}")
    print(f"the machine's {a.dtype} matmul peak: {peak / 1e9:.0f} GFLOP/s ({how})")
    zc = prof["zoo compiled"]
    floor = zc["matmul_s"] + zc["attention_s"]  # compile calls the same kernels: no step under their time
    at_peak = zc["matmul_flops"] / peak + zc["attention_s"]  # ... nor matmuls beyond the peak
    for ref, target in ((name, 1.5), ("nanoGPT loop", 1.2)):
        if ref in wall:
            print(f"zoo compiled / {ref}: measured {wall[ref] / wall['zoo compiled']:.3f}; ceiling, every op but the "
                  f"matmuls and attention free: {wall[ref] / floor:.3f}; and the matmuls at peak too: "
                  f"{wall[ref] / at_peak:.3f}; target {target}")


if __name__ == "__main__":
    main()

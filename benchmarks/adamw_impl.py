"""torch's AdamW implementations on this machine's CPU, one thread: the step's time and the
process's high-water memory per parameter (weights, gradients and the two moments are 16 B;
the rest is the interpreter and what the step allocates), each implementation in a process
of its own. zoo's AdamW takes the fused one (zoo.engine.optimizers.build).

    python benchmarks/adamw_impl.py [--mparams 92]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

_ONE = r"""
import json, sys, time, torch
from pathlib import Path
torch.set_num_threads(1)
mode, rows = sys.argv[1], int(sys.argv[2])
def hwm():
    line = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM")][0]
    return int(line.split()[1]) * 1024
start = hwm()
ps = [torch.nn.Parameter(torch.randn(rows, 2048)) for _ in range(18)] + [torch.nn.Parameter(torch.randn(4 * rows, 2048))]
for p in ps:
    p.grad = torch.randn_like(p)
kw = {"foreach": dict(foreach=True), "single-tensor": dict(foreach=False), "fused": dict(fused=True)}[mode]
opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, **kw)
opt.step()  # the moments are allocated
t0 = time.perf_counter()
for _ in range(3):
    opt.step()
n = sum(p.numel() for p in ps)
print(json.dumps({"n": n, "step_s": (time.perf_counter() - t0) / 3, "bytes_per_param": (hwm() - start) / n}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mparams", type=float, default=92, help="parameters, millions (default 92)")
    args = parser.parse_args(argv)
    rows = max(1, int(args.mparams * 1e6 / (22 * 2048)))
    out = {}
    for mode in ("foreach", "single-tensor", "fused"):
        proc = subprocess.run([sys.executable, "-c", _ONE, mode, str(rows)], capture_output=True, text=True, check=True)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    n = out["fused"]["n"]
    print(f"AdamW step over {n / 1e6:.0f}M fp32 parameters, 1 thread")
    for mode, r in out.items():
        print(f"{mode:14} {r['step_s'] * 1000:>7.0f} ms  ({out['foreach']['step_s'] / r['step_s']:.2f}x foreach's speed)"
              f"  high-water {r['bytes_per_param']:.1f} B a parameter")
    return 0


if __name__ == "__main__":
    sys.exit(main())

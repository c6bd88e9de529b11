"""Draw optim.schedule's four curves (zoo.engine.schedules.lr_ratio) into docs/schedules.png.

    python docs/schedules.py
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from zoo.engine.schedules import SCHEDULES, lr_ratio  # noqa: E402

STEPS, WARMUP, MIN_RATIO, DECAY_FRACTION = 1000, 50, 0.1, 0.2


def main() -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    steps = list(range(1, STEPS + 1))
    for schedule in SCHEDULES:  # the lr optimizer step s runs at: scheduler iteration s - 2 (DeepSpeed's count)
        ax.plot(steps, [lr_ratio(s - 2, schedule=schedule, warmup=WARMUP, total=STEPS, min_ratio=MIN_RATIO,
                                 decay_fraction=DECAY_FRACTION) for s in steps], label=schedule)
    ax.set(xlabel="optimizer step", ylabel="learning rate / optim.lr",
           title=f"optim.schedule: warmup_steps={WARMUP}, min_lr = {MIN_RATIO:g} x lr, "
                 f"wsd decay_fraction={DECAY_FRACTION:g}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(__file__).with_name("schedules.png")
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main()

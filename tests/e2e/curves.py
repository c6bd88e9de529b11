"""What the precision tests share: a 16-bit run's loss curve against fp32's on the same layout,
20 steps: 0.5% at step 1, 2% over steps 16-20 and 90% of fp32's progress (each test file
derives why these bounds hold for its dtype)."""
from __future__ import annotations

import numpy as np


def assert_follows_fp32(fp32_run, run, label: str) -> None:
    fp32, low = (np.array(r.losses(), dtype=np.float64) for r in (fp32_run, run))
    assert len(fp32) == len(low) == 20 and np.isfinite(low).all()
    assert not np.array_equal(fp32, low), f"{label}: the run computed exactly what fp32 did: it ran in fp32"
    first = abs(low[0] - fp32[0]) / fp32[0]
    last = np.abs(low[-5:] - fp32[-5:]).mean() / fp32[-5:].mean()
    progress = (low[0] - low[-5:].mean()) / (fp32[0] - fp32[-5:].mean())
    print(f"{label}: step 1 {first:.3%}, steps 16-20 {last:.3%}, progress {progress:.3f}")
    assert first < 0.005, (first, fp32[:3], low[:3])
    assert last < 0.02, (last, fp32[-5:], low[-5:])
    assert progress > 0.9, (progress, fp32, low)

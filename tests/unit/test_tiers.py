"""Every test named slow exists (a renamed test would silently join the default set)."""
import subprocess
import sys

from tests.conftest import REPO, SLOW


def test_every_slow_test_is_collected():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "tests/e2e", "tests/slurm"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    assert set(SLOW) == collected, (sorted(set(SLOW) - collected), sorted(collected - set(SLOW)))

"""Fixtures the end-to-end tests share: reference runs computed once per session."""
from __future__ import annotations

import pytest

from tests.e2e.checkpoint_runs import FAST, STEPS, losses_by_step


@pytest.fixture(scope="session")
def checkpoint_reference(run_zoo) -> dict:
    """The uninterrupted 20-step run every checkpoint test must reproduce: losses by step."""
    return losses_by_step(run_zoo(*FAST, f"trainer.max_steps={STEPS}"))

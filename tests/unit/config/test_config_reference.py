"""docs/config.md is zoo.config.reference's output for this schema and conf/ (#34 item 8):
regenerate it with `python -m zoo.config.reference > docs/config.md`."""
from __future__ import annotations

from tests.conftest import REPO
from zoo.config.reference import keys, render


def test_the_checked_in_reference_is_current():
    assert (REPO / "docs" / "config.md").read_text() == render(), \
        "docs/config.md is stale: python -m zoo.config.reference > docs/config.md"


def test_every_key_is_there_with_its_docstring():
    found = {key: doc for key, _, _, doc in keys()}
    assert {"model.family", "trainer.profile.start", "trainer.early_stop.patience", "precision.loss_scale",
            "checkpoint.async_save", "deepspeed", "verbose"} <= found.keys()
    assert all(found.values()), [k for k, doc in found.items() if not doc]  # every key says what it is

"""Exit codes of the Hydra entry points: a config that does not compose is a user mistake.

Hydra reports composition errors (an unknown group option, a misspelled key, a wrong type)
in one message and exits 1; zoo's entry points exit 2 for every config error. The task
function marks that it started, so a later exit 1 (a crash) is left alone.
"""
from __future__ import annotations

import sys
from typing import Callable


class TaskStarted:
    def __init__(self):
        self.value = False

    def __call__(self) -> None:
        self.value = True


def run_hydra_app(hydra_main: Callable[[], None], started: TaskStarted) -> None:
    try:
        hydra_main()
    except SystemExit as exc:
        if exc.code == 1 and not started.value:
            sys.exit(2)
        raise

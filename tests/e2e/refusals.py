"""Run many `python -m zoo.train ARGS` that are refused before launch in one interpreter.

Each refusal is the entry point's own `main()` with its own argv, Hydra's global state
cleared between them, stdout and stderr captured: everything of the command line but the
interpreter's start (about 3 s of imports each, mostly torch). A case that gets past the
validation pass would start training here: the caller gives only refusals, and a separate
subprocess test keeps the real command line covered.

    python tests/e2e/refusals.py < cases.json > results.json
    (cases: [[arg, ...], ...]; results: [{"code": int, "stdout": str, "stderr": str}, ...])
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys


def run_all(cases):
    from hydra.core.global_hydra import GlobalHydra

    import zoo.train

    results, environ = [], dict(os.environ)
    for argv in cases:
        GlobalHydra.instance().clear()
        zoo.train._task_started.__init__()  # a fresh TaskStarted, as in a new process
        out, err = io.StringIO(), io.StringIO()
        sys.argv = ["zoo.train", *argv]
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                zoo.train.main()
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            except BaseException as exc:  # noqa: BLE001 - a traceback is a result here
                import traceback

                err.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(exc)))
                code = 1
        os.environ.clear()
        os.environ.update(environ)
        results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    json.dump(run_all(json.load(sys.stdin)), sys.stdout)

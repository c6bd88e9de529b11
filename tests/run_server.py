"""A process that has imported what every `python -m zoo.train` imports (torch, DeepSpeed,
transformers, zoo's trainer: ~7 s on 2 cores) and forks a fresh child for each run the tests
ask for. The child is the run exactly as a new interpreter would start it: its own argv,
environment, working directory, stdout and stderr files and process group; the server itself
never runs anything. Requests and replies are JSON lines on stdin/stdout:

    {"module": "zoo.train", "argv": [...], "env": {...}, "cwd": "...", "stdout": PATH, "stderr": PATH,
     "timeout": S}  ->  {"returncode": N}  (negative: killed by that signal; 124: timed out)

Used by tests/conftest.py's run_zoo for plain `python -m MODULE ...` runs (ZOO_TEST_FORK=0 turns
it off). Environment read at import time is the server's: it starts with the tests' settings
(one OMP thread, wandb disabled) and imports nothing that reads others (not datasets).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time


def _preload() -> None:
    import deepspeed  # noqa: F401
    import deepspeed.runtime.engine  # noqa: F401
    import deepspeed.runtime.pipe.engine  # noqa: F401
    import matplotlib  # noqa: F401  (rank 0 of a multi-rank run draws topology.png: ~1.1 s of imports)
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401  (every language model's task: ~2 s of lazy imports)

    import zoo.families.registry  # noqa: F401
    import zoo.train  # noqa: F401
    import zoo.trainer  # noqa: F401
    import zoo.worker  # noqa: F401


def _child(req: dict) -> None:
    os.setpgrp()  # the run and any ranks it starts: one group the server can end
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False, buffering=1)
    sys.stderr = open(2, "w", closefd=False, buffering=1)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = [req["module"], *req["argv"]]
    code = 0
    try:
        import runpy

        sys.modules.pop(req["module"], None)  # run as __main__ fresh, as `python -m` would (its imports stay)
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, (int, type(None))):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what a new interpreter would print
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.02)


def main() -> None:
    sys.path.insert(0, os.getcwd())
    reply = os.fdopen(os.dup(1), "w")  # the replies' own channel: what the imports print goes to stderr
    os.dup2(2, 1)
    _preload()
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        code = _wait(pid, req["timeout"])  # a process the run leaves behind stays, for the tests to find
        print(json.dumps({"returncode": code}), file=reply, flush=True)


if __name__ == "__main__":
    main()

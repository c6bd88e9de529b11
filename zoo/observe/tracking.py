"""Experiment tracking: a wandb run opened by rank 0, or a tracker that does nothing.

`logger=wandb` logs online when credentials are configured (WANDB_API_KEY, or a netrc
entry for the wandb host, which `wandb login` writes) and offline otherwise, into
`RUN_DIR/wandb/` where `wandb sync RUN_DIR/wandb/offline-run-*` uploads it later. WANDB_MODE
in the environment or `logger.mode` decide instead when set (`disabled`: no wandb at all). The run id is kept in the run
directory, so a run resumed there (`resume=auto`) continues the same wandb run.
"""
from __future__ import annotations

import dataclasses
import netrc
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional
from urllib.parse import urlparse

from zoo.config.schema import Config
from zoo.parallel.topology import Layout

RUN_ID_FILE = "wandb_run_id"


class NullTracker:
    """Stands in when tracking is off (logger=none, or any rank but 0)."""

    def log(self, values: Mapping[str, Any], step: int) -> None:
        pass

    def summary(self, values: Mapping[str, Any]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


class WandbTracker:
    def __init__(self, run):
        self.run = run

    def log(self, values: Mapping[str, Any], step: int) -> None:
        # Committed now: wandb otherwise holds a row until the next step or finish(), and the last
        # row then lands after the run's summary and overwrites it with the last step's figures.
        self.run.log({k: v for k, v in values.items() if k != "step"}, step=step, commit=True)

    def summary(self, values: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(values))

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None


def credentials_configured(env: Mapping[str, str] = os.environ) -> bool:
    """An API key in the environment, or a netrc entry for the wandb host."""
    if env.get("WANDB_API_KEY"):
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(env.get("HOME", "~")).expanduser() / ".netrc"
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(configured: Optional[str], env: Mapping[str, str] = os.environ) -> str:
    """`logger.mode` if set, else WANDB_MODE, else online exactly when credentials exist."""
    mode = configured or env.get("WANDB_MODE")
    if mode:
        return {"dryrun": "offline", "run": "online"}.get(mode, mode)
    return "online" if credentials_configured(env) else "offline"


def default_name(model, layout: Layout) -> str:
    """model-size_layout, e.g. gpt-tiny_tp2-pp2-dp2_zero1 (`model`: the config's model section)."""
    return f"{model.label}_{layout.name}"


def default_group(experiment: Optional[str], model) -> str:
    """The experiment, so that the layouts of one experiment sit together; else model-size."""
    return experiment or model.label


class BackgroundTracker:
    """A tracker opened in a thread: `wandb.init` takes seconds (its import, its service
    process), and the training's first steps need not wait for it. What is logged before it
    is open is kept and sent in order once it is; `finish` waits for it. An error opening it
    is raised on the training's thread at the next call."""

    def __init__(self, start: Callable[[], Any]):
        self._lock = threading.Lock()
        self._pending: List[tuple] = []
        self._tracker, self._error = None, None
        self._thread = threading.Thread(target=self._open, args=(start,), name="zoo-tracker", daemon=True)
        self._thread.start()

    def _open(self, start) -> None:
        try:
            tracker = start()
        except BaseException as err:  # noqa: BLE001 - re-raised on the training's thread
            self._error = err
            return
        with self._lock:
            for method, args in self._pending:
                getattr(tracker, method)(*args)
            self._pending.clear()
            self._tracker = tracker

    def _call(self, method: str, *args) -> None:
        if self._error is not None:
            raise self._error
        with self._lock:
            if self._tracker is None:
                self._pending.append((method, args))
                return
        getattr(self._tracker, method)(*args)

    def wait(self):
        """The open tracker (joins the thread; raises what opening it raised)."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._tracker

    def log(self, values: Mapping[str, Any], step: int) -> None:
        self._call("log", dict(values), step)

    def summary(self, values: Mapping[str, Any]) -> None:
        self._call("summary", dict(values))

    def finish(self, exit_code: int = 0) -> None:
        self.wait().finish(exit_code)


def open_tracker(cfg: Config, layout: Layout, run_dir: Path, rank: int, extra_config: Dict[str, Any],
                 recorded: Optional[Dict[str, Any]] = None):
    """A wandb run on rank 0 when logger.kind is wandb, opened in the background
    (BackgroundTracker); a NullTracker otherwise. Its config is `recorded` (the run's config as
    config.yaml holds it, zoo.config.schema.recorded) with `extra_config`."""
    lg = cfg.logger
    if lg.kind == "none" or rank != 0:
        return NullTracker()
    mode = wandb_mode(lg.mode)
    if mode == "disabled":  # e.g. WANDB_MODE=disabled in a test suite: not even the import
        return NullTracker()
    # wandb's process-wide settings (its telemetry among them) read the mode from the
    # environment, not from init(): offline there too, or it reaches out to its servers.
    os.environ["WANDB_MODE"] = mode
    return BackgroundTracker(lambda: _start_wandb(cfg, layout, run_dir, extra_config, recorded, mode))


def _start_wandb(cfg: Config, layout: Layout, run_dir: Path, extra_config: Dict[str, Any], recorded, mode: str):
    """Open the wandb run (blocking: seconds) and say where it logs."""
    import wandb

    lg = cfg.logger
    id_file = Path(run_dir) / RUN_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]

    def init(mode: str, run_id: str):
        return wandb.init(project=lg.project, entity=lg.entity, group=lg.group or default_group(cfg.experiment, cfg.model),
                          name=lg.name or default_name(cfg.model, layout), tags=list(lg.tags) or None, mode=mode,
                          dir=str(run_dir), id=run_id, resume="allow",
                          config={**(recorded or dataclasses.asdict(cfg)), **extra_config},
                          settings=wandb.Settings(console="off", quiet=True, silent=not cfg.verbose))  # zoo says where it logs

    try:
        run = init(mode, run_id)
    except Exception as err:  # credentials, but the server cannot be reached (a compute node without internet)
        if mode != "online":
            raise
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"zoo: warning: wandb could not start online ({reason}); logging offline into the run directory "
              f"instead", file=sys.stderr, flush=True)
        os.environ["WANDB_MODE"] = mode = "offline"
        run_id = uuid.uuid4().hex[:8]  # wandb's service still holds the first id
        run = init(mode, run_id)
    id_file.write_text(run_id + "\n")
    where = run.url if mode == "online" else f"{Path(run.dir).parent} (upload it with `wandb sync`)"
    print(f"zoo: wandb run {run.name} in group {run.group}, {mode}: {where}", file=sys.stderr, flush=True)
    return WandbTracker(run)

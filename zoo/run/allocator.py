"""Which malloc the CPU ranks run on (`run.cpu_allocator`), and how they get it.

torch allocates CPU tensors with the C library's malloc. glibc's keeps much of what a step
frees: after a large block is freed its mmap threshold rises (up to 32 MB), later tensors below
it come from its heap, and the backward's transients leave that heap fragmented. At
TinyLlama-1.1B's shape on 4 CPU ranks (tp4) a rank then held 5.2-5.5 GB where tcmalloc held
4.2 GB (benchmarks/results/cpu-2core.txt, session 27). tcmalloc
and jemalloc return the freed memory; the launcher preloads one (LD_PRELOAD) into the ranks
it starts, so the planner's CPU memory terms (conf/cluster/cpu.yaml) are measured with it.

    run.cpu_allocator=auto       tcmalloc, else jemalloc, else glibc (the default)
    run.cpu_allocator=tcmalloc   that one, or a one-line refusal naming the package to install
    run.cpu_allocator=glibc      the C library's own

    eval "$(python -m zoo.run.allocator [run.cpu_allocator=...])"   # the ranks' LD_PRELOAD (srun_ranks.sh)

Only CPU ranks: on a GPU the tensors live in torch's caching allocator, whatever malloc is.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Tuple

from zoo.run.errors import ConfigError

LIBRARIES = {  # name: the shared objects that provide it, preferred first
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so.1"),
}
CHOICES = ("auto", "tcmalloc", "jemalloc", "glibc")
# Set for the ranks unless already set: tcmalloc returns a freed span to the system at once.
# Without it tcmalloc kept DeepSpeed's freed buffers resident, and a later large allocation
# (the 500M-element reduce bucket) reused them whole, where glibc maps fresh pages that count
# only where written: ZeRO-1 at dp2 held 6.5 B a parameter beyond the planner's count with
# tcmalloc's defaults, -0.4 with this (benchmarks/step_memory.py; results, session 27).
TUNING = {"tcmalloc": {"TCMALLOC_AGGRESSIVE_DECOMMIT": "t"}, "jemalloc": {}}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4 (Debian, Ubuntu) or gperftools-libs (Fedora, RHEL)",
            "jemalloc": "libjemalloc2 (Debian, Ubuntu) or jemalloc (Fedora, RHEL)"}


def _search_dirs() -> list:
    """Where the dynamic loader and the usual installs put shared libraries (and this Python's
    prefix: a conda environment's own)."""
    dirs = [Path(sys.prefix) / "lib", Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib/aarch64-linux-gnu"),
            Path("/usr/lib64"), Path("/usr/lib"), Path("/usr/local/lib"), Path("/lib/x86_64-linux-gnu"),
            Path("/lib64")]
    extra = [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    return extra + dirs


def find(name: str) -> Optional[str]:
    """The path of `name`'s shared object on this machine, or None."""
    for directory in _search_dirs():
        for lib in LIBRARIES[name]:
            path = directory / lib
            if path.is_file():
                return str(path)
    return None


def resolve(choice: str) -> Tuple[str, Optional[str]]:
    """(allocator, its library's path or None for glibc) for `run.cpu_allocator=choice`.
    Raises ConfigError for an unknown name or a named allocator this machine lacks."""
    if choice not in CHOICES:
        raise ConfigError(f"run.cpu_allocator={choice!r} is unknown: use one of {', '.join(CHOICES)} "
                          "(auto: tcmalloc, else jemalloc, else glibc)")
    if choice == "glibc":
        return "glibc", None
    for name in LIBRARIES if choice == "auto" else (choice,):
        path = find(name)
        if path:
            return name, path
    if choice == "auto":
        return "glibc", None
    raise ConfigError(f"run.cpu_allocator={choice}: no {' or '.join(LIBRARIES[choice])} on this machine; install "
                      f"{PACKAGES[choice]}, or use run.cpu_allocator=auto (glibc when neither is installed)")


def in_use() -> str:
    """The malloc this process runs on: tcmalloc or jemalloc where one is mapped (preloaded),
    else glibc."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    for name, libs in LIBRARIES.items():
        if any(lib.split(".so")[0] + ".so" in maps for lib in libs):
            return name
    return "glibc"


def with_preload(path: Optional[str], env=None) -> str:
    """LD_PRELOAD's value with `path` first (kept as it was where path is None or already in it)."""
    env = os.environ if env is None else env
    current = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if path is None or path in current:
        return ":".join(current)
    return ":".join([path, *current])


def preload_for_ranks(choice: str, cuda: bool) -> str:
    """The allocator the ranks this launcher starts will run on, with LD_PRELOAD set in this
    process's environment for them (the forkserver or spawned interpreter inherits it; a forked
    rank does not: it keeps this process's malloc). GPU ranks: left as they are, `caching`
    (their tensors live in torch's caching allocator), as `planned` names them."""
    if cuda:
        return "caching"
    name, path = resolve(choice)
    for key, value in ranks_env(name, path).items():
        os.environ[key] = value
    return name


def ranks_env(name: str, path: Optional[str], env=None) -> dict:
    """The environment the ranks get for allocator `name` (its library at `path`): LD_PRELOAD
    with it first and its TUNING, where not set already."""
    env = os.environ if env is None else env
    if path is None:
        return {}
    return {"LD_PRELOAD": with_preload(path, env),
            **{k: v for k, v in TUNING.get(name, {}).items() if k not in env}}


def planned(choice: str, cuda: bool, world: Optional[int] = None) -> str:
    """The malloc the planner counts for the ranks: `caching` on a GPU; the one zoo's launcher
    will preload (`choice` resolved) when it starts them as new interpreters; else the one this
    process runs on (a rank another launcher started, a one-rank run in this process, ranks
    forked from it: ZOO_START_METHOD=fork)."""
    if cuda:
        return "caching"
    env = os.environ
    here = ("RANK" in env or env.get("ZOO_LOCAL_WORKER") or env.get("ZOO_START_METHOD") == "fork"
            or world == 1)
    return in_use() if here else resolve(choice)[0]


def main(argv=None) -> int:
    """Print `export` lines for CPU ranks another launcher starts (srun_ranks.sh evaluates them):
    LD_PRELOAD with run.cpu_allocator's library first, and its TUNING. Nothing on a GPU node
    (it has /dev/nvidiactl; torch is not imported for this)."""
    import shlex

    if Path("/dev/nvidiactl").exists():
        return 0
    choice = "auto"
    for arg in sys.argv[1:] if argv is None else argv:
        if arg.startswith("run.cpu_allocator="):
            choice = arg.split("=", 1)[1]
    try:
        name, path = resolve(choice)
    except ConfigError as e:
        print(f"zoo: error: {e}", file=sys.stderr)
        return 2
    for key, value in ranks_env(name, path).items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

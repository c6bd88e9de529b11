"""How the data pipelines' worker processes start (the text preparation's tokenizers, the
chat preparation's renderers)."""
from __future__ import annotations

import sys


def pool_start_method() -> str:
    """How worker processes start: forked from this process, unless it runs a torch.distributed
    process group (a training rank preparing its cache): forking a process while its process
    group's and OpenMP's threads hold locks left a worker waiting on one forever here, so there
    they start as fresh interpreters (spawn)."""
    dist = sys.modules.get("torch.distributed")
    return "spawn" if dist is not None and dist.is_available() and dist.is_initialized() else "fork"

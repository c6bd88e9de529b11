"""Parameter names under DeepSpeed's pipeline, mapped back to the plain model's."""
from __future__ import annotations

import re

_PIPE_PREFIX = re.compile(r"^(\d+\.|tied_modules\.[^.]+\.)")


def plain_name(name: str) -> str:
    """A pipeline parameter's name in the plain model (`3.h.1.attn...` -> `h.1.attn...`)."""
    return _PIPE_PREFIX.sub("", name)

"""Building a module on the meta device without filling it.

A meta tensor holds no values, so `torch.nn.init`'s fills on one do nothing, yet the first of
them costs seconds: the meta kernel of `normal_` is a Python reference that imports
`torch._dynamo` (2.4 s on 2 cores). `on_meta()` builds with those fills switched off, as
transformers' `no_init_weights` does; the real values come later (`zoo.models.init`, or a
checkpoint)."""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.init as nn_init

_FILLS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_lock = threading.RLock()


def _keep(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def on_meta():
    """Modules built inside are on the meta device, their `torch.nn.init` fills skipped."""
    with _lock:
        saved = {name: getattr(nn_init, name) for name in _FILLS if hasattr(nn_init, name)}
        try:
            for name in saved:
                setattr(nn_init, name, _keep)
            with torch.device("meta"):
                yield
        finally:
            for name, fn in saved.items():
                setattr(nn_init, name, fn)


def _empty_on(device: torch.device):
    def allocate(t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return torch.empty(t.shape, dtype=t.dtype, device=device)
        return torch.empty_like(t, device=device)  # keeps a dense layout's strides, as to_empty does
    return allocate


def to_empty(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module.to_empty(device=device)`, without the meta tensor's `empty_like`: its Python
    reference imports torch.fx's symbolic shapes and sympy (~0.4 s of a 2-core start). A
    contiguous tensor is allocated by its shape (the layout empty_like gives it), any other one
    by empty_like. What zoo sets on a parameter (its tensor-parallel `tp_shard`, ...) stays on
    it: from meta, `_apply` makes new Parameter objects, which would not carry it."""
    kept = {name: dict(vars(p)) for name, p in module.named_parameters(remove_duplicate=False) if vars(p)}
    module._apply(_empty_on(device))
    for name, attributes in kept.items():
        param = module.get_parameter(name)
        for key, value in attributes.items():
            if not hasattr(param, key):
                setattr(param, key, value)
    return module

"""torch's AdamW and SGD, handed to DeepSpeed's engine, without torch._dynamo in an eager run.

torch.optim's Optimizer imports torch._dynamo (~1.9 s of a 2-core start) at the first call of
`add_param_group` (from its constructor), `zero_grad`, `state_dict` and `load_state_dict`
(`torch._disable_dynamo`), and at every `step` (`_use_grad_for_differentiable`): only to keep
dynamo from tracing into them, or to break a graph it is tracing. Outside a graph those
wrappers are the undecorated method, plus, for `step`, grad mode set to `differentiable`.

These subclasses call torch's undecorated methods (`inspect.unwrap`) outside a graph and the
decorated ones inside one, so the arithmetic, the state_dict and the step hooks are torch's.
They are registered with DeepSpeed's list of ZeRO-tested optimizers (which compares exact
types): they are torch's AdamW, not another optimizer.

Where the raw `deepspeed.optimizer` config differs from the block zoo writes, DeepSpeed builds
the optimizer itself, as before (`client_optimizer`).
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List

import torch


def _plain(method):
    return inspect.unwrap(method)


class _EagerMethods:
    """Optimizer methods that skip torch's dynamo wrappers outside a compiled graph."""

    _torch_class: type

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if torch.compiler.is_compiling():
            return super().add_param_group(param_group)
        return _plain(torch.optim.Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if torch.compiler.is_compiling():
            return super().zero_grad(set_to_none)
        return _plain(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self):
        if torch.compiler.is_compiling():
            return super().state_dict()
        return _plain(torch.optim.Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict) -> None:
        if torch.compiler.is_compiling():
            return super().load_state_dict(state_dict)
        return _plain(torch.optim.Optimizer.load_state_dict)(self, state_dict)

    def step(self, closure=None):
        if torch.compiler.is_compiling():
            return self._torch_class.step(self, closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # what _use_grad does outside a graph
            return _plain(self._torch_class.step)(self, closure)


class AdamW(_EagerMethods, torch.optim.AdamW):
    _torch_class = torch.optim.AdamW


class SGD(_EagerMethods, torch.optim.SGD):
    _torch_class = torch.optim.SGD


def _register_with_zero() -> None:
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    for cls in (AdamW,):  # torch's SGD is not on DeepSpeed's list: zoo sets zero_allow_untested_optimizer for it
        if cls not in ZERO_SUPPORTED_OPTIMIZERS:
            ZERO_SUPPORTED_OPTIMIZERS.append(cls)


def build(block: Dict[str, Any], param_groups: List[Dict[str, Any]]) -> torch.optim.Optimizer:
    """The optimizer DeepSpeed would build from zoo's own `optimizer` block (engine.optimizer_config):
    torch's AdamW (`torch_adam`) or torch's SGD, with the same arguments."""
    kind, params = block["type"], dict(block["params"])
    if kind == "AdamW":
        if not params.pop("torch_adam", False):
            raise ValueError("zoo.optimizers.build: zoo's AdamW block is torch's AdamW (torch_adam)")
        _register_with_zero()
        return AdamW(param_groups, **params)
    if kind == "SGD":
        return SGD(param_groups, **params)
    raise ValueError(f"zoo.optimizers.build: no eager optimizer for type {kind!r}")

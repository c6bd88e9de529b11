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


def _outside_graphs(name: str):
    """torch.optim.Optimizer's method `name` (none of AdamW, Adam, SGD overrides it) without its
    dynamo wrapper outside a graph, with it inside one."""
    decorated = getattr(torch.optim.Optimizer, name)
    plain = inspect.unwrap(decorated)

    def method(self, *args, **kwargs):
        return (decorated if torch.compiler.is_compiling() else plain)(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _eager_step(torch_class: type):
    """torch_class's step without `_use_grad` outside a graph (grad mode set as it sets it)."""
    plain = inspect.unwrap(torch_class.step)

    def step(self, closure=None):
        if torch.compiler.is_compiling():
            return torch_class.step(self, closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return plain(self, closure)

    return step


class _EagerMethods:
    """Optimizer methods that skip torch's dynamo wrappers outside a compiled graph."""

    add_param_group = _outside_graphs("add_param_group")
    zero_grad = _outside_graphs("zero_grad")
    state_dict = _outside_graphs("state_dict")
    load_state_dict = _outside_graphs("load_state_dict")


class AdamW(_EagerMethods, torch.optim.AdamW):
    step = _eager_step(torch.optim.AdamW)


class SGD(_EagerMethods, torch.optim.SGD):
    step = _eager_step(torch.optim.SGD)


def _register_with_zero() -> None:
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    if AdamW not in ZERO_SUPPORTED_OPTIMIZERS:  # torch's SGD is not on it: zoo sets zero_allow_untested_optimizer
        ZERO_SUPPORTED_OPTIMIZERS.append(AdamW)


def build(block: Dict[str, Any], param_groups: List[Dict[str, Any]]) -> torch.optim.Optimizer:
    """The optimizer DeepSpeed would build from zoo's own `optimizer` block (engine.optimizer_config):
    torch's AdamW (`torch_adam`) or torch's SGD, with the same arguments."""
    kind, params = block["type"], dict(block["params"])
    if kind == "AdamW":
        if not params.pop("torch_adam", False):
            raise ValueError("zoo.engine.optimizers.build: zoo's AdamW block is torch's AdamW (torch_adam)")
        _register_with_zero()
        if "foreach" not in params:  # a raw deepspeed block may name an implementation itself
            # torch's fused kernel: no temporary as large as the parameters (foreach's high-water
            # was 20.9 B a parameter against fused's 16.9; ZeRO-1 at dp1 6 B a parameter less in a
            # step, benchmarks/step_memory.py) and 7.3x faster on this CPU (93 ms against 679 ms
            # for 92M parameters: benchmarks/adamw_impl.py, results in benchmarks/results/)
            params.setdefault("fused", True)
        return AdamW(param_groups, **params)
    if kind == "SGD":
        return SGD(param_groups, **params)
    raise ValueError(f"zoo.engine.optimizers.build: no eager optimizer for type {kind!r}")

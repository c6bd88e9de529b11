"""zoo.engine.optimizers: torch's AdamW and SGD without torch._dynamo's wrappers in an eager run; the
same arithmetic and state as torch's, inside a graph the decorated methods, and the engine
zoo builds uses them (DeepSpeed's own where the raw config names another optimizer)."""
import pytest
import torch

from tests.unit.one_rank import run_one_rank
from zoo.engine import optimizers


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(6, 5, generator=g)), torch.nn.Parameter(torch.randn(5, generator=g))]


CASES = {
    "adamw": (torch.optim.AdamW, optimizers.AdamW, dict(lr=1e-2, betas=[0.9, 0.95], eps=1e-8)),
    "sgd": (torch.optim.SGD, optimizers.SGD, dict(lr=1e-2, momentum=0.9, nesterov=True)),
}


def _train(cls, kwargs, steps=5, state=None):
    params = _params()
    opt = cls([{"params": [params[0]], "weight_decay": 0.1}, {"params": [params[1]], "weight_decay": 0.0}], **kwargs)
    if state is not None:
        opt.load_state_dict(state)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum((p * torch.randn(p.shape, generator=g)).sum() + p.square().sum() for p in params)
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in params], opt


def _same_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, value in a["state"][k].items():
            other = b["state"][k][name]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_steps_and_state_as_torchs_optimizer(case):
    reference_cls, cls, kwargs = CASES[case]
    want, reference = _train(reference_cls, kwargs)
    got, opt = _train(cls, kwargs)
    assert isinstance(opt, reference_cls)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    _same_state(reference.state_dict(), opt.state_dict())
    # torch's state resumes in zoo's optimizer and the other way round, step for step
    want, _ = _train(reference_cls, kwargs, state=opt.state_dict())
    got, _ = _train(cls, kwargs, state=reference.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.parametrize("case", sorted(CASES))
def test_inside_a_graph_the_decorated_methods_run(case, monkeypatch):
    """Where dynamo traces (is_compiling), zoo's methods hand over to torch's decorated ones."""
    reference_cls, cls, kwargs = CASES[case]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # torch's own code takes its graph paths too
    want, _ = _train(reference_cls, kwargs)
    calls = []
    real_step = reference_cls.step
    monkeypatch.setattr(reference_cls, "step", lambda self, closure=None: calls.append(1) or real_step(self, closure))
    got, _ = _train(cls, kwargs)
    assert len(calls) == 5
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_grad_mode_inside_step_is_off_and_restored():
    p = torch.nn.Parameter(torch.ones(3))
    seen = []
    opt = optimizers.AdamW([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step(lambda: seen.append(torch.is_grad_enabled()))
    assert seen == [True]  # torch runs the closure with grad enabled
    assert torch.is_grad_enabled() and p.is_leaf and p.grad_fn is None  # the update recorded no graph
    with torch.no_grad():
        opt.step()
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled()


def test_build_refuses_what_it_does_not_build():
    with pytest.raises(ValueError, match="torch_adam"):
        optimizers.build({"type": "AdamW", "params": {"lr": 1.0}}, [{"params": _params()}])
    with pytest.raises(ValueError, match="Lamb"):
        optimizers.build({"type": "Lamb", "params": {"lr": 1.0}}, [{"params": _params()}])


ENGINE = """
from zoo.engine import optimizers
from zoo.config.schema import Config
from zoo.engine import initialize_engine
from zoo.parallel.topology import Layout, build_grid

def run(stage, name, raw=None):
    cfg = Config()
    cfg.optim.name, cfg.trainer.global_batch_size, cfg.trainer.micro_batch_size = name, 4, 4
    cfg.deepspeed = raw or {}
    layout = Layout(tp=1, pp=1, dp=1, zero_stage=stage)
    engine = initialize_engine(tiny_net(), cfg, layout, build_grid(layout))
    losses = three_steps(engine)
    return type(engine.basic_optimizer), losses

CASES = [(stage, name) for stage in (0, 1, 2) for name in ("adamw", "sgd")]
ours = {case: run(*case) for case in CASES}
assert "torch._dynamo" not in sys.modules
for (stage, name), (kind, losses) in ours.items():
    assert kind is {"adamw": optimizers.AdamW, "sgd": optimizers.SGD}[name], (stage, name, kind)
    block = {"type": "AdamW", "params": {"foreach": False}} if name == "adamw" else {"params": {"dampening": 0.0}}
    torch_kind, reference = run(stage, name, {"optimizer": block})  # another block: DeepSpeed builds torch's
    assert torch_kind is {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[name], (stage, name, torch_kind)
    assert losses == reference, (stage, name, losses, reference)
print("ok")
"""


def test_the_engine_trains_with_them_without_dynamo_and_like_deepspeeds_own():
    """ZeRO 0-2, AdamW and SGD: the engine's optimizer is zoo's, no torch._dynamo is imported, and
    three steps give exactly the losses of the torch optimizer DeepSpeed builds from its config."""
    run_one_rank(ENGINE)

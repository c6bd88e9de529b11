"""model.compile: what is compiled, what validation refuses or warns, and the compile clock."""
from __future__ import annotations

import pytest
import torch

from tests.unit.config.test_config import check, composed
from zoo.config.validate import ConfigError
from zoo.families.registry import family_of_shape as spec_of
from zoo.models.compile import c_compiler
from zoo.parallel.build import build_model


def _shape(family: str):
    from zoo.models.gpt import gpt_shape

    return gpt_shape("tiny", 256, n_layer=2)


def test_the_compile_clock_counts_the_lazy_compilation():
    from zoo.models.compile import compile_model, compile_seconds

    class Tiny(torch.nn.Module):  # defined here: dynamo skips torch.nn's own modules' code
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.tanh(self.fc(x))

    model = Tiny()
    compile_model(model)
    before = compile_seconds()
    model(torch.randn(2, 8)).sum().backward()  # compiles forward and backward here, not at compile_model
    after = compile_seconds()
    model(torch.randn(2, 8)).sum().backward()  # the same graph: nothing compiled
    assert after > before and compile_seconds() == after


def test_compiling_keeps_the_parameter_names():
    from zoo.models.compile import compile_model

    model = build_model(spec_of(_shape("gpt")), _shape("gpt"), seed=0, device=torch.device("cpu"))
    before = list(model.state_dict()), [n for n, _ in model.named_parameters()]
    assert compile_model(model) == 1
    assert (list(model.state_dict()), [n for n, _ in model.named_parameters()]) == before


def test_zero3_and_pp_are_warned_with_the_reason():
    assert any("model.compile=true with parallel.zero_stage=3" in w for w in check(composed("model.compile=true",
                                                                                          "parallel=zero3")))
    assert any("model.compile=true with parallel.pp=2" in w for w in check(composed("model.compile=true",
                                                                                   "parallel=pp")))


def test_no_cxx_compiler_is_one_line_with_the_fix(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert c_compiler() is None
    with pytest.raises(ConfigError, match=r"model.compile=true on the CPU needs a C\+\+ compiler .*CXX=/nonexistent/g\+\+ "
                                          r"is not an executable; install one .* or set model.compile=false"):
        check(composed("model.compile=true"))
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match=r"CXX is unset and g\+\+, inductor's default, is not on PATH"):
        check(composed("model.compile=true"))


def test_compile_passes_validation_where_a_compiler_is(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    if c_compiler() is None:
        pytest.skip("no g++ on this machine")
    check(composed("model.compile=true"))
    check(composed("model.compile=true", "parallel=3d"), world=8)


def test_gpu_compile_needs_triton(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(ConfigError, match=r"model.compile=true on a GPU needs Triton .*pip install triton"):
        check(composed("model.compile=true"), cuda=True)

import subprocess
import sys

import torch


def test_a_model_built_on_meta_skips_its_init_fills_and_restores_them():
    """Built inside on_meta(), the GPT is on the meta device and torch._dynamo was not imported
    (the meta normal_ would have imported it); afterwards torch.nn.init fills real tensors again."""
    code = """
import sys, torch
from zoo.models.gpt import GPT, gpt_shape
from zoo.models.meta import on_meta
with on_meta():
    model = GPT(gpt_shape("tiny", 512))
assert all(p.is_meta for p in model.parameters())
assert "torch._dynamo" not in sys.modules, "a fill ran on meta"
x = torch.zeros(3, 3)
torch.nn.init.ones_(x)
assert bool((x == 1).all()) and not torch.empty(2).is_meta
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_the_fills_come_back_after_an_error_inside():
    from zoo.models.meta import on_meta

    normal = torch.nn.init.normal_
    try:
        with on_meta():
            assert torch.nn.init.normal_ is not normal
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert torch.nn.init.normal_ is normal and not torch.empty(1).is_meta


def test_to_empty_allocates_what_module_to_empty_does_without_sympy():
    """zoo.models.meta.to_empty gives every parameter and buffer the device, shape, strides,
    dtype and requires_grad torch's Module.to_empty gives it, a transposed (non-contiguous) one
    included (it takes empty_like), and a whole model built by zoo.parallel.build imports neither torch.fx's symbolic shapes nor
    sympy (the meta empty_like's Python reference did)."""
    code = """
import sys, torch
from zoo.models.meta import on_meta, to_empty

def module():
    with on_meta():
        m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    m[0].register_buffer("t", torch.empty(5, 2, device="meta").t())
    m[1].bias.requires_grad_(False)
    return m

ours, theirs = to_empty(module(), torch.device("cpu")), module()
theirs.to_empty(device=torch.device("cpu"))
a, b = dict(ours.named_parameters()), dict(theirs.named_parameters())
a.update(ours.named_buffers()); b.update(theirs.named_buffers())
assert a.keys() == b.keys() and len(a) == 8, sorted(a)
for k in a:
    x, y = a[k], b[k]
    assert (x.device, x.shape, x.stride(), x.dtype, x.requires_grad, type(x)) == \\
        (y.device, y.shape, y.stride(), y.dtype, y.requires_grad, type(y)), k
print("ok")
"""
    whole = """
import sys, torch
from zoo.parallel.build import build_model
from zoo.families.registry import family
from zoo.models.gpt import gpt_shape
model = build_model(family("gpt"), gpt_shape("tiny", 512), seed=0, device=torch.device("cpu"))
assert not any(p.is_meta for p in model.parameters())
assert "sympy" not in sys.modules and "torch.fx.experimental.symbolic_shapes" not in sys.modules
print("ok")
"""
    for source in (code, whole):
        out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "ok"

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

"""The ResNet classifier: torchvision's parameter counts, forward shapes of every size, the
pipeline pieces, the layout-free init, and the data-parallel BatchNorm against one
BatchNorm over the whole batch."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from zoo.families.registry import family_of_shape as spec_of
from zoo.models.cnn import ResNet, cnn_shape
from zoo.parallel.build import build_model, count_parameters

CPU = torch.device("cpu")


@pytest.mark.parametrize("size, expected", [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_imagenet_shaped_counts_are_torchvisions(size, expected):
    shape = cnn_shape(size, in_channels=3, num_classes=1000, image_size=224)
    assert count_parameters(spec_of(shape), shape) == expected


@pytest.mark.parametrize("size, channels, pixels", [("tiny", 1, 8), ("resnet18", 3, 32), ("resnet50", 3, 64)])
def test_forward_shapes(size, channels, pixels):
    shape = cnn_shape(size, in_channels=channels, num_classes=7, image_size=pixels)
    model = ResNet(shape).eval()
    with torch.no_grad():
        assert model(torch.randn(2, channels, pixels, pixels)).shape == (2, 7)  # (B, classes)
    assert shape.imagenet_stem == (pixels >= 64)


def test_loss_pieces_and_init():
    shape = cnn_shape("tiny")
    model = build_model(spec_of(shape), shape, seed=2, device=CPU)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 3, 9, 3])
    torch.testing.assert_close(model(x, y), nn.functional.cross_entropy(model(x), y))
    assert sd["layer1.0.bn2.weight"].eq(0).all() and sd["layer1.0.bn1.weight"].eq(1).all()  # blocks start as identity
    assert sd["stem.bn1.running_var"].eq(1).all() and sd["stem.bn1.running_mean"].eq(0).all()
    fan_out = 32 * 3 * 3
    assert sd["layer1.0.conv1.weight"].std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.1)
    from zoo.parallel.build import materialise
    from zoo.parallel.pipeline import StageLayer

    with torch.device("meta"):
        meta = ResNet(shape)
    layers = meta.pipeline_layers()
    assert [layer.paths for layer in layers] == [("stem",), *[(f"layer{s}.{i}",) for s, i, *_ in shape.blocks()],
                                                 ("fc",)]
    assert sum(p.numel() for layer in layers for path in layer.paths
               for p in meta.get_submodule(path).parameters()) == count_parameters(spec_of(shape), shape)
    index = next(i for i, layer in enumerate(layers) if layer.paths == ("layer2.0",))
    piece = StageLayer(meta, index, lambda m: materialise(m, spec_of(shape), shape, seed=2, device=CPU))
    assert torch.equal(piece.state_dict()["layer2.0.conv1.weight"], sd["layer2.0.conv1.weight"])


def _sync_batch_norm(rank, world):
    """Each rank holds half of the batch; outputs, input and parameter gradients (summed over
    ranks) and running statistics equal one BatchNorm2d over the whole batch."""
    import torch.distributed as dist

    from zoo.parallel.parallelize import SyncBatchNorm, sync_batch_norms

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * world, 3, 5, 5, generator=g) * 3 + 1
    upstream = torch.randn(x.shape, generator=g)
    ref = nn.BatchNorm2d(3)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor([0.5, 1.0, 2.0]))
        ref.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    model = nn.Sequential(nn.BatchNorm2d(3))
    model[0].load_state_dict(ref.state_dict())
    sync_batch_norms(model, dist.group.WORLD)
    assert isinstance(model[0], SyncBatchNorm)
    xr = x.clone().requires_grad_()
    expected = ref(xr)  # one training step of the reference: its running statistics move once
    (expected * upstream).sum().backward()
    mine = x[2 * rank:2 * rank + 2].clone().requires_grad_()
    out = model(mine)
    (out * upstream[2 * rank:2 * rank + 2]).sum().backward()
    torch.testing.assert_close(out, expected[2 * rank:2 * rank + 2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.grad, xr.grad[2 * rank:2 * rank + 2], rtol=1e-5, atol=1e-5)
    for p, q in ((model[0].weight, ref.weight), (model[0].bias, ref.bias)):
        grad = p.grad.clone()
        dist.all_reduce(grad)
        torch.testing.assert_close(grad, q.grad, rtol=1e-5, atol=1e-5)
    for name in ("running_mean", "running_var"):
        torch.testing.assert_close(getattr(model[0], name), getattr(ref, name), rtol=1e-5, atol=1e-6)
    model.eval()
    torch.testing.assert_close(model(x), ref.eval()(x), rtol=1e-5, atol=1e-5)


def test_data_parallel_batch_norm_equals_one_batch_norm():
    from tests.unit.parallel._dist import run_ranks

    run_ranks(2, _sync_batch_norm)

"""A ResNet image classifier as a plain single-device module, and its named sizes.

He et al.'s residual networks with torchvision's layout and parameter names (`layer1.0.conv1`,
..., `fc`; only the stem's are `stem.conv1`, `stem.bn1`): BasicBlocks for `tiny` and `resnet18`, Bottlenecks
(expansion 4, stride on the 3x3 conv) for `resnet50`. Images of 64 pixels or more get the
ImageNet stem (7x7 stride-2 conv and a max-pool); smaller ones (the 8x8 digits, 32x32
CIFAR-like images) a 3x3 stride-1 stem that keeps their few pixels. The network is a
flat sequence of pieces (stem, residual blocks, head) so a pipeline can cut it anywhere
between blocks. BatchNorm layers are plain here; under data parallelism the parallelize
step synchronises their statistics across replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from zoo.models.stages import PipeLayer, run_layers

# name: (block, blocks per stage, stage widths)
CNN_SIZES = {
    "tiny": ("basic", (1, 1, 1), (32, 64, 128)),
    "resnet18": ("basic", (2, 2, 2, 2), (64, 128, 256, 512)),
    "resnet50": ("bottleneck", (3, 4, 6, 3), (64, 128, 256, 512)),
}
IMAGENET_STEM_MIN_SIZE = 64


@dataclass(frozen=True)
class CNNShape:
    """Resolved dimensions of one ResNet and the images it classifies."""

    block: str
    layers: Tuple[int, ...]
    widths: Tuple[int, ...]
    in_channels: int
    num_classes: int
    image_size: int

    @property
    def expansion(self) -> int:
        return 4 if self.block == "bottleneck" else 1

    @property
    def imagenet_stem(self) -> bool:
        return self.image_size >= IMAGENET_STEM_MIN_SIZE

    @property
    def stem_width(self) -> int:
        return self.widths[0]

    def blocks(self):
        """(stage, index, in_width, width, stride) of every residual block, in order."""
        in_width = self.stem_width
        for s, (n, width) in enumerate(zip(self.layers, self.widths)):
            for i in range(n):
                yield s + 1, i, in_width, width, (2 if s > 0 and i == 0 else 1)
                in_width = width * self.expansion

    @property
    def num_blocks(self) -> int:
        return sum(self.layers)


def cnn_shape(size: str, *, in_channels: int = 1, num_classes: int = 10, image_size: int = 8) -> CNNShape:
    if size not in CNN_SIZES:
        raise ValueError(f"model.size={size!r} is not a CNN size; choose one of {sorted(CNN_SIZES)}")
    block, layers, widths = CNN_SIZES[size]
    return CNNShape(block=block, layers=layers, widths=widths, in_channels=in_channels,
                    num_classes=num_classes, image_size=image_size)


def cnn_init_std(name: str, shape: CNNShape, param_shape: Tuple[int, ...]) -> Optional[float]:
    """He (fan-out) normal init for convolutions, as torchvision's ResNet; 1/sqrt(fan-in) for
    the classifier; the last BatchNorm of each residual branch starts at zero, so every block
    starts as the identity (Goyal et al. 2017). None: biases zero, other BatchNorms one."""
    last_bn = "bn3" if shape.block == "bottleneck" else "bn2"
    if name.endswith(f"{last_bn}.weight") and name.startswith("layer"):
        return 0.0
    if len(param_shape) == 4:  # (out, in, k, k)
        return math.sqrt(2.0 / (param_shape[0] * param_shape[2] * param_shape[3]))
    if name == "fc.weight":
        return 1.0 / math.sqrt(shape.widths[-1] * shape.expansion)
    return None


class BatchNorm2d(nn.BatchNorm2d):
    """BatchNorm computed in float32 whatever the dtype of the input and weights (bf16/fp16
    under mixed precision, where the running statistics stay float32), as autocast does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.num_batches_tracked.add_(1)
        y = F.batch_norm(x.float(), self.running_mean, self.running_var, self.weight.float(), self.bias.float(),
                         self.training, self.momentum, self.eps)
        return y.to(x.dtype)


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, width, 3, stride), BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3), BatchNorm2d(width)
        self.downsample = (nn.Sequential(_conv(cin, width, 1, stride), BatchNorm2d(width))
                           if stride != 1 or cin != width else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        out = width * 4
        self.conv1, self.bn1 = _conv(cin, width, 1), BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, out, 1), BatchNorm2d(out)
        self.downsample = (nn.Sequential(_conv(cin, out, 1, stride), BatchNorm2d(out))
                           if stride != 1 or cin != out else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class Stem(nn.Module):
    """conv1 + bn1 (+ max-pool for ImageNet-sized images): (B, C_in, H, W) -> (B, width, H', W')."""

    def __init__(self, shape: CNNShape):
        super().__init__()
        k, stride = (7, 2) if shape.imagenet_stem else (3, 1)
        self.conv1 = _conv(shape.in_channels, shape.stem_width, k, stride)
        self.bn1 = BatchNorm2d(shape.stem_width)
        self.pool = shape.imagenet_stem

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.conv1.weight.dtype)  # float32 images; bf16/fp16 weights under mixed precision
        x = F.relu(self.bn1(self.conv1(x)))
        return F.max_pool2d(x, 3, stride=2, padding=1) if self.pool else x


def classify(fc: nn.Linear, features: torch.Tensor) -> torch.Tensor:
    """Global average pool, then the classifier: (B, C, H, W) -> logits (B, classes)."""
    return fc(torch.flatten(F.adaptive_avg_pool2d(features, 1), 1))


def _classify(root: nn.Module, features: torch.Tensor) -> torch.Tensor:
    return classify(root.fc, features)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy, computed in float32 whatever the logits' dtype."""
    return F.cross_entropy(logits.float(), labels)


def make_block(shape: CNNShape, cin: int, width: int, stride: int) -> nn.Module:
    return (Bottleneck if shape.block == "bottleneck" else BasicBlock)(cin, width, stride)


class ResNet(nn.Module):
    """`forward(images)` gives logits (B, classes); `forward(images, labels)` the mean loss."""

    def __init__(self, shape: CNNShape):
        super().__init__()
        self.shape = shape
        self.stem = Stem(shape)
        stages = [nn.ModuleList() for _ in shape.layers]
        for s, _, cin, width, stride in shape.blocks():
            stages[s - 1].append(make_block(shape, cin, width, stride))
        for s, stage in enumerate(stages, start=1):
            self.add_module(f"layer{s}", stage)
        self.fc = nn.Linear(shape.widths[-1] * shape.expansion, shape.num_classes)
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = classification_loss

    def pipeline_layers(self) -> List[PipeLayer]:
        """The forward in order: stem, every residual block, pooling and the classifier."""
        return [PipeLayer(("stem",)), *(PipeLayer((f"layer{s}.{i}",)) for s, i, *_ in self.shape.blocks()),
                PipeLayer(("fc",), run=_classify)]

    def forward(self, images: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = run_layers(self, self.pipeline_layers(), images)  # (B, classes)
        return logits if labels is None else self.loss_fn(logits, labels)

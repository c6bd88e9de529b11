"""Image-classification data, held in memory as normalised float tensors.

Three sources: the 8x8 handwritten digits that ship inside scikit-learn (`digits`: 1,797
real scans, no download), a directory of image files with one sub-directory per class
(`files`, torchvision's ImageFolder layout, optionally under `train/` and `test/`), and a
Hugging Face image dataset through `datasets` (`hub`: a `save_to_disk` directory, a local
directory `load_dataset` reads, or a Hub name). Without a test split of its own, a
stratified `eval_fraction` of the source is held out (fixed seed, so every run and rank
holds out the same images). Pixels are scaled to [0, 1] and standardised per channel with
the training split's mean and std. Everything is loaded into memory: for datasets that
fit in RAM.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from zoo.run.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
SPLIT_SEED = 0


@dataclass
class ImageSplits:
    train_x: torch.Tensor  # (N, C, H, W) float32, standardised
    train_y: torch.Tensor  # (N,) int64
    eval_x: torch.Tensor
    eval_y: torch.Tensor
    classes: List[str]

    @property
    def in_channels(self) -> int:
        return self.train_x.shape[1]

    @property
    def image_size(self) -> int:
        return min(self.train_x.shape[2:])

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def _split(x: np.ndarray, y: np.ndarray, eval_fraction: float):
    from sklearn.model_selection import train_test_split

    try:  # stratified when every class can give one image to each side
        return train_test_split(x, y, test_size=eval_fraction, random_state=SPLIT_SEED, stratify=y)
    except ValueError:
        return train_test_split(x, y, test_size=eval_fraction, random_state=SPLIT_SEED)


def _standardised(train: np.ndarray, held: np.ndarray, train_y, eval_y, classes) -> ImageSplits:
    """uint8-range or [0, 1] float arrays (N, C, H, W) -> standardised tensors."""
    mean = train.mean(axis=(0, 2, 3), keepdims=True)
    std = train.std(axis=(0, 2, 3), keepdims=True) + 1e-6
    as_tensor = lambda a: torch.from_numpy(((a - mean) / std).astype(np.float32))  # noqa: E731
    return ImageSplits(as_tensor(train), torch.as_tensor(train_y, dtype=torch.long), as_tensor(held),
                       torch.as_tensor(eval_y, dtype=torch.long), list(classes))


def load_digits(eval_fraction: float) -> ImageSplits:
    """scikit-learn's 8x8 digits (grey levels 0-16), stratified train/test split."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    x = (digits.images / 16.0)[:, None].astype(np.float32)  # (N, 1, 8, 8)
    train_x, eval_x, train_y, eval_y = _split(x, digits.target, eval_fraction)
    return _standardised(train_x, eval_x, train_y, eval_y, [str(c) for c in digits.target_names])


def _square(size: Optional[int]) -> Optional[Tuple[int, int]]:
    return (size, size) if size else None


def _size_of(x: np.ndarray) -> Tuple[int, int]:
    return x.shape[-1], x.shape[-2]  # (W, H), PIL's order


def _pixels(images: Sequence, wh: Optional[Tuple[int, int]]) -> np.ndarray:
    """PIL images -> (N, C, H, W) float in [0, 1]: grey stays one channel, anything else RGB;
    all resized to `wh` (None: the first image's size)."""
    first = images[0]
    mode = "L" if first.mode in ("1", "L", "I", "I;16", "F") else "RGB"
    wh = wh or first.size
    arrays = [np.asarray(im.convert(mode).resize(wh) if im.size != wh or im.mode != mode else im, dtype=np.float32)
              for im in images]
    x = np.stack(arrays) / 255.0
    return x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)


def _folder(root: Path) -> Tuple[List, List[str]]:
    """(path, class name) of every image under root/<class>/."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files = [(f, c) for c in classes for f in sorted((root / c).rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    return files, classes


def find_image_folder(path: str, key: str = "data.path") -> Tuple[List, List[str]]:
    """([(path, class name) per image] per split, the classes) of an image folder: root/<class>/
    or root/train/<class>/ with root/test/<class>/; DataError if it holds no images."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"{key}={path!r} is not a directory of class sub-directories")
    splits = [root / "train", root / "test"] if (root / "train").is_dir() and (root / "test").is_dir() else [root]
    found = [_folder(r) for r in splits]
    classes = sorted({c for _, cs in found for c in cs})
    if not classes or not all(files for files, _ in found):
        raise DataError(f"{key}={path!r} holds no images in class sub-directories ({', '.join(IMAGE_SUFFIXES)})")
    return found, classes


def _known_classes(held: Sequence[str], classes: Sequence[str], eval_path: str) -> None:
    unknown = sorted(set(held) - set(classes))
    if unknown:
        raise DataError(f"data.eval_path={eval_path!r} has {len(unknown)} class(es) the training data lacks "
                        f"({', '.join(map(str, unknown[:5]))}); the model can only predict data.path's "
                        f"{len(classes)} classes: give held-out images of those")


def load_image_folder(path: str, eval_fraction: float, image_size: Optional[int] = None,
                      eval_path: Optional[str] = None) -> ImageSplits:
    """data.eval_path (a folder of the same layout): its images are the held-out split (its
    test/ split if it has one) and data.path's training images (its train/ split) are all trained on."""
    from PIL import Image

    found, classes = find_image_folder(path)
    if eval_path:
        held, held_classes = find_image_folder(eval_path, "data.eval_path")
        _known_classes(held_classes, classes, eval_path)
        found = [found[0], held[-1]]
    index = {c: i for i, c in enumerate(classes)}
    loaded = []
    for files, _ in found:
        images = [Image.open(f) for f, _ in files]
        wh = _square(image_size) or (_size_of(loaded[0][0]) if loaded else None)
        loaded.append((_pixels(images, wh), np.asarray([index[c] for _, c in files])))
    if len(loaded) == 1:
        train_x, eval_x, train_y, eval_y = _split(*loaded[0], eval_fraction)
    else:
        (train_x, train_y), (eval_x, eval_y) = loaded
    return _standardised(train_x, eval_x, train_y, eval_y, classes)


def _hub_dataset(path: str):
    import datasets

    local = Path(path)
    if local.is_dir() and ((local / "dataset_dict.json").exists() or (local / "state.json").exists()):
        ds = datasets.load_from_disk(str(local))
    else:
        ds = datasets.load_dataset(path)
    return datasets.DatasetDict({"train": ds}) if isinstance(ds, datasets.Dataset) else ds


def _check_columns(split, path: str, columns: Sequence[str]) -> None:
    for column in columns:
        if column not in split.column_names:
            raise DataError(f"the dataset at {path!r} has no column {column!r} (columns: {split.column_names}); "
                            f"set data.image_column / data.label_column")


def load_hub_images(path: str, eval_fraction: float, *, image_column: str = "image", label_column: str = "label",
                    image_size: Optional[int] = None, eval_path: Optional[str] = None) -> ImageSplits:
    """data.eval_path (another dataset): its test, validation or train split (the first it
    has) is the held-out split, and all of data.path's train split is trained on."""
    ds = _hub_dataset(path)
    held_name = next((n for n in ("test", "validation") if n in ds), None)
    train = ds["train"]
    _check_columns(train, path, (image_column, label_column))
    feature = train.features[label_column]
    classes = list(feature.names) if hasattr(feature, "names") else [str(c) for c in sorted(set(train[label_column]))]
    x = _pixels(train[image_column], _square(image_size))
    y = np.asarray(train[label_column])
    if eval_path:
        other = _hub_dataset(eval_path)
        held = other[next(n for n in ("test", "validation", "train", *other) if n in other)]
        _check_columns(held, eval_path, (image_column, label_column))
        eval_y = np.asarray(held[label_column])
        outside = sorted(int(c) for c in set(eval_y.tolist()) if not 0 <= c < len(classes))
        _known_classes(outside, range(len(classes)), eval_path)
        train_x, train_y, eval_x = x, y, _pixels(held[image_column], _size_of(x))
    elif held_name is None:
        train_x, eval_x, train_y, eval_y = _split(x, y, eval_fraction)
    else:
        held = ds[held_name]
        train_x, train_y = x, y
        eval_x, eval_y = _pixels(held[image_column], _size_of(x)), np.asarray(held[label_column])
    return _standardised(train_x, eval_x, train_y, eval_y, classes)

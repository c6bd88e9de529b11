"""The `data.*` keys only the CNN reads (labelled images); `zoo.config.schema.DataConfig`
composes them, and `zoo.families.data_keys.IMAGES` says which of its sources read each."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class ImageDataKeys:
    image_column: str = "image"
    """Column holding the images in a `hub` image dataset (CNN)."""
    label_column: str = "label"
    """Column holding the class labels in a `hub` image dataset (CNN)."""
    image_size: Optional[int] = None
    """CNN: resize `files`/`hub` images to this many pixels square. None: the first image's size."""

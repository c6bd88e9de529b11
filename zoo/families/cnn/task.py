"""The CNN task: a ResNet image classifier (digits by default, image folders, HF image datasets)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from data_pipelines.schedule import SampleStream
from zoo.families.base_task import AccuracyEvaluation, Batch, Task
from zoo.models.cnn import cnn_shape


def load_images(data):
    from data_pipelines import images

    if data.name == "digits":
        return images.load_digits(data.eval_fraction)
    if data.name == "files":
        return images.load_image_folder(data.path, data.eval_fraction, data.image_size, eval_path=data.eval_path)
    return images.load_hub_images(data.path, data.eval_fraction, image_column=data.image_column,
                                  label_column=data.label_column, image_size=data.image_size,
                                  eval_path=data.eval_path)


class CNNTask(AccuracyEvaluation, Task):
    family = "cnn"

    def prepare(self, run_dir: Path, rank: int) -> None:
        cfg = self.cfg
        self.data = load_images(cfg.data)
        d = self.data
        self.shape = cnn_shape(cfg.model.size, in_channels=d.in_channels, num_classes=d.num_classes,
                               image_size=d.image_size)
        self.stream = SampleStream(len(d.train_y), cfg.trainer.seed)
        if rank == 0:
            (run_dir / "classes.json").write_text(json.dumps(d.classes) + "\n")

    def build_options(self, grid) -> dict:
        # No tensor parallelism; BatchNorm statistics are synchronised over the data-parallel replicas.
        cfg = self.cfg
        return dict(seed=cfg.trainer.seed, device=self.device, partition_method=cfg.parallel.partition_method,
                    activation_checkpointing=False,
                    dp_group=grid.get_data_parallel_group() if self.layout.dp > 1 else None)

    def model_meta(self) -> dict:
        s = self.shape
        return {"size": self.cfg.model.size, "block": s.block, "layers": list(s.layers), "widths": list(s.widths),
                "in_channels": s.in_channels, "num_classes": s.num_classes, "image_size": s.image_size}

    def collate(self, split: str, indices: np.ndarray) -> Batch:
        x, y = (self.data.train_x, self.data.train_y) if split == "train" else (self.data.eval_x, self.data.eval_y)
        idx = torch.as_tensor(np.asarray(indices), dtype=torch.long)
        return x[idx], y[idx]

    def num_eval(self) -> int:
        return len(self.data.eval_y)

    def sample_noun(self) -> str:
        s = self.shape
        return f"{s.image_size}x{s.image_size} images of {s.num_classes} classes"

    def final_metrics(self, eval_loss: float, scores: Dict[str, int], sample=None) -> Dict[str, object]:
        """Top-1 accuracy on the held-out images the trainer evaluated (with
        trainer.eval_batches large enough: all of them), counted by the evaluation on the
        distributed model, and always guessing the most frequent training class there."""
        count = self.eval_samples()
        if count == 0 or not scores:
            return {}
        y = self.data.eval_y[:count]
        return {"eval_accuracy": scores["correct"] / scores["counted"], "eval_images": scores["counted"],
                "majority_class_accuracy": torch.bincount(self.data.train_y).argmax().eq(y).float().mean().item()}

"""What a model family's task plugs into the trainer (the rest of a family is its
`FamilySpec`, zoo.families.spec): its data, its model (plain or pipelined, for this rank),
its batches and its family-specific end-of-run metrics.

The trainer owns the loop, the engine, logging and checkpoints; a task owns everything
that differs between a GPT, a BERT and a CNN. Batches are addressed by a layout-free data
position (samples consumed globally), so a run can change tp, pp or dp and continue.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn

from data_pipelines.schedule import SampleStream, micro_batch_start
from zoo.config.schema import Config
from zoo.parallel.topology import Layout, tp_group

Batch = Tuple[torch.Tensor, torch.Tensor]
DEFAULT_EVAL_ROUNDS = 100  # trainer.eval_batches=None: the whole held-out split, at most this many rounds


class Task:
    """Base class: fixed-size samples read in the seeded, layout-free stream order."""

    family = ""

    def __init__(self, cfg: Config, device: torch.device, layout: Layout):
        self.cfg, self.device, self.layout = cfg, device, layout
        self.stream: SampleStream | None = None
        self.shape = None  # the model's resolved dimensions: set by prepare()
        self.init_state = None  # full weights to start from (model.init_from): set by prepare()

    # -- set up ---------------------------------------------------------------------------
    def prepare(self, run_dir: Path, rank: int) -> None:
        """Load (building and caching if needed) the data; rank 0 saves what the run
        directory needs (e.g. the tokenizer). Sets `self.stream` over the train samples."""
        raise NotImplementedError

    def build_options(self, grid) -> dict:
        """How this rank builds its model (zoo.build.build): the groups and options it needs."""
        cfg = self.cfg
        return dict(seed=cfg.trainer.seed, device=self.device, tp_group=tp_group(grid),
                    sequence_parallel=cfg.parallel.sequence_parallel, partition_method=cfg.parallel.partition_method,
                    activation_checkpointing=cfg.model.activation_checkpointing)

    def build_model(self, grid) -> nn.Module:
        """This rank's model: plain and tensor-parallel, or this stage's PipelineModule; under
        ZeRO-3 built partitioned, piece by piece (zoo.build.materialise_partitioned)."""
        from zoo.build import ZeroThree, build

        options = self.build_options(grid)
        if self.layout.zero_stage == 3:
            from zoo.engine import deepspeed_config
            from zoo.engine.config import TORCH_DTYPES

            options["zero3"] = ZeroThree(config=deepspeed_config(self.cfg, self.layout),
                                         group=grid.get_data_parallel_group(),
                                         dtype=TORCH_DTYPES[self.cfg.precision.dtype])
        model = build(self.shape, self.layout, weights=self.init_state, **options)
        if self.cfg.model.compile:
            from zoo.model_compile import compile_model

            compile_model(model)
        return model

    def plain_model(self) -> nn.Module:
        """The single-device model (CPU), for loading consolidated weights."""
        from zoo.families import family_of_shape

        return family_of_shape(self.shape).model(self.shape)

    def num_params(self) -> int:
        from zoo.build import count_parameters

        return count_parameters(self.shape)

    def model_meta(self) -> dict:
        """What a checkpoint must match to load into this model (family dimensions)."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.cfg.model.family}-{self.cfg.model.size}"

    # -- batches --------------------------------------------------------------------------
    def collate(self, split: str, indices: np.ndarray) -> Batch:
        """(inputs, labels) of the samples `indices` of `split` ('train' or 'eval')."""
        raise NotImplementedError

    def num_eval(self) -> int:
        raise NotImplementedError

    def tokens_per_sample(self) -> int:
        """Tokens (or pixels' worth of samples: 1) one sample counts for throughput."""
        return 1

    def padding_efficiency(self) -> float:
        """Real tokens / padded slots over the run's training batches (fixed-size samples: 1)."""
        return 1.0

    def micro_batch(self, consumed: int, micro: int, *, micro_batch: int, global_batch: int,
                    dp_rank: int, dp_size: int) -> Batch:
        start = micro_batch_start(consumed, micro, global_batch=global_batch, micro_batch=micro_batch,
                                  dp_rank=dp_rank, dp_size=dp_size)
        return self._to_device(self.collate("train", self.stream.indices(start, micro_batch)))

    def eval_rounds(self, micro_batch: int, dp_size: int) -> int:
        """Evaluation rounds (one micro-batch on every data-parallel rank) this run makes:
        trainer.eval_batches, or as many as the held-out split holds."""
        asked = self.cfg.trainer.eval_batches
        return min(DEFAULT_EVAL_ROUNDS if asked is None else asked, self.num_eval() // (micro_batch * dp_size))

    def check_eval_split(self, micro_batch: int, dp_size: int) -> Optional[str]:
        """Refuse (DataError) a held-out split smaller than one evaluation round: the run would
        end without an evaluation. Returns a warning when it holds fewer rounds than asked."""
        from zoo.errors import DataError

        asked, held, per_round = self.cfg.trainer.eval_batches, self.num_eval(), micro_batch * dp_size
        if asked == 0:
            return None
        eval_path = getattr(self.cfg.data, "eval_path", None)
        source = f"data.eval_path={eval_path}" if eval_path else \
            f"data.eval_fraction={self.cfg.data.eval_fraction:g} of the data"
        if held < per_round:
            needed_fraction = self.cfg.data.eval_fraction * per_round / max(held, 1)
            more = ("give data.eval_path more text" if eval_path else
                    f"raise data.eval_fraction (to about {min(needed_fraction, 0.5):.2g}), use more data")
            raise DataError(
                f"the held-out split has {held} samples ({source}), fewer than one evaluation batch "
                f"(micro-batch {micro_batch} x dp {dp_size} = {per_round}): the run would end without an "
                f"evaluation; {more}, or set trainer.eval_batches=0 to train without evaluating")
        if asked is not None and held // per_round < asked:
            return (f"trainer.eval_batches={asked} but the held-out split ({held} samples, {source}) holds "
                    f"{held // per_round} evaluation batches of {per_round}: evaluating on {held // per_round}")
        return None

    def eval_batches(self, *, micro_batch: int, dp_rank: int, dp_size: int) -> List[Batch]:
        """This rank's held-out micro-batches, one per round (`eval_rounds`); ranks take disjoint ones."""
        per_round = micro_batch * dp_size
        rounds = self.eval_rounds(micro_batch, dp_size)
        return [self._to_device(self.collate("eval", np.arange(r * per_round + dp_rank * micro_batch,
                                                               r * per_round + (dp_rank + 1) * micro_batch)))
                for r in range(rounds)]

    def _to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    # -- the end of a run -----------------------------------------------------------------
    def eval_metrics(self, eval_loss: float, model=None) -> Dict[str, object]:
        """What a periodic evaluation reports besides its loss; `model` is the plain model with
        the consolidated weights (rank 0) when `eval_metrics_need_weights()`, else None."""
        return {}

    def eval_metrics_need_weights(self) -> bool:
        return False

    def final_metrics(self, model, eval_loss: float) -> Dict[str, object]:
        """Family metrics on rank 0; `model` is the plain model with the consolidated
        weights when `final_metrics_need_weights()`, else None."""
        return {}

    def final_metrics_need_weights(self) -> bool:
        """Whether `final_metrics` needs the trained weights (consolidated on rank 0)."""
        return True


class AccuracyEvaluation:
    """A family whose held-out metric is an accuracy (BERT's masked tokens, the CNN's images):
    every periodic evaluation reports it too, from the final metrics on the same samples."""

    def eval_metrics_need_weights(self) -> bool:
        return True

    def eval_metrics(self, eval_loss: float, model=None) -> Dict[str, object]:
        if model is None:
            return {}
        out = self.final_metrics(model, eval_loss)
        return {k: out[k] for k in ("eval_accuracy", "baseline_accuracy", "majority_class_accuracy") if k in out}

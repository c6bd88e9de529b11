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
from zoo.parallel.topology import Layout, replica_group, tp_group

Batch = Tuple[torch.Tensor, torch.Tensor]
BUILT_IN = {"pydoc": "the Python documentation inside CPython", "digits": "scikit-learn's 8x8 digits",
            "chat": "2,000 generated conversations: reverse or sort a few words"}
DEFAULT_EVAL_BATCHES = 20  # trainer.eval_batches=None: the whole held-out split, at most this many global batches


class Task:
    """Base class: fixed-size samples read in the seeded, layout-free stream order."""

    family = ""
    weighs_tokens = False
    """Whether its targets are masked unevenly across samples: the trainer then weighs each
    micro-batch's loss so the step's is the mean over the global batch's targets
    (zoo.parallel.token_weights)."""

    def __init__(self, spec, cfg: Config, device: torch.device, layout: Layout):
        self.spec = spec  # the family's FamilySpec (it made this task: FamilySpec.new_task)
        self.cfg, self.device, self.layout = cfg, device, layout
        self.stream: SampleStream | None = None
        self.shape = None  # the model's resolved dimensions: set by prepare()
        self.init_state = None  # full weights to start from (model.init_from): set by prepare()

    def recorded_config(self) -> Dict[str, object]:
        """The config as the run directory's config.yaml and wandb record it: the model's
        dimensions, and only the data keys this run reads."""
        from zoo.config.schema import recorded
        from zoo.families.data_keys import unread

        return recorded(self.cfg, self.shape, unread(self.cfg.data, self.spec.data_keys, self.cfg.model.init_from))

    # -- set up ---------------------------------------------------------------------------
    def prepare(self, run_dir: Path, rank: int) -> None:
        """Load (building and caching if needed) the data; rank 0 saves what the run
        directory needs (e.g. the tokenizer). Sets `self.stream` over the train samples."""
        raise NotImplementedError

    def build_options(self, grid) -> dict:
        """How this rank builds its model (zoo.parallel.build.build): the groups and options it needs."""
        cfg = self.cfg
        return dict(seed=cfg.trainer.seed, device=self.device, tp_group=tp_group(grid),
                    sequence_parallel=cfg.parallel.sequence_parallel, partition_method=cfg.parallel.partition_method,
                    activation_checkpointing=cfg.model.activation_checkpointing)

    def build_model(self, grid, init: bool = True) -> nn.Module:
        """This rank's model: plain and tensor-parallel, or this stage's PipelineModule; under
        ZeRO-3 built partitioned, piece by piece (zoo.parallel.build.materialise_partitioned).
        `init=False`: the weights are not initialised, for a resume that fills them all; nor are
        they where model.init_from's import fills every parameter (or fails naming one it lacks)."""
        from zoo.parallel.build import ZeroThree, build

        options = {**self.build_options(grid), "init": init and self.init_state is None}
        if self.layout.zero_stage == 3:
            from zoo.engine import deepspeed_config
            from zoo.engine.config import TORCH_DTYPES

            options["zero3"] = ZeroThree(config=deepspeed_config(self.cfg, self.layout),
                                         group=replica_group(grid),
                                         dtype=TORCH_DTYPES[self.cfg.precision.dtype], mpu=grid)
        model = build(self.spec, self.shape, self.layout, weights=self.init_state, **options)
        if self.cfg.model.compile:
            from zoo.models.compile import compile_model

            compile_model(model)
        return model

    def plain_model(self) -> nn.Module:
        """The single-device model (CPU): what FLOPs are counted on (on meta) and tests load full weights into."""
        return self.spec.model(self.shape)

    def num_params(self) -> int:
        from zoo.parallel.build import count_parameters

        return count_parameters(self.spec, self.shape)

    def model_meta(self) -> dict:
        """What a checkpoint must match to load into this model (family dimensions)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.cfg.model.label

    def sample_noun(self) -> str:
        """What one training sample is, for the start line (`blocks of 128 tokens`)."""
        return "samples"

    def data_line(self) -> str:
        """The start line naming the data the run reads and its size (after prepare)."""
        d = self.cfg.data
        if d.mix:
            source = "data.mix of " + ", ".join(f"{m.get('name')}{' ' + str(m['path']) if m.get('path') else ''}"
                                                f" x{m.get('weight', 1)}" for m in d.mix)
        else:
            source = f"data={d.name}" + (f" data.path={d.path}" if d.path else f" ({BUILT_IN.get(d.name, 'built in')})")
        held = f"data.eval_path={d.eval_path}" if d.eval_path else f"data.eval_fraction={d.eval_fraction:g}"
        return (f"data: {source}: {self.num_train():,} {self.sample_noun()} to train on, "
                f"{self.num_eval():,} held out ({held})")

    # -- batches --------------------------------------------------------------------------
    def collate(self, split: str, indices: np.ndarray) -> Batch:
        """(inputs, labels) of the samples `indices` of `split` ('train' or 'eval')."""
        raise NotImplementedError

    def num_eval(self) -> int:
        raise NotImplementedError

    def num_train(self) -> int:
        return self.stream.num_samples

    def tokens_per_sample(self) -> int:
        """Tokens (or pixels' worth of samples: 1) one sample counts for throughput."""
        return 1

    def padding_efficiency(self) -> float:
        """Real tokens / padded slots over the run's training batches (fixed-size samples: 1)."""
        return 1.0

    def varying_length_pad_to(self) -> Optional[int]:
        """What micro-batches of samples of varying length are padded to: the block under pp x tp
        (DeepSpeed's pipeline then splits the activations it sends over the tp group and keeps
        the first micro-batch's shape for every later one), else None (each to its longest
        sample; a pipeline is then built for shapes that vary)."""
        layout = self.layout
        return self.shape.block_size if layout.pp > 1 and layout.tp > 1 else None

    def micro_batch(self, consumed: int, micro: int, *, micro_batch: int, global_batch: int,
                    dp_rank: int, dp_size: int) -> Batch:
        start = micro_batch_start(consumed, micro, global_batch=global_batch, micro_batch=micro_batch,
                                  dp_rank=dp_rank, dp_size=dp_size)
        return self._to_device(self.collate("train", self.stream.indices(start, micro_batch)))

    def eval_samples(self) -> int:
        """How many held-out samples an evaluation scores, the same on every layout: the first
        trainer.eval_batches x trainer.global_batch_size of the split (None: all of it, at most
        DEFAULT_EVAL_BATCHES global batches; 0: none)."""
        t = self.cfg.trainer
        batches = DEFAULT_EVAL_BATCHES if t.eval_batches is None else t.eval_batches
        return min(self.num_eval(), batches * t.global_batch_size)

    def check_eval_split(self) -> Optional[str]:
        """Refuse (DataError) an empty held-out split where the run evaluates: it would end
        without an evaluation. Returns a warning when it holds fewer samples than asked."""
        from zoo.run.errors import DataError

        t, held = self.cfg.trainer, self.num_eval()
        if t.eval_batches == 0:
            return None
        eval_path = getattr(self.cfg.data, "eval_path", None)
        source = f"data.eval_path={eval_path}" if eval_path else \
            f"data.eval_fraction={self.cfg.data.eval_fraction:g} of the data"
        if held == 0:
            more = ("give data.eval_path more text" if eval_path else
                    f"raise data.eval_fraction (e.g. to {min(2 * self.cfg.data.eval_fraction, 0.5):.2g}), use more data")
            raise DataError(f"the held-out split is empty ({source}): the run would end without an evaluation; "
                            f"{more}, or set trainer.eval_batches=0 to train without evaluating")
        asked = None if t.eval_batches is None else t.eval_batches * t.global_batch_size
        if asked is not None and held < asked:
            return (f"trainer.eval_batches={t.eval_batches} asks for {asked} held-out samples (global batches of "
                    f"{t.global_batch_size}) but the split holds {held} ({source}): evaluating on {held}")
        return None

    def eval_batches(self, *, micro_batch: int, dp_rank: int, dp_size: int) -> List[Batch]:
        """This rank's held-out micro-batches: the `eval_samples()` first samples of the split in
        rounds of one micro-batch per data-parallel rank, ranks taking disjoint ones. The last
        round is filled with copies of sample 0 whose targets are all -100 (counted for no loss),
        so every rank runs the same number of full micro-batches (ZeRO-3's and the pipeline's
        collectives) and every layout scores exactly the same samples."""
        from zoo.models.losses import IGNORE

        count, per_round = self.eval_samples(), micro_batch * dp_size
        batches = []
        for r in range(-(-count // per_round)):
            wanted = np.arange(r * per_round + dp_rank * micro_batch, r * per_round + (dp_rank + 1) * micro_batch)
            real = wanted < count
            x, y = self.collate("eval", np.where(real, wanted, 0))
            if not real.all():
                y = y.clone()
                y[torch.from_numpy(~real)] = IGNORE
            batches.append(self._to_device((x, y)))
        return batches

    def _to_device(self, batch: Batch) -> Batch:
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    # -- the end of a run -----------------------------------------------------------------
    def eval_metrics(self, eval_loss: float, scores: Dict[str, int]) -> Dict[str, object]:
        """What a periodic evaluation reports besides its loss (rank 0); `scores`: the
        evaluation's tally (`eval_tally`), summed over the job, else empty."""
        return {}

    def eval_tally(self, tp_group):
        """What the evaluation's forward counts besides the loss (zoo.families.accuracy), or None."""
        return None

    def sampling(self):
        """The end-of-run sample to decode on the distributed model (zoo.parallel.generate.Sampling), or None."""
        return None

    def final_metrics(self, eval_loss: float, scores: Dict[str, int], sample: Optional[List[int]]) -> Dict[str, object]:
        """Family metrics on rank 0, from the last evaluation's loss and tally and the sample's
        tokens (prompt included; None without one)."""
        return {}


class AccuracyEvaluation:
    """A family whose held-out metric is an accuracy (BERT's masked tokens, the CNN's images),
    counted by the evaluation's own forward on the distributed model: every periodic
    evaluation reports it too, with the final metrics' baselines on the same samples."""

    def eval_tally(self, tp_group):
        from zoo.families.accuracy import TopOneTally

        return TopOneTally(tp_group)

    def eval_metrics(self, eval_loss: float, scores: Dict[str, int]) -> Dict[str, object]:
        if not scores:
            return {}
        out = self.final_metrics(eval_loss, scores, None)
        return {k: out[k] for k in ("eval_accuracy", "baseline_accuracy", "majority_class_accuracy") if k in out}


class TextDocuments:
    """What the text families (GPT and Llama's CausalLMTask, BERT's task) share when they read
    documents rather than a prepared directory: the import and the tokenizer's choice, and the
    held-out source of data.eval_path. Mixed into a Task (self.cfg, self.spec, self.data_counts)."""

    def _import_and_tokenizer(self, docs, source_key: str, train_tokenizer, pad_multiple: Optional[int] = None):
        """(model.init_from's dimensions or None, the tokenizer directory); sets self.init_state to
        the import's weights. The tokenizer: data.tokenizer, else init_from's own (a tokenizer.json
        beside its weights), else one `train_tokenizer` trains on `docs` (cached by `source_key`)."""
        from zoo.families.data_keys import own_tokenizer

        cfg = self.cfg
        self.init_state, meta = None, None
        if cfg.model.init_from:  # the architecture and the weights
            from zoo.checkpoint.hf_weights import read_hf
            from zoo.families.transformer import trained_block

            meta, self.init_state = read_hf(cfg.model.init_from, self.spec, pad_multiple)
            meta = trained_block(self.spec, meta, cfg.model)
        tok_dir = own_tokenizer(cfg.data, cfg.model.init_from)
        return meta, tok_dir or str(train_tokenizer(docs, cfg.data.vocab_size, source_key, cfg.data.cache_dir))

    def _held_out_source(self):
        """data.eval_path's source (opened as data.path is, not read), or None."""
        d = self.cfg.data
        if not d.eval_path:
            return None
        from data_pipelines.text_sources import as_eval_path_error, open_source
        from zoo.run.errors import DataError

        try:
            return open_source("hub" if d.name == "hub" else "files", d.eval_path, d.text_column)
        except DataError as err:
            raise as_eval_path_error(err, d.eval_path) from None

    def _held_out_documents(self):
        """data.eval_path's documents in memory (read as data.path is), or None; their counts join
        self.data_counts as eval_*."""
        source = self._held_out_source()
        if source is None:
            return None
        from data_pipelines.text_sources import Documents, as_eval_path_error, no_text

        counts: dict = {}
        texts = list(source.texts(counts))
        if not texts:
            raise as_eval_path_error(no_text(source, counts), self.cfg.data.eval_path)
        self.data_counts.update({f"eval_{k}": v for k, v in counts.items()})
        return Documents(texts, source.key, counts)

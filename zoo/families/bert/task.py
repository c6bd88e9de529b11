"""The BERT task: masked-language modelling on sentence-pair samples of any text source
(the embedded corpus, data=files, data=hub, data.mix): pairs where a document has several
sentences, single segments otherwise; bad records refused or skipped and counted as for GPT.
data=prepared (a pre-tokenized file): its blocks as single segments. data.eval_path: a
held-out source of its own, read as data.path is."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import numpy as np

from data_pipelines.schedule import micro_batch_start
from zoo.engine import micro_batching
from zoo.families.base_task import AccuracyEvaluation, Batch, Task, TextDocuments
from zoo.families.transformer import padded_vocab, shape_from_config
from zoo.models.bert import BertShape, bert_shape
from zoo.run.errors import ConfigError


class BertTask(AccuracyEvaluation, TextDocuments, Task):
    family = "bert"

    def prepare(self, run_dir: Path, rank: int) -> None:
        from data_pipelines.bucket_stream import PooledBuckets
        from data_pipelines.mlm import BucketedStream, MLMBatches

        cfg = self.cfg
        if cfg.data.name == "prepared":  # pre-tokenized, memory-mapped (python -m data_pipelines.prepare)
            self._prepare_pretokenized(run_dir, rank)
        else:
            self._prepare_documents(run_dir, rank)
        self.batches = MLMBatches(self.samples, self.tokenizer, seed=cfg.trainer.seed,
                                  mlm_probability=cfg.data.mlm_probability)
        samples, n_train, batch, seed = self.samples, len(self.samples.train), cfg.trainer.global_batch_size, cfg.trainer.seed
        if n_train < batch:  # the length buckets hold whole global batches
            from zoo.run.errors import DataError

            source = f"data.path={cfg.data.path}" if cfg.data.path else f"data={cfg.data.name}"
            raise DataError(f"{source} makes {n_train} training samples of up to "
                            f"{self.shape.block_size} tokens, fewer than one global batch "
                            f"(trainer.global_batch_size={batch}); give more text, or lower "
                            f"trainer.global_batch_size to at most {n_train}")

        def length_of(positions: np.ndarray) -> np.ndarray:  # positions in the training set
            return samples.length_of(samples.train[positions])

        def legacy(_saved) -> BucketedStream:  # the order of checkpoints written before PooledBuckets
            return BucketedStream(length_of(np.arange(n_train)), global_batch=batch, seed=seed)

        self.stream = PooledBuckets(n_train, length_of, global_batch=batch, seed=seed, legacy=legacy)
        self.train_tokens = samples.tokens_of(samples.train)  # summed a chunk at a time
        self.pad_to = self.varying_length_pad_to()

    def _check_special_tokens(self, where: str) -> None:
        missing = [k for k in ("mask_token", "pad_token", "cls_token", "sep_token") if getattr(self.tokenizer, k) is None]
        if missing:
            raise ConfigError(f"{where} has no {', '.join(missing)}; masked-LM training needs BERT's special tokens "
                              f"(leave data.tokenizer null to train a WordPiece one; for data=prepared, prepare "
                              f"with such a tokenizer, e.g. a BERT run's RUN_DIR/tokenizer)")

    def _model_shape(self, meta):
        cfg = self.cfg
        return (BertShape(**meta, dropout=cfg.model.dropout, pad_token_id=self.tokenizer.pad_token_id) if meta
                else shape_from_config(bert_shape, cfg.model, padded_vocab(len(self.tokenizer), cfg.model),
                                       pad_token_id=self.tokenizer.pad_token_id))

    def _prepare_pretokenized(self, run_dir: Path, rank: int) -> None:
        """Single segments of the prepared blocks ([CLS] block [SEP]): no sentence pairs, since
        the file keeps no sentence boundaries."""
        from transformers import AutoTokenizer

        from data_pipelines.mlm import PackedMLMSamples

        cfg, path = self.cfg, Path(self.cfg.data.path).expanduser()
        self.init_state = None
        self.tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"))
        self._check_special_tokens(f"data.path={cfg.data.path}'s tokenizer")
        self.shape = self._model_shape(None)
        held = Path(cfg.data.eval_path).expanduser() if cfg.data.eval_path else None
        self.samples = PackedMLMSamples(path, self.shape.block_size, cfg.data.eval_fraction, eval_directory=held,
                                        cls_id=self.tokenizer.cls_token_id, sep_id=self.tokenizer.sep_token_id)
        self.data_counts = dict(self.samples.blocks.meta.get("skipped", {}))
        if rank == 0 and not (run_dir / "tokenizer").exists():
            self.tokenizer.save_pretrained(str(run_dir / "tokenizer"))

    def _prepare_documents(self, run_dir: Path, rank: int) -> None:
        from transformers import AutoTokenizer

        from data_pipelines.mlm import load_mlm_samples, prepare_mlm_samples
        from data_pipelines.text_sources import read_documents
        from data_pipelines.tokenizer import save_tokenizer, train_bert_tokenizer

        cfg = self.cfg
        documents = read_documents(cfg.data)
        docs, source_key, self.data_counts = documents.texts, documents.key, documents.counts
        meta, tok_dir = self._import_and_tokenizer(docs, source_key, train_bert_tokenizer)
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self._check_special_tokens(f"data.tokenizer={tok_dir!r}")
        block = meta["block_size"] if meta else shape_from_config(bert_shape, cfg.model).block_size
        held = self._held_out_documents()
        entry = prepare_mlm_samples(docs, tok_dir, block_size=block,
                                    eval_fraction=cfg.data.eval_fraction, source_key=source_key,
                                    cache_dir=cfg.data.cache_dir, held_docs=held and held.texts,
                                    held_key=held and held.key)
        if rank == 0:
            save_tokenizer(tok_dir, run_dir / "tokenizer")
        self.samples = load_mlm_samples(entry)
        self.shape = self._model_shape(meta)

    def build_options(self, grid) -> dict:
        return {**super().build_options(grid), "dynamic_shape": self.pad_to is None}  # (varying_length_pad_to)

    def model_meta(self) -> dict:
        s = self.shape
        return {"n_layer": s.n_layer, "n_head": s.n_head, "n_embd": s.n_embd, "block_size": s.block_size,
                "vocab_size": s.vocab_size, "ffn_mult": s.ffn_mult}

    def tokens_per_sample(self) -> int:
        """Real (unpadded) tokens of the average training sample."""
        return int(round(self.train_tokens / len(self.samples.train)))

    def sample_noun(self) -> str:
        return f"samples of up to {self.shape.block_size} tokens ({self.train_tokens:,} tokens)"

    # -- batches ------------------------------------------------------------------------------
    def collate(self, split: str, indices: np.ndarray) -> Batch:
        numbers = (self.samples.train if split == "train" else self.samples.eval)[indices]
        return self.batches.batch(numbers, split=split, length=self.pad_to)

    def micro_batch(self, consumed: int, micro: int, *, micro_batch: int, global_batch: int,
                    dp_rank: int, dp_size: int) -> Batch:
        """As the base class, with the stream's epoch of each sample: masks change per epoch."""
        start = micro_batch_start(consumed, micro, global_batch=global_batch, micro_batch=micro_batch,
                                  dp_rank=dp_rank, dp_size=dp_size)
        numbers = self.samples.train[self.stream.indices(start, micro_batch)]
        return self._to_device(self.batches.batch(numbers, split="train", epochs=self.stream.epochs(start, micro_batch),
                                                  length=self.pad_to))

    def num_eval(self) -> int:
        return len(self.samples.eval)

    def num_train(self) -> int:
        return len(self.samples.train)

    # -- the end of a run ---------------------------------------------------------------------
    def _micro_and_dp(self) -> tuple[int, int]:
        return micro_batching(self.cfg.trainer, self.cfg.parallel, self.layout)[0], self.layout.dp

    def padding_efficiency(self) -> float:
        """Real tokens / padded slots over every training micro-batch of the run."""
        t = self.cfg.trainer
        return self.stream.padding_efficiency(t.max_steps * t.global_batch_size, self._micro_and_dp()[0],
                                              pad_to=self.pad_to)

    def _most_frequent_token(self) -> int:
        """The training samples' most frequent non-special token (the baseline's guess): counted
        once per run, not at every periodic evaluation."""
        if getattr(self, "_most_frequent", None) is None:
            counts = getattr(self.samples, "unigram_counts", None)  # data=prepared: over the whole file
            if counts is not None:
                padded = np.zeros(self.shape.vocab_size, dtype=np.int64)
                padded[:len(counts)] = counts
                counts = padded
                counts[self.tokenizer.all_special_ids] = 0
                self._most_frequent = int(counts.argmax())
                return self._most_frequent
            ids = np.asarray(self.samples.ids)
            counts = np.bincount(np.concatenate([ids[self.samples.offsets[i]:self.samples.offsets[i + 1]]
                                                 for i in self.samples.train]), minlength=self.shape.vocab_size)
            counts[self.tokenizer.all_special_ids] = 0
            self._most_frequent = int(counts.argmax())
        return self._most_frequent

    def final_metrics(self, eval_loss: float, scores: Dict[str, int], sample=None) -> Dict[str, object]:
        """Masked-token accuracy on the held-out samples the trainer evaluated (counted by the
        evaluation on the distributed model), the accuracy of always predicting the most
        frequent training token on the same targets, and what reading made and skipped."""
        micro, count = self._micro_and_dp()[0], self.eval_samples()
        most_frequent = self._most_frequent_token()
        baseline = total = 0
        for start in range(0, count, micro):  # the labels alone: no model
            _, labels = self.collate("eval", np.arange(start, min(start + micro, count)))
            selected = labels != -100
            baseline += int((labels[selected] == most_frequent).sum())
            total += int(selected.sum())
        out: Dict[str, object] = {}  # padding_efficiency: the monitor's summary has it
        if total and scores.get("counted"):
            out.update(eval_accuracy=scores["correct"] / scores["counted"], baseline_accuracy=baseline / total,
                       eval_masked_tokens=scores["counted"],
                       baseline_token=self.tokenizer.convert_ids_to_tokens(most_frequent))
        # What reading skipped or repaired, counted (nothing is dropped silently), and the samples made.
        out["data"] = {**self.data_counts, **{k: self.samples.meta[k] for k in ("documents", "sentences", "samples",
                                                                              "eval_documents", "eval_samples")
                                              if k in getattr(self.samples, "meta", {})}}
        return out

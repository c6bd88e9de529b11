"""The causal language models' task (GPT, Llama): next-token prediction on packed token
blocks of any text source, with a byte-level BPE trained on it (or the imported model's
tokenizer); perplexities and a generated sample at the end. The model's shape comes from
the family's spec, so every decoder family shares this task."""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Dict

import numpy as np
import torch
import torch.nn as nn

from data_pipelines.schedule import SampleStream
from zoo.families.base_task import Batch, Task, TextDocuments
from zoo.families.transformer import padded_vocab

PROMPT_TOKENS = 8  # the default prompt: this many tokens from the start of the held-out split


class CausalLMTask(TextDocuments, Task):
    def _shape(self, meta=None):
        """The model's shape: the imported model's (its config.json's fields), else the config's
        with the tokenizer's vocabulary padded."""
        cfg, spec = self.cfg, self.spec
        if meta is None:
            return spec.shape(cfg.model, padded_vocab(len(self.tokenizer), cfg.model))
        names = {f.name for f in dataclasses.fields(spec.shape_type)}
        return spec.shape_type(**meta, **({"dropout": cfg.model.dropout} if "dropout" in names else {}))

    def prepare(self, run_dir: Path, rank: int) -> None:
        cfg = self.cfg
        if cfg.data.name == "prepared":  # pre-tokenized, memory-mapped (python -m data_pipelines.prepare)
            self._prepare_pretokenized(run_dir, rank)
        else:
            self._prepare_documents(run_dir, rank)
        self.stream = SampleStream(len(self.blocks.train), cfg.trainer.seed)
        # data.document_mask: the token that ends each document in the packed blocks.
        self.document_end = int(self.blocks.meta["eos_id"]) if cfg.data.document_mask else None

    def build_options(self, grid) -> dict:
        return {**super().build_options(grid), "document_end": self.document_end}

    def plain_model(self) -> nn.Module:
        model = super().plain_model()
        model.document_end = self.document_end  # the sample is generated as the model was trained
        return model

    def _prepare_pretokenized(self, run_dir: Path, rank: int) -> None:
        from transformers import AutoTokenizer

        from data_pipelines.prepare import PreparedBlocks

        cfg, path = self.cfg, Path(self.cfg.data.path)
        self.init_state = None
        self.tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"))
        self.shape = self._shape()
        held = Path(cfg.data.eval_path).expanduser() if cfg.data.eval_path else None
        self.blocks = PreparedBlocks(path, self.shape.block_size, cfg.data.eval_fraction, eval_directory=held)
        self.data_counts = dict(self.blocks.meta.get("skipped", {}))
        if rank == 0 and not (run_dir / "tokenizer").exists():
            self.tokenizer.save_pretrained(str(run_dir / "tokenizer"))

    def _prepare_documents(self, run_dir: Path, rank: int) -> None:
        from data_pipelines.lm import load_packed_blocks, prepare_packed_blocks
        from data_pipelines.text_sources import read_documents
        from data_pipelines.tokenizer import LazyTokenizer, load_tokenizer, save_tokenizer, train_gpt_tokenizer

        cfg = self.cfg
        documents = read_documents(cfg.data)
        docs, source_key, self.data_counts = documents.texts, documents.key, documents.counts
        meta, tok_dir = self._import_and_tokenizer(docs, source_key, train_gpt_tokenizer, cfg.model.vocab_pad_multiple)
        block = meta["block_size"] if meta is not None else self.spec.shape(cfg.model).block_size
        pack = dict(block_size=block, cache_dir=cfg.data.cache_dir, num_proc=cfg.data.num_proc)
        entry = prepare_packed_blocks(docs, tok_dir, eval_fraction=0.0 if cfg.data.eval_path else cfg.data.eval_fraction,
                                      source_key=source_key, **pack)
        if rank == 0:
            save_tokenizer(tok_dir, run_dir / "tokenizer")  # its own files: not an imported model's weights
        self.tokenizer = LazyTokenizer(tok_dir) if os.path.isdir(tok_dir) else load_tokenizer(tok_dir)
        self.blocks = load_packed_blocks(entry)
        held = self._held_out_documents()
        if held is not None:  # a held-out source of its own: all of its blocks are the eval split
            from data_pipelines.lm import PackedBlocks
            from data_pipelines.text_sources import as_eval_path_error
            from zoo.run.errors import DataError

            try:  # too few tokens for one block is said of data.eval_path
                held_entry = prepare_packed_blocks(held.texts, tok_dir, eval_fraction=0.0, source_key=held.key, **pack)
            except DataError as err:
                raise as_eval_path_error(err, cfg.data.eval_path) from None
            self.blocks = PackedBlocks(train=self.blocks.train, eval=load_packed_blocks(held_entry).train,
                                       meta=self.blocks.meta)
        self.shape = self._shape(meta)
        if meta is not None:
            own = meta.get("vocab_real") or meta["vocab_size"]
            if len(self.tokenizer) > own:
                from zoo.run.errors import ConfigError

                raise ConfigError(f"the tokenizer has {len(self.tokenizer)} tokens and model.init_from="
                                  f"{cfg.model.init_from} a vocabulary of {own}; give data.tokenizer= (or "
                                  f"data.vocab_size=) of at most {own} tokens, or the model's own tokenizer")

    def model_meta(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self.shape).items() if k != "dropout"}

    def final_metrics_need_weights(self) -> bool:
        return self.cfg.trainer.sample_tokens > 0  # perplexities come from the losses alone

    def _unigram_perplexity(self) -> float:
        from data_pipelines.lm import unigram_perplexity

        counts = getattr(self.blocks, "unigram_counts", None)
        if counts is None:
            return unigram_perplexity(self.blocks.train, self.blocks.eval, self.shape.vocab_size)
        # Prepared data: counts over the whole file (add-one), scored on up to 1024 held-out blocks.
        logp = np.log((counts + 1.0) / (counts + 1.0).sum())
        held = self.blocks.eval[np.arange(min(1024, len(self.blocks.eval)))][:, 1:].ravel()
        return float(np.exp(-logp[held].mean()))

    def tokens_per_sample(self) -> int:
        return self.shape.block_size

    def sample_noun(self) -> str:
        masked = ", attending within documents" if self.document_end is not None else ""
        return (f"blocks of {self.shape.block_size} tokens ({self.stream.num_samples * self.shape.block_size:,} "
                f"tokens{masked})")

    def collate(self, split: str, indices: np.ndarray) -> Batch:
        rows = self.blocks.train if split == "train" else self.blocks.eval
        block = torch.from_numpy(np.asarray(rows[indices], dtype=np.int64))
        return block[:, :-1], block[:, 1:]

    def num_eval(self) -> int:
        return len(self.blocks.eval)

    @torch.no_grad()
    def final_metrics(self, model: nn.Module, eval_loss: float) -> Dict[str, object]:
        out: Dict[str, object] = {
            **({} if eval_loss is None else {"eval_perplexity": math.exp(eval_loss) if eval_loss < 50 else float("inf")}),
            "unigram_perplexity": self._unigram_perplexity(),
            # What reading and packing skipped or repaired, counted (nothing is dropped silently).
            "data": {**self.data_counts, **{k: self.blocks.meta[k] for k in ("documents", "tokens", "tail_tokens_dropped",
                                                                             "train_blocks", "eval_blocks")
                                            if k in self.blocks.meta}}}
        n = self.cfg.trainer.sample_tokens
        if n > 0 and model is not None:
            prompt = self.sample_prompt()
            ids = torch.tensor([self.tokenizer(prompt)["input_ids"]])
            gen = model.generate(ids, n, generator=torch.Generator().manual_seed(self.cfg.trainer.seed))
            out["sample_prompt"] = prompt
            out["sample"] = self.tokenizer.decode(gen[0].tolist())
        return out

    def eval_metrics(self, eval_loss: float, model=None) -> Dict[str, object]:
        return {"eval_perplexity": math.exp(eval_loss) if eval_loss < 50 else float("inf")}

    def sample_prompt(self) -> str:
        """trainer.sample_prompt, else the first tokens of the held-out split (text of this corpus)."""
        if self.cfg.trainer.sample_prompt:
            return self.cfg.trainer.sample_prompt
        rows = self.blocks.eval if len(self.blocks.eval) else self.blocks.train
        text = self.tokenizer.decode(np.asarray(rows[np.arange(1)])[0][:PROMPT_TOKENS].tolist()).strip()
        return text.split("\n", 1)[0].strip() or text or "The"  # its first line



"""The causal language models' task (GPT, Llama): next-token prediction on packed token
blocks of any text source, with a byte-level BPE trained on it (or the imported model's
tokenizer); perplexities and a generated sample at the end. The model's shape comes from
the family's spec, so every decoder family shares this task."""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from data_pipelines.schedule import SampleStream
from zoo.families.base_task import Batch, Task, TextDocuments
from zoo.families.transformer import padded_vocab
from zoo.models.losses import IGNORE

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
        """The token blocks: every source is a prepared directory (data=prepared's own, or a text
        source streamed into the cache by data_pipelines.prepare), blocks cut when read; with
        data.mix several, mixed by tokens (data_pipelines.mixture)."""
        cfg = self.cfg
        if cfg.data.mix:
            self._prepare_mixture()
        elif cfg.data.name == "chat":
            self._prepare_chat()
        elif cfg.data.name == "prepared":  # pre-tokenized, memory-mapped (python -m data_pipelines.prepare)
            self._prepare_pretokenized()
        else:
            self._prepare_documents()
        if rank == 0:
            from data_pipelines.tokenizer import save_tokenizer

            save_tokenizer(self.tokenizer_dir, run_dir / "tokenizer")  # its own files: not an import's weights
        self.stream = SampleStream(len(self.blocks.train), cfg.trainer.seed)
        # data.document_mask: the token that ends each document in the packed blocks.
        self.document_end = int(self.blocks.meta["eos_id"]) if cfg.data.document_mask else None
        # data.eod_mask_loss: that token predicts nothing (no target across a document boundary).
        self.eod_masked = int(self.blocks.meta["eos_id"]) if cfg.data.eod_mask_loss else None
        self.chat = hasattr(self.blocks.train, "masks")  # conversations: targets only where the mask says
        self.weighs_tokens = self.eod_masked is not None or self.chat
        # data.packing=false: a conversation a row, ordered by length, a micro-batch cut to its longest
        self.bucketed = self.chat and not self.blocks.meta.get("packing", True)
        self.pad_to, self.multiple, self.mean_length = None, 1, None
        if self.bucketed:
            self._bucket_rows()

    def _bucket_rows(self) -> None:
        """data.packing=false: the rows in length-bucketed global batches (BERT's pooled order,
        data_pipelines.bucket_stream), a micro-batch cut to its longest row, rounded up to what
        the layout splits (2 x cp chunks; tp under sequence parallelism, of a cp rank's share);
        whole blocks under pp x tp (Task.varying_length_pad_to)."""
        from data_pipelines.bucket_stream import PooledBuckets
        from data_pipelines.schedule import restore_order

        cfg, layout, rows = self.cfg, self.layout, self.blocks.train
        n, batch, seed = len(rows), cfg.trainer.global_batch_size, cfg.trainer.seed
        if n < batch:  # the length buckets hold whole global batches
            from zoo.run.errors import DataError

            raise DataError(f"data.path={cfg.data.path} holds {n} training conversations with data.packing=false, "
                            f"fewer than one global batch (trainer.global_batch_size={batch}); give more "
                            f"conversations, lower trainer.global_batch_size to at most {n}, or pack them "
                            f"(data.packing=true)")

        def unbucketed(saved):  # a checkpoint of a run that padded every conversation to the block
            return restore_order(SampleStream(n, seed), saved)

        self.stream = PooledBuckets(n, rows.lengths, global_batch=batch, seed=seed, legacy=unbucketed)
        self.pad_to = self.varying_length_pad_to()
        chunks = 2 * layout.cp if layout.cp > 1 else 1
        split = layout.cp * layout.tp if cfg.parallel.sequence_parallel and layout.tp > 1 else 1
        self.multiple = math.lcm(chunks, split)
        spread = np.linspace(0, n - 1, num=min(n, 10_000)).astype(np.int64)  # an estimate, O(10,000) rows
        self.mean_length = float(rows.lengths(spread).mean())

    def build_options(self, grid) -> dict:
        from zoo.parallel.context import context_shard

        recompute = self.cfg.parallel.cp_recompute and not self.cfg.model.activation_checkpointing  # (the layer is)
        return {**super().build_options(grid), "document_end": self.document_end,
                "context": context_shard(grid, recompute=recompute),
                "dynamic_shape": self.bucketed and self.pad_to is None}  # a pipeline's micro-batches vary

    def plain_model(self) -> nn.Module:
        model = super().plain_model()
        model.document_end = self.document_end  # the sample is generated as the model was trained
        return model

    def _held_directory(self):
        cfg = self.cfg
        return Path(cfg.data.eval_path).expanduser() if cfg.data.eval_path else None

    def _prepare_chat(self) -> None:
        """data=chat: conversations rendered with the model's tokenizer and packed with their target
        masks (zoo.families.chat_data); data.path may also be a chat directory prepared before."""
        from zoo.families.chat_data import COUNTED, built_in_tokenizer, chat_blocks

        trained = lambda _docs, _vocab, _key, cache_dir: built_in_tokenizer(cache_dir)  # noqa: E731 (no data.path)
        meta, tok_dir = self._import_and_tokenizer(None, "", trained, self.cfg.model.vocab_pad_multiple)
        self.blocks = chat_blocks(self.cfg.data, tok_dir, self._block_size(meta))
        self.data_counts = {k: self.blocks.meta[k] for k in COUNTED if k in self.blocks.meta}
        self._finish_text(meta, tok_dir)

    def _prepare_pretokenized(self) -> None:
        from transformers import AutoTokenizer

        from data_pipelines.prepare import PreparedBlocks

        cfg, path = self.cfg, Path(self.cfg.data.path)
        self.init_state = None
        self.tokenizer_dir = str(path / "tokenizer")
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        self.shape = self._shape()
        self.blocks = PreparedBlocks(path, self.shape.block_size, cfg.data.eval_fraction,
                                     eval_directory=self._held_directory())
        self.data_counts = dict(self.blocks.meta.get("skipped", {}))

    def _tokenized(self, source, tok_dir: str, eval_path: bool = False) -> Path:
        """`source` (a TextSource) streamed into the cache by `tok_dir`: its prepared directory."""
        from data_pipelines.text_sources import as_eval_path_error
        from data_pipelines.token_cache import prepare_cached
        from zoo.run.errors import DataError

        d = self.cfg.data
        try:
            return prepare_cached(source, tok_dir, cache_dir=d.cache_dir, workers=d.num_proc)
        except DataError as err:
            if eval_path:  # too little text is said of data.eval_path
                raise as_eval_path_error(err, d.eval_path) from None
            raise

    def _text_tokenizer(self, sources, key: str):
        """(model.init_from's dimensions or None, the tokenizer directory) for text `sources`: a
        tokenizer trained here streams them all (no list of their texts)."""
        from data_pipelines.tokenizer import train_gpt_tokenizer

        texts = (t for s in sources for t in s.texts({}))
        return self._import_and_tokenizer(texts, key, train_gpt_tokenizer, self.cfg.model.vocab_pad_multiple)

    def _finish_text(self, meta, tok_dir: str) -> None:
        """The tokenizer and the model's shape, once the blocks are known; an import's vocabulary
        must hold the tokenizer's."""
        from data_pipelines.tokenizer import LazyTokenizer, load_tokenizer

        cfg = self.cfg
        self.tokenizer_dir = tok_dir
        self.tokenizer = LazyTokenizer(tok_dir) if os.path.isdir(tok_dir) else load_tokenizer(tok_dir)
        self.shape = self._shape(meta)
        if meta is not None:
            own = meta.get("vocab_real") or meta["vocab_size"]
            if len(self.tokenizer) > own:
                from zoo.run.errors import ConfigError

                raise ConfigError(f"the tokenizer has {len(self.tokenizer)} tokens and model.init_from="
                                  f"{cfg.model.init_from} a vocabulary of {own}; give data.tokenizer= (or "
                                  f"data.vocab_size=) of at most {own} tokens, or the model's own tokenizer")

    def _block_size(self, meta) -> int:
        return meta["block_size"] if meta is not None else self.spec.shape(self.cfg.model).block_size

    def _prepare_documents(self) -> None:
        from data_pipelines.prepare import PreparedBlocks
        from data_pipelines.text_sources import open_source

        d = self.cfg.data
        source = open_source(d.name, d.path, d.text_column)
        meta, tok_dir = self._text_tokenizer([source], source.key)
        entry = self._tokenized(source, tok_dir)
        held = self._held_out_source()
        held_entry = None if held is None else self._tokenized(held, tok_dir, eval_path=True)
        self.blocks = PreparedBlocks(entry, self._block_size(meta), 0.0 if held else d.eval_fraction,
                                     eval_directory=held_entry, names=(source.describe(), d.eval_path))
        self.data_counts = dict(self.blocks.meta.get("skipped", {}))
        if held_entry is not None:
            from data_pipelines.prepare import TokenShards

            skipped = TokenShards(held_entry).meta.get("skipped", {})
            self.data_counts.update({f"eval_{k}": v for k, v in skipped.items()})
        self._finish_text(meta, tok_dir)

    def _prepare_mixture(self) -> None:
        """data.mix: text sources tokenized into the cache and prepared directories, one tokenizer
        for all (a prepared directory's, data.tokenizer, init_from's, or one trained on the text
        sources), mixed by tokens."""
        from data_pipelines.mixture import MixedBlocks
        from data_pipelines.prepare import PreparedBlocks
        from data_pipelines.text_sources import open_source

        d = self.cfg.data
        texts = {i: open_source(m["name"], m.get("path"), m.get("text_column", d.text_column))
                 for i, m in enumerate(d.mix) if m["name"] != "prepared"}
        prepared = {i: Path(str(m["path"])).expanduser() for i, m in enumerate(d.mix) if m["name"] == "prepared"}
        self.init_state, meta = None, None
        if prepared:  # their tokenizer (validation checked that they share one, and data.tokenizer is it)
            tok_dir = str(prepared[min(prepared)] / "tokenizer")
        else:
            meta, tok_dir = self._text_tokenizer(list(texts.values()), "mix:" + ",".join(s.key for s in texts.values()))
        dirs = {**prepared, **{i: self._tokenized(s, tok_dir) for i, s in texts.items()}}
        held = self._held_out_source()
        held_entry = None if held is None else self._tokenized(held, tok_dir, eval_path=True)
        block = self._block_size(meta)
        names = [f"{m['name']}{' ' + str(m['path']) if m.get('path') else ''}" for m in d.mix]
        parts = [PreparedBlocks(dirs[i], block, 0.0 if held_entry else d.eval_fraction, names=(names[i],))
                 for i in range(len(d.mix))]
        self.blocks = MixedBlocks(parts, [float(m.get("weight", 1.0)) for m in d.mix], names)
        if held_entry is not None:  # a held-out source of its own: all of its blocks are the eval split
            self.blocks.eval = PreparedBlocks(held_entry, block, 0.0, names=(d.eval_path,)).train
            self.blocks.meta["eval_blocks"] = len(self.blocks.eval)
        self.data_counts = dict(self.blocks.meta.get("skipped", {}))
        self._finish_text(meta, tok_dir)

    def model_meta(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self.shape).items() if k != "dropout"}

    def sampling(self):
        """The end-of-run sample (trainer.sample_tokens after the prompt), decoded on the
        distributed model in place (zoo.parallel.generate); perplexities need no weights."""
        from zoo.parallel.generate import Sampling

        t = self.cfg.trainer
        if t.sample_tokens == 0:
            return None
        prompt = self.sample_prompt()
        if self.chat:  # a user turn, and the assistant's answer is generated
            from zoo.families.chat_data import chat_prompt_ids

            ids = chat_prompt_ids(self.tokenizer, self.cfg.data.chat_template, prompt)
        else:
            ids = self.tokenizer(prompt)["input_ids"]
        return Sampling(prompt=ids, max_new_tokens=t.sample_tokens,
                        block_size=self.shape.block_size, temperature=t.sample_temperature, top_k=t.sample_top_k,
                        seed=t.seed, document_mask=self.document_end is not None,
                        stop=self.tokenizer.eos_token_id if self.chat else None)  # the answer's end

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
        """A block's tokens; with data.packing=false a conversation's (the training rows' mean)."""
        return self.shape.block_size if self.mean_length is None else int(round(self.mean_length))

    def padding_efficiency(self) -> float:
        """Real tokens / padded slots over the run's training micro-batches (data.packing=false;
        packed blocks: 1)."""
        if not self.bucketed:
            return 1.0
        from zoo.engine import micro_batching

        t = self.cfg.trainer
        micro = micro_batching(t, self.cfg.parallel, self.layout)[0]
        return self.stream.padding_efficiency(t.max_steps * t.global_batch_size, micro, pad_to=self.pad_to)

    def sample_noun(self) -> str:
        masked = ", attending within documents" if self.document_end is not None else ""
        masked += ", no target after a document's end" if self.eod_masked is not None else ""
        if self.chat:
            m = self.blocks.meta
            masked += (f"; {m.get('conversations', 0):,} conversations, {m.get('supervised_tokens', 0):,} target "
                       f"tokens (data.train_on={m.get('train_on', self.cfg.data.train_on)}), "
                       f"{m.get('truncated', 0):,} truncated, {m.get('padding_tokens', 0):,} padding")
        if self.bucketed:
            return (f"conversations of up to {self.shape.block_size} tokens, a row each, a micro-batch cut to its "
                    f"longest (data.packing=false: {self.mean_length:.0f} tokens on average{masked})")
        return (f"blocks of {self.shape.block_size} tokens ({self.stream.num_samples * self.shape.block_size:,} "
                f"tokens{masked})")

    def collate(self, split: str, indices: np.ndarray) -> Batch:
        rows = self.blocks.train if split == "train" else self.blocks.eval
        block = torch.from_numpy(np.asarray(rows[indices], dtype=np.int64))
        x, y = block[:, :-1], block[:, 1:]
        if self.chat:  # a target where its token is one (the assistant's, by data.train_on)
            y = y.masked_fill(torch.from_numpy(rows.masks(indices)[:, 1:] == 0), IGNORE)
        if self.eod_masked is not None:  # in training and evaluation alike, as Megatron's --eod-mask-loss
            y = y.masked_fill(x == self.eod_masked, IGNORE)
        if self.bucketed:  # cut to the longest row: the padding past it predicts nothing
            m = self.multiple
            T = self.pad_to or min(self.shape.block_size, -(-int(rows.lengths(indices).max()) // m) * m)
            x, y = x[:, :T], y[:, :T]
        return x, y

    def num_eval(self) -> int:
        return len(self.blocks.eval)

    def final_metrics(self, eval_loss: float, scores: Dict[str, int], sample: Optional[List[int]]) -> Dict[str, object]:
        out: Dict[str, object] = {
            **({} if eval_loss is None else {"eval_perplexity": math.exp(eval_loss) if eval_loss < 50 else float("inf")}),
            "unigram_perplexity": self._unigram_perplexity(),
            # What reading and packing skipped or repaired, counted (nothing is dropped silently).
            "data": {**self.data_counts, **{k: self.blocks.meta[k] for k in ("documents", "tokens", "tail_tokens_dropped",
                                                                             "train_blocks", "eval_blocks", "mix")
                                            if k in self.blocks.meta}}}
        if sample is not None:
            out["sample_prompt"] = self.sample_prompt()
            out["sample"] = self.tokenizer.decode(sample)
        return out

    def eval_metrics(self, eval_loss: float, scores: Dict[str, int]) -> Dict[str, object]:
        return {"eval_perplexity": math.exp(eval_loss) if eval_loss < 50 else float("inf")}

    def sample_prompt(self) -> str:
        """trainer.sample_prompt, else the first tokens of the held-out split (text of this corpus)."""
        if self.cfg.trainer.sample_prompt:
            return self.cfg.trainer.sample_prompt
        if getattr(self, "chat", False):
            from zoo.families.chat_data import first_user_turn

            turn = first_user_turn(self.cfg.data.path or None)
            if turn:
                return turn
        rows = self.blocks.eval if len(self.blocks.eval) else self.blocks.train
        text = self.tokenizer.decode(np.asarray(rows[np.arange(1)])[0][:PROMPT_TOKENS].tolist()).strip()
        return text.split("\n", 1)[0].strip() or text or "The"  # its first line



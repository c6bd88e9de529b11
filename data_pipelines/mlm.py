"""Masked-LM data: documents cut into sentence-pair samples, masked per sample, padded per batch.

Samples. Each document is cut into paragraphs and sentences, every sentence is tokenized
once, and consecutive sentences of one document are gathered until the next would pass
`block_size - 3` tokens. A gathered chunk of two or more sentences is split at a random
sentence boundary into segments A and B: `[CLS] A [SEP] B [SEP]`, token types 0 then 1
(BERT's layout, without the next-sentence task, which RoBERTa found useless); a single
sentence gives `[CLS] A [SEP]`. Document ends make the lengths vary. Every k-th sample is
held out. The result is cached like the packed GPT blocks.

Masking. transformers' `DataCollatorForLanguageModeling` picks 15% of the tokens, never a
special one, and replaces 80% of those by [MASK], 10% by a random token and keeps 10%.
It runs on one sample at a time with a generator seeded by (seed, split, epoch, sample):
a sample's masks do not depend on the rank, micro-batch or padding it lands in, and
change from epoch to epoch (dynamic masking).

Batches. The training order is data_pipelines.bucket_stream's: shuffled, length-sorted pools
cut into global batches of similar lengths, so the micro-batches cut from a global batch are
padded (to their longest sample) very little; computed a pool at a time (`BucketedStream`
below, the whole epoch at once, is the order of runs started before it). Inputs are one (B, 2, T) tensor: token ids
and token types.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from data_pipelines.cache import cache_key, cache_root, cached_dir
from data_pipelines.lm import split_eval
from data_pipelines.sampler import BucketedBatchSampler
from zoo.run.errors import DataError

_PARAGRAPH = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")
_TRAIN, _EVAL = 0, 1


def split_sentences(doc: str) -> List[str]:
    """Paragraphs (blank-line separated) cut after sentence-ending punctuation."""
    out: List[str] = []
    for paragraph in _PARAGRAPH.split(doc):
        out += [s for s in _SENTENCE_END.split(paragraph.strip()) if s.strip()]
    return out


def pair_samples(doc_sentences: Sequence[Sequence[Sequence[int]]], *, block_size: int, cls_id: int, sep_id: int,
                 seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, offsets, first_lengths): the samples' tokens concatenated, where each starts
    (N + 1 offsets), and the length of `[CLS] A [SEP]` in each (the rest is segment B)."""
    budget = block_size - 3
    rng = np.random.default_rng(seed)
    ids: List[int] = []
    offsets, firsts = [0], []

    def emit(chunk: List[Sequence[int]]) -> None:
        cut = int(rng.integers(1, len(chunk))) if len(chunk) > 1 else len(chunk)
        a = [t for s in chunk[:cut] for t in s]
        b = [t for s in chunk[cut:] for t in s]
        ids.extend([cls_id, *a, sep_id, *b, *([sep_id] if b else [])])
        offsets.append(len(ids))
        firsts.append(len(a) + 2)

    for sentences in doc_sentences:
        chunk: List[Sequence[int]] = []
        used = 0
        for sentence in sentences:
            for piece in (sentence[i:i + budget] for i in range(0, len(sentence), budget)):
                if chunk and used + len(piece) > budget:
                    emit(chunk)
                    chunk, used = [], 0
                chunk.append(piece)
                used += len(piece)
        if chunk:
            emit(chunk)
    return np.asarray(ids, dtype=np.int32), np.asarray(offsets, dtype=np.int64), np.asarray(firsts, dtype=np.int32)


@dataclass
class MLMSamples:
    ids: np.ndarray  # all samples' tokens, concatenated (int32)
    offsets: np.ndarray  # (N + 1,)
    first_lengths: np.ndarray  # (N,) tokens of [CLS] A [SEP]
    train: np.ndarray  # sample numbers of the training split
    eval: np.ndarray  # sample numbers held out
    meta: dict

    @property
    def lengths(self) -> np.ndarray:
        """Every sample's length (O(samples): for tests and the legacy whole-epoch order)."""
        return np.diff(self.offsets)

    def length_of(self, numbers: np.ndarray) -> np.ndarray:
        """Lengths of the samples `numbers`, read from the memory-mapped offsets."""
        numbers = np.asarray(numbers, dtype=np.int64)
        return np.asarray(self.offsets[numbers + 1]) - np.asarray(self.offsets[numbers])

    def tokens_of(self, numbers, chunk: int = 1 << 20) -> int:
        """Tokens of the samples `numbers` (an index array), summed a chunk at a time."""
        return sum(int(self.length_of(numbers[i:i + chunk]).sum()) for i in range(0, len(numbers), chunk))

    def tokens(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
        """(token ids, token types) of sample i."""
        ids = np.asarray(self.ids[self.offsets[i]:self.offsets[i + 1]], dtype=np.int64)
        types = (np.arange(len(ids)) >= self.first_lengths[i]).astype(np.int64)
        return ids, types


def prepare_mlm_samples(docs: List[str], tokenizer_dir: str, *, block_size: int, eval_fraction: float,
                        source_key: str, cache_dir: Optional[str] = None, held_docs: Optional[List[str]] = None,
                        held_key: Optional[str] = None) -> Path:
    """Build (or find) the cached sentence-pair samples of `docs`; returns the cache entry.
    With `held_docs` (data.eval_path), every sample of `docs` is trained on and every sample
    of `held_docs` held out; otherwise a seeded `eval_fraction` of the samples is held out."""
    tok_meta = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    key = cache_key(source=source_key, tokenizer=tok_meta, block=block_size, eval=eval_fraction, kind="mlm-pairs",
                    **({"held": held_key} if held_docs is not None else {}))
    entry = cache_root(cache_dir) / "datasets" / f"mlm-{key}"

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer_dir)

        def samples_of(texts: List[str]):
            per_doc = [split_sentences(d) for d in texts]
            flat = tok([s for doc in per_doc for s in doc], add_special_tokens=False)["input_ids"]
            doc_sentences, at = [], 0
            for doc in per_doc:
                doc_sentences.append(flat[at:at + len(doc)])
                at += len(doc)
            return pair_samples(doc_sentences, block_size=block_size, cls_id=tok.cls_token_id,
                                sep_id=tok.sep_token_id), len(flat)

        (ids, offsets, firsts), sentences = samples_of(docs)
        if held_docs is None:
            if len(firsts) < 2:
                raise DataError(f"the source yields {len(firsts)} samples; use more text")
            train, held = split_eval(np.arange(len(firsts)), eval_fraction)
        else:
            if len(firsts) < 1:
                raise DataError("the source yields no samples; use more text")
            (h_ids, h_offsets, h_firsts), h_sentences = samples_of(held_docs)
            if len(h_firsts) < 1:
                raise DataError("the held-out source yields no samples; give it more text")
            train, held = np.arange(len(firsts)), np.arange(len(firsts), len(firsts) + len(h_firsts))
            ids, offsets = np.concatenate([ids, h_ids]), np.concatenate([offsets, h_offsets[1:] + offsets[-1]])
            firsts, sentences = np.concatenate([firsts, h_firsts]), sentences + h_sentences
        for name, array in (("ids", ids), ("offsets", offsets), ("first_lengths", firsts), ("train", train),
                            ("eval", held)):
            np.save(tmp / f"{name}.npy", array)
        meta = {"documents": len(docs), "sentences": sentences, "samples": int(len(firsts)),
                "tokens": int(len(ids)), "block_size": block_size, "pairs": int((np.diff(offsets) > firsts).sum()),
                "train_samples": int(len(train)), "eval_samples": int(len(held))}
        if held_docs is not None:
            meta["eval_documents"] = len(held_docs)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    return cached_dir(entry, build)


class IndexRange:
    """range(start, stop) indexed like an array (`r[positions]`), without holding it: a prepared
    file's train and held-out sample numbers (an np.arange is 8 B a block on every rank)."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, positions):
        if isinstance(positions, slice):
            lo, hi, step = positions.indices(len(self))
            if step == 1:
                return IndexRange(self.start + lo, self.start + max(lo, hi))
            positions = np.arange(lo, hi, step)
        at = np.asarray(positions, dtype=np.int64)
        if at.size and (at.min() < 0 or at.max() >= len(self)):
            raise IndexError(f"positions outside [0, {len(self)})")
        return self.start + at


class PackedMLMSamples:
    """MLMSamples' interface over a prepared token file (data=prepared): every block of
    block_size - 2 tokens is one segment, `[CLS] block [SEP]`, read from the memory map when
    asked for; the held-out blocks as PreparedBlocks holds them out (or data.eval_path's)."""

    def __init__(self, directory: Path, block_size: int, eval_fraction: float, *, cls_id: int, sep_id: int,
                 eval_directory: Optional[Path] = None):
        from data_pipelines.prepare import PreparedBlocks

        blocks = PreparedBlocks(directory, block_size - 3, eval_fraction, eval_directory)  # rows of block_size - 2
        self.blocks, self.cls_id, self.sep_id = blocks, cls_id, sep_id
        n_train, n_eval = len(blocks.train), len(blocks.eval)
        self.train, self.eval = IndexRange(0, n_train), IndexRange(n_train, n_train + n_eval)
        self.block_size = block_size
        self.unigram_counts = blocks.unigram_counts
        self.meta = {"documents": blocks.meta["documents"], "samples": n_train + n_eval, "pairs": 0,
                     "block_size": block_size, "train_samples": n_train, "eval_samples": n_eval}

    def length_of(self, numbers: np.ndarray) -> np.ndarray:
        return np.full(len(numbers), self.block_size, dtype=np.int64)

    def tokens_of(self, numbers) -> int:
        return len(numbers) * self.block_size

    def tokens(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
        n_train = len(self.train)
        body = self.blocks.train[i] if i < n_train else self.blocks.eval[i - n_train]
        ids = np.concatenate([[self.cls_id], np.asarray(body, dtype=np.int64), [self.sep_id]])
        return ids, np.zeros(len(ids), dtype=np.int64)


def load_mlm_samples(entry: Path) -> MLMSamples:
    arrays = {n: np.load(entry / f"{n}.npy", mmap_mode="r") for n in ("ids", "offsets", "first_lengths", "train", "eval")}
    return MLMSamples(**arrays, meta=json.loads((entry / "meta.json").read_text()))


class Masker:
    """transformers' MLM masking of one sample at a time, seeded by (seed, split, epoch, sample)."""

    def __init__(self, tokenizer, *, seed: int, mlm_probability: float = 0.15):
        from transformers import DataCollatorForLanguageModeling

        self.collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=mlm_probability)
        self.special = np.asarray(tokenizer.all_special_ids)
        self.seed = seed

    def __call__(self, ids: np.ndarray, *, split: int, epoch: int, sample: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(masked ids, labels: the original id where masked, -100 elsewhere) of one sample."""
        state = np.random.SeedSequence([self.seed, split, epoch, int(sample)]).generate_state(1, np.uint64)[0]
        self.collator.generator = torch.Generator().manual_seed(int(state >> np.uint64(1)))
        special = torch.from_numpy(np.isin(ids, self.special))[None]
        inputs, labels = self.collator.torch_mask_tokens(torch.tensor(ids)[None], special_tokens_mask=special)  # masks a copy in place
        return inputs[0], labels[0]


def pad_batch(rows: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], pad_id: int,
              length: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(ids, types, labels) rows -> inputs (B, 2, T) and labels (B, T), padded to the longest
    row (or to `length`): ids with the pad id, types with 0, labels with -100."""
    T = length or max(len(r[0]) for r in rows)
    inputs = torch.zeros(len(rows), 2, T, dtype=torch.long)
    inputs[:, 0] = pad_id
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    for b, (ids, types, lab) in enumerate(rows):
        inputs[b, 0, :len(ids)], inputs[b, 1, :len(ids)], labels[b, :len(ids)] = ids, types, lab
    return inputs, labels


class MLMBatches:
    """Masked, padded batches of the samples (train or held-out) by sample number."""

    def __init__(self, samples: MLMSamples, tokenizer, *, seed: int, mlm_probability: float):
        self.samples, self.pad_id = samples, tokenizer.pad_token_id
        self.masker = Masker(tokenizer, seed=seed, mlm_probability=mlm_probability)

    def batch(self, sample_numbers: Sequence[int], *, split: str, epochs: Optional[Sequence[int]] = None,
              length: Optional[int] = None):
        """(inputs (B, 2, T), labels (B, T)), padded to the longest sample or to `length`."""
        code = _TRAIN if split == "train" else _EVAL
        rows = []
        for k, i in enumerate(sample_numbers):
            ids, types = self.samples.tokens(int(i))
            masked, labels = self.masker(ids, split=code, epoch=0 if epochs is None else int(epochs[k]), sample=i)
            rows.append((masked, torch.from_numpy(types), labels))
        return pad_batch(rows, self.pad_id, length)


class BucketedStream:
    """The `SampleStream` interface (`indices(start, count)`: sample positions in a stream of
    epochs) over length-bucketed global batches: epoch e is `BucketedBatchSampler`'s global
    batches of `global_batch` samples for (seed, e), one after another, each in ascending
    length, so consecutive samples (a micro-batch) have similar lengths. Layout-free: the
    global batch is fixed, whatever dp, tp or pp. Holds the epoch's order and every sample's
    length (O(samples) a rank): the order of runs started before `PooledBuckets`, kept so
    their checkpoints go on as they began."""

    order = "bucketed"  # what a checkpoint records (the trainer's data_order)

    def __init__(self, lengths: np.ndarray, *, global_batch: int, seed: int):
        self.lengths = np.asarray(lengths)
        self.sampler = BucketedBatchSampler(np.asarray(lengths), batch_size=global_batch, dp_rank=0, dp_size=1,
                                            seed=seed)
        self.per_epoch = len(self.sampler) * global_batch
        self._epoch, self._order = -1, None

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample numbers of epoch `epoch`, in stream order."""
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)
            self._epoch, self._order = epoch, np.concatenate([np.asarray(b) for b in self.sampler])
        return self._order

    def indices(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:  # one slice per epoch the positions fall in
            epoch, offset = divmod(start + done, self.per_epoch)
            take = min(count - done, self.per_epoch - offset)
            out[done:done + take] = self.epoch_order(epoch)[offset:offset + take]
            done += take
        return out

    def padding_efficiency(self, samples: int, micro_batch: int, pad_to: Optional[int] = None) -> float:
        """Real tokens / padded slots of the stream's first `samples` samples in micro-batches of
        `micro_batch`, each padded to its longest sample (or to `pad_to`); one epoch at a time."""
        if samples % micro_batch or self.per_epoch % micro_batch:
            raise ValueError(f"micro_batch={micro_batch} must divide samples={samples} and the epoch "
                             f"({self.per_epoch} samples)")
        lengths = self.lengths
        real = slots = 0
        for epoch in range(-(-samples // self.per_epoch)):
            per_batch = lengths[self.epoch_order(epoch)[:samples - epoch * self.per_epoch]].reshape(-1, micro_batch)
            real += int(per_batch.sum())
            slots += micro_batch * (pad_to * len(per_batch) if pad_to else int(per_batch.max(axis=1).sum()))
        return real / slots if slots else 1.0

    def epochs(self, start: int, count: int) -> np.ndarray:
        return np.arange(start, start + count) // self.per_epoch

"""`python -m data_pipelines.prepare ... --train-tokenizer VOCAB_SIZE`: a byte-level BPE
(GPT-2's kind, as `data=files` trains one) trained on the documents the preparation reads,
streamed in their order in this one process before any worker starts, and saved beside the
shards as OUT/tokenizer, the tokenizer the shards are then tokenized with. The same corpus
gives the same tokenizer, so the shards are the same for any --workers; a preparation run
again reuses the tokenizer it trained (OUT/tokenizer/zoo_trained.json says with what).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Optional, Tuple

from data_pipelines.text_sources import DataError, TextSource

TRAINED = "zoo_trained.json"  # what OUT/tokenizer was trained with (not a tokenizer file: runs do not copy it)
MIN_VOCAB = 257  # the 256 bytes and <|endoftext|>


def check_vocab(vocab_size: int, part: Optional[Tuple[int, int]]) -> None:
    """One line for a vocabulary the BPE cannot have, or a --part (each part would train its own)."""
    if vocab_size < MIN_VOCAB:
        raise DataError(f"--train-tokenizer {vocab_size} is below the {MIN_VOCAB} tokens a byte-level BPE starts with "
                        f"(256 bytes and <|endoftext|>): give a vocabulary of at least {MIN_VOCAB}, e.g. 32000")
    if part is not None:
        raise DataError(f"--train-tokenizer with --part {part[0]}/{part[1]}: each part would train a tokenizer of its "
                        f"own and the parts would not merge; train it once (prepare the whole corpus, or part 0, "
                        f"with --train-tokenizer) and give that OUT/tokenizer to every part as --tokenizer")


def trained_tokenizer(source: TextSource, vocab_size: int, out: Path, where: str = "") -> Path:
    """OUT/tokenizer trained on `source` with `vocab_size` tokens: the one already there when it
    was trained so (a preparation run again), else trained now (said on stderr; `where`: the
    source in the caller's words)."""
    dest = out / "tokenizer"
    wanted = {"vocab_size": vocab_size, "source": source.key}
    if dest.is_dir():
        try:
            had = json.loads((dest / TRAINED).read_text())
        except (OSError, ValueError):
            had = None
        if had == wanted:
            return dest
        raise DataError(f"--out {out} already holds a tokenizer ({dest}) "
                        + (f"trained with {had}, not with {wanted}" if had else "that --train-tokenizer did not train")
                        + f": prepare into another --out, or remove {out} to start it again")
    from data_pipelines.tokenizer import write_gpt_tokenizer

    print(f"training a byte-level BPE of {vocab_size:,} tokens on {where or source.describe()} ...", file=sys.stderr,
          flush=True)
    tmp = out / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    write_gpt_tokenizer(source.texts({}), vocab_size, tmp)  # a source without text is refused by the preparation
    (tmp / TRAINED).write_text(json.dumps(wanted, indent=1))
    os.replace(tmp, dest)
    return dest

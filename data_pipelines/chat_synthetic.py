"""A conversation set whose answers are a function of the prompt, and a chat tokenizer trained
here: what the fine-tuning tests and benchmarks/chat_sft.py learn on (no hub: nothing is
downloaded). The user asks to reverse or to sort a few words; the assistant answers with them
reversed or sorted, so a model that learns shows it in the loss on the answers."""
from __future__ import annotations

import json
import random
from pathlib import Path

from data_pipelines.chat import CHATML

WORDS = ("apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "orbit", "maple", "quartz", "delta", "ember",
         "falcon", "garden", "harbor", "island", "jungle", "kettle", "lantern", "meadow")
SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def conversation(rng: random.Random, turns: int = 1, system: bool = False) -> dict:
    messages = [{"role": "system", "content": "You answer with the words only."}] if system else []
    for _ in range(turns):
        words = rng.sample(WORDS, rng.randint(3, 5))
        if rng.random() < 0.5:
            ask, answer = "Reverse: ", list(reversed(words))
        else:
            ask, answer = "Sort: ", sorted(words)
        messages += [{"role": "user", "content": ask + " ".join(words)},
                     {"role": "assistant", "content": " ".join(answer)}]
    return {"messages": messages}


def write_conversations(path: Path, n: int, seed: int = 0) -> Path:
    """n conversations (a third of them with a system prompt, a quarter with two exchanges) as jsonl."""
    rng = random.Random(seed)
    with Path(path).open("w") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(rng, turns=2 if rng.random() < 0.25 else 1, system=rng.random() < 1 / 3))
                    + "\n")
    return Path(path)


def write_chat_tokenizer(dest: Path, vocab_size: int = 2048, template: str = CHATML) -> Path:
    """A byte-level BPE trained on the Python documentation and on these conversations' words, with
    ChatML's special tokens (<|endoftext|> its pad token, <|im_end|> its end) and `template`."""
    from pydoc_data.topics import topics

    from transformers import PreTrainedTokenizerFast

    from data_pipelines.tokenizer import _train_byte_level_bpe

    docs = list(topics.values()) + [" ".join(WORDS)] * 50 + ["Reverse: Sort: You answer with the words only."] * 50
    tok = _train_byte_level_bpe(docs, vocab_size)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = template
    fast.save_pretrained(str(dest))
    return Path(dest)

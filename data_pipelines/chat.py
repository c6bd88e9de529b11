"""Conversations for supervised fine-tuning: read, checked, rendered with a tokenizer's chat
template, and each token marked as a target or not.

A record is a conversation, `{"messages": [{"role": ..., "content": ...}, ...]}` (the format
transformers' chat templates take), or an instruction pair `{"prompt": ..., "completion": ...}`
(a user turn and an assistant turn). Records come from .jsonl/.json/.parquet files (a file, a
directory or a glob) or a dataset directory (`save_to_disk`, or one `load_dataset` reads); a
bad record is one line naming the file, the line (the row) and the fix.

Rendering (`ChatRenderer`) uses the template's own `{% generation %}` markers where it has
them (transformers' `return_assistant_tokens_mask`); otherwise each assistant turn is the text
between the conversation rendered up to it with the generation prompt and rendered through
it, found in the whole conversation's text and mapped to tokens by their character offsets.
`train_on`: `assistant` (every assistant turn), `last_turn` (the last one), `all` (every token).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

from data_pipelines.text_sources import (
    DataError,
    _fingerprint,
    _table_rows,
    expand_paths,
    numbered_jsonl_rows,
    train_split,
)

ROLES = ("system", "user", "assistant", "tool")
TRAIN_ON = ("assistant", "last_turn", "all")
SUFFIXES = (".jsonl", ".json", ".parquet")
CHATML = (  # data.chat_template=chatml: ChatML (Qwen's turns), its assistant turns marked for masking
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@dataclass(frozen=True)
class ChatSource:
    """Where the conversations are, found but not read; `key` identifies the content."""

    path: str
    key: str
    files: Tuple[Path, ...] = ()
    dataset_dir: Optional[str] = None

    def records(self) -> Iterator[Tuple[str, dict]]:
        """(where, record) in order: `FILE line N` (jsonl), `FILE row N` (tables, datasets)."""
        if self.dataset_dir is not None:
            for n, row in enumerate(train_split(self.dataset_dir), 1):
                yield f"data.path={self.path} row {n}", row
            return
        for f in self.files:
            if f.suffix.lower() == ".jsonl":
                for n, row in numbered_jsonl_rows(f):
                    yield f"{f} line {n}", row
            else:
                for n, row in enumerate(_table_rows(f, "json" if f.suffix.lower() == ".json" else "parquet"), 1):
                    yield f"{f} row {n}", row


def open_chat(path: Optional[str]) -> ChatSource:
    """The conversations at `path`: DataError where there are none to read."""
    if not path:
        raise DataError("data=chat needs data.path: .jsonl/.json/.parquet files of conversations (a file, a directory "
                        "or a glob) or a dataset directory")
    local = Path(path).expanduser()
    saved = (local / "state.json").exists() or (local / "dataset_dict.json").exists()  # datasets' save_to_disk
    if local.is_dir() and (saved or not any(f.suffix.lower() in SUFFIXES for f in local.rglob("*"))):
        ds = train_split(path)
        return ChatSource(path, f"chat-dataset:{path}:{ds._fingerprint}", dataset_dir=path)
    files = [f for f in expand_paths(path) if f.suffix.lower() in SUFFIXES]
    if not files:
        raise DataError(f"data.path={path} holds no conversation files; give {', '.join(SUFFIXES)} files")
    return ChatSource(path, f"chat-files:{_fingerprint(files)}", files=tuple(files))


def to_messages(record: dict, where: str) -> List[dict]:
    """The record's messages, checked: DataError naming `where` and the fix."""
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: `messages` is {type(messages).__name__} {str(messages)[:40]!r}, not a list of "
                            f"turns; give [{{\"role\": \"user\", \"content\": ...}}, {{\"role\": \"assistant\", ...}}]")
    elif "prompt" in record and "completion" in record:
        messages = [{"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]
    else:
        raise DataError(f"{where} has neither `messages` nor `prompt` and `completion` (its keys: {sorted(record)}); "
                        f"give each record {{\"messages\": [{{\"role\": \"user\", \"content\": ...}}, {{\"role\": "
                        f"\"assistant\", \"content\": ...}}]}}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"{where}: turn {i} is {str(m)[:60]!r}; give each turn a `role` and a `content`")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise DataError(f"{where}: turn {i} has the unknown role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"{where}: turn {i}'s content is {type(content).__name__}, not text; give it as a string")
        if role == "assistant" and not content.strip():
            raise DataError(f"{where}: turn {i} is an empty assistant turn; give it the answer or drop the record")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where} has no assistant turn, so nothing to learn; add the answer or drop the record")
    return out


def has_generation_markers(template: str) -> bool:
    return "generation %}" in template or "generation -%}" in template


class ChatRenderer:
    """A conversation -> (token ids, target mask): mask[j] = 1 where token j is to be predicted."""

    def __init__(self, tokenizer, template: Optional[str], train_on: str, *, template_key: str = "data.chat_template"):
        if train_on not in TRAIN_ON:
            raise DataError(f"data.train_on={train_on!r}; use one of {', '.join(TRAIN_ON)}")
        template = template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise DataError(f"the tokenizer has no chat template; set {template_key}=chatml (ChatML turns) or "
                            f"{template_key}=FILE.jinja, or use a model's tokenizer that has one")
        self.tok, self.template, self.train_on = tokenizer, template, train_on
        self.markers = has_generation_markers(template)

    def _text(self, messages, generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, chat_template=self.template,
                                            add_generation_prompt=generation_prompt)

    def render(self, messages: List[dict], where: str) -> Tuple[np.ndarray, np.ndarray]:
        try:
            if self.train_on == "all":
                ids = self.tok(self._text(messages), add_special_tokens=False)["input_ids"]
                mask = np.ones(len(ids), dtype=np.uint8)
            elif self.markers:
                out = self.tok.apply_chat_template(messages, tokenize=True, return_dict=True, chat_template=self.template,
                                                   return_assistant_tokens_mask=True)
                ids, mask = out["input_ids"], np.asarray(out["assistant_masks"], dtype=np.uint8)
            else:
                ids, mask = self._by_prefixes(messages, where)
        except DataError:
            raise
        except Exception as err:  # the template's own error (jinja raise_exception, a role it refuses)
            raise DataError(f"{where}: the chat template fails on this conversation ({type(err).__name__}: "
                            f"{str(err)[:120]}); fix the record or the template") from None
        mask = np.asarray(mask, dtype=np.uint8)
        if self.train_on == "last_turn":
            mask = _last_run(mask)
        if not mask.any():
            raise DataError(f"{where}: the chat template renders no assistant tokens to learn; use a template that "
                            f"renders the assistant's turns (or data.train_on=all)")
        return np.asarray(ids, dtype=np.int64), mask

    def _by_prefixes(self, messages, where) -> Tuple[List[int], np.ndarray]:
        full = self._text(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, through = self._text(messages[:i], generation_prompt=True), self._text(messages[:i + 1])
            if not (through.startswith(before) and full.startswith(through)):
                raise DataError(f"{where}: the chat template renders turn {i} differently once later turns follow, so "
                                f"its assistant tokens cannot be found; use a template with {{% generation %}} markers "
                                f"(or data.chat_template=chatml)")
            spans.append((len(before), len(through)))
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        starts = np.asarray([s for s, _ in enc["offset_mapping"]])
        mask = np.zeros(len(starts), dtype=np.uint8)
        for lo, hi in spans:
            mask[(starts >= lo) & (starts < hi)] = 1
        return enc["input_ids"], mask


def _last_run(mask: np.ndarray) -> np.ndarray:
    """Only the last run of ones (the last assistant turn)."""
    ones = np.flatnonzero(mask)
    if not len(ones):
        return mask
    end = ones[-1] + 1
    gaps = np.flatnonzero(mask[:end] == 0)
    start = gaps[-1] + 1 if len(gaps) else 0
    out = np.zeros_like(mask)
    out[start:end] = 1
    return out


def load_template(value: Optional[str]) -> Optional[str]:
    """data.chat_template: None (the tokenizer's own), `chatml`, or a .jinja file's text."""
    if value is None:
        return None
    if value == "chatml":
        return CHATML
    path = Path(value).expanduser()
    if not path.is_file():
        raise DataError(f"data.chat_template={value}: no such file; give chatml or a .jinja template file")
    text = path.read_text()
    if path.suffix == ".json":
        text = json.loads(text).get("chat_template", "")
    return text

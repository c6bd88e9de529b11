"""The causal task's conversations (data=chat): the chat directory a run reads (one prepared by
`python -m data_pipelines.prepare --format chat`, or the cache's, rendered from data.path once;
without data.path, a generated set with a ChatML tokenizer trained here), its held-out split,
and the end-of-run sample's prompt as a user turn."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from data_pipelines.chat_blocks import ChatBlocks, is_chat

BUILT_IN = 2000
"""data=chat without data.path: this many generated conversations (data_pipelines.chat_synthetic)."""


def built_in_conversations(cache_dir) -> str:
    """The generated conversation set, written once into the cache."""
    from data_pipelines.cache import cache_root, cached_dir
    from data_pipelines.chat_synthetic import write_conversations

    entry = cache_root(cache_dir) / "datasets" / f"chat-synthetic-{BUILT_IN}"
    return str(cached_dir(entry, lambda tmp: write_conversations(tmp / "chats.jsonl", BUILT_IN)) / "chats.jsonl")


def built_in_tokenizer(cache_dir) -> str:
    """The ChatML tokenizer trained here (data_pipelines.chat_synthetic), written once into the cache."""
    from data_pipelines.cache import cache_root, cached_dir
    from data_pipelines.chat_synthetic import write_chat_tokenizer

    return str(cached_dir(cache_root(cache_dir) / "tokenizers" / "chatml-2048", write_chat_tokenizer))


def _directory(d, path: Optional[str], tok_dir: str, block: int) -> Path:
    path = path or built_in_conversations(d.cache_dir)
    if is_chat(Path(path).expanduser()):  # prepared already (its block size is checked when opened)
        return Path(path).expanduser()
    from data_pipelines.chat_prepare import chat_cached

    return chat_cached(path, tok_dir, block_size=block, train_on=d.train_on, chat_template=d.chat_template,
                       packing=d.packing, truncate=d.truncate, cache_dir=d.cache_dir, workers=d.num_proc)


def chat_blocks(d, tok_dir: str, block: int) -> ChatBlocks:
    """data.path's conversations as blocks with target masks; data.eval_path's (rendered alike)
    all held out, else every k-th block (data.eval_fraction)."""
    held = None if not d.eval_path else _directory(d, d.eval_path, tok_dir, block)
    return ChatBlocks(_directory(d, d.path, tok_dir, block), block, 0.0 if held else d.eval_fraction,
                      eval_directory=held, names=(f"data.path={d.path}", f"data.eval_path={d.eval_path}"))


COUNTED = ("conversations", "truncated", "dropped_no_target_left", "padding_tokens", "supervised_tokens")
"""What a chat directory's meta counts, reported in the start line and summary.json."""


def first_user_turn(path: Optional[str]) -> Optional[str]:
    """The first user turn of data.path's records (the default sample prompt), if it has one."""
    import json

    from data_pipelines.chat import open_chat, to_messages

    path = path or built_in_conversations(None)
    if is_chat(Path(path).expanduser()):
        return json.loads((Path(path).expanduser() / "meta.json").read_text()).get("first_user_turn")
    for where, record in open_chat(path).records():
        return next((m["content"] for m in to_messages(record, where) if m["role"] == "user"), None)
    return None


def chat_prompt_ids(tokenizer, chat_template: Optional[str], prompt: str) -> List[int]:
    """`prompt` as a user turn followed by the assistant's generation prompt, in the template."""
    from data_pipelines.chat import load_template

    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                              add_generation_prompt=True, return_dict=True,
                                              chat_template=load_template(chat_template))["input_ids"])

"""Conversations for fine-tuning (data_pipelines.chat, chat_blocks): the target mask is the
template's own (`return_assistant_tokens_mask`), also where the template has no generation
markers and the turns are found by rendering prefixes; packing keeps conversations whole; the
loss of a packed block with document masking is the sum of its conversations' losses one by
one; every bad record is one line naming the file, the line and the fix."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from data_pipelines.chat import CHATML, ChatRenderer, load_template, open_chat, to_messages
from data_pipelines.chat_blocks import ChatBlocks, pack, pick_separator, row_lengths, write
from data_pipelines.chat_synthetic import conversation, write_chat_tokenizer
from data_pipelines.text_sources import DataError

# The same turns with the generation markers around the whole difference a turn makes (its end and
# newline), and without markers: the prefix rendering must find exactly the marked tokens.
MARKED = CHATML.replace("{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}",
                        "{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}")
PLAIN = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from data_pipelines.tokenizer import load_tokenizer

    return load_tokenizer(str(write_chat_tokenizer(tmp_path_factory.mktemp("tok"))))


def _conversations(n=12, seed=0):
    rng = random.Random(seed)
    return [conversation(rng, turns=1 + i % 3, system=i % 2 == 0)["messages"] for i in range(n)]


def test_the_mask_is_the_templates_own_assistant_mask(tok):
    for messages in _conversations():
        ids, mask = ChatRenderer(tok, None, "assistant").render(messages, "x")
        theirs = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert ids.tolist() == theirs["input_ids"] and mask.tolist() == theirs["assistant_masks"]
        assert tok.decode(ids[mask == 1]).count("<|im_end|>") == sum(m["role"] == "assistant" for m in messages)


def test_without_generation_markers_the_turns_found_by_prefixes_are_the_marked_ones(tok):
    for messages in _conversations():
        marked = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                         chat_template=MARKED)
        ids, mask = ChatRenderer(tok, PLAIN, "assistant").render(messages, "x")
        assert ids.tolist() == marked["input_ids"] and mask.tolist() == marked["assistant_masks"]
        assert sum(marked["assistant_masks"]) > 0


def test_last_turn_and_all(tok):
    messages = _conversations()[2]  # three exchanges and a system prompt
    ids, every = ChatRenderer(tok, None, "assistant").render(messages, "x")
    _, last = ChatRenderer(tok, None, "last_turn").render(messages, "x")
    _, everything = ChatRenderer(tok, None, "all").render(messages, "x")
    assert tok.decode(ids[last == 1]) == messages[-1]["content"] + "<|im_end|>"
    assert last.sum() < every.sum() < everything.sum() == len(ids)


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.mark.parametrize("bad, says", [
    ({"text": "a document"}, "line 3 has neither `messages` nor `prompt` and `completion`"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "line 3: turn 0 has the unknown role 'bot'; use one of"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": " "}]},
     "line 3: turn 1 is an empty assistant turn"),
    ({"messages": [{"role": "user", "content": "q"}]}, "line 3 has no assistant turn"),
    ({"messages": [{"role": "user", "content": 3}]}, "line 3: turn 0's content is int, not text"),
])
def test_a_bad_record_is_one_line_naming_file_line_and_fix(tmp_path, bad, says):
    path = _write(tmp_path / "chats.jsonl", [GOOD, "", bad])  # line 2 blank: line numbers as an editor shows
    with pytest.raises(DataError) as err:
        for where, record in open_chat(str(path)).records():
            to_messages(record, where)
    assert str(err.value).startswith(f"{path} line 3") and says in str(err.value) and "\n" not in str(err.value)


def test_prompt_completion_pairs_are_a_user_and_an_assistant_turn():
    assert to_messages({"prompt": "p", "completion": "c"}, "x") == [{"role": "user", "content": "p"},
                                                                     {"role": "assistant", "content": "c"}]


def test_a_template_that_renders_no_assistant_tokens_is_refused(tok):
    silent = "{% for m in messages %}{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(DataError, match=r"f line 1: the chat template renders no assistant tokens"):
        ChatRenderer(tok, silent, "assistant").render(GOOD["messages"], "f line 1")
    with pytest.raises(DataError, match="the tokenizer has no chat template; set data.chat_template=chatml"):
        ChatRenderer(type("T", (), {"chat_template": None})(), None, "assistant")
    assert load_template("chatml") == CHATML


def test_packing_keeps_conversations_whole_and_refuses_or_cuts_long_ones():
    convs = [(f"f line {i}", np.arange(1, n + 1), np.r_[[0, 1, 1], np.zeros(n - 3)].astype(np.uint8))
             for i, n in enumerate([5, 6, 4, 14])]
    tokens, mask, counts = pack(iter(convs), 11, separator=99)
    assert tokens.shape == (3, 12) and counts["conversations"] == 4 and counts["truncated"] == 1
    assert tokens[0].tolist() == [1, 2, 3, 4, 5, 99, 1, 2, 3, 4, 5, 6]  # 5 + its separator, and 6 filling the block
    assert tokens[1].tolist() == list(range(1, 13))  # 14 tokens cut to a block's 12 at the end (full: out first)
    assert tokens[2].tolist()[:5] == [1, 2, 3, 4, 99] and set(tokens[2, 5:].tolist()) == {99}  # closed at the end
    assert mask[2].tolist()[:5] == [0, 1, 1, 0, 0] and counts["supervised_tokens"] == int(mask[:, 1:].sum()) == 8
    fit = [(f"h line {i}", np.arange(1, n + 1), np.r_[[0, 1], np.zeros(n - 2)].astype(np.uint8))
           for i, n in enumerate([8, 9, 3])]  # the 3 goes back into the first block's room (8 + 1 + 3 = 12)
    first_fit, _, _ = pack(iter(fit), 11, separator=99)
    assert first_fit[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 99, 1, 2, 3] and first_fit.shape == (2, 12)
    cut, _, dropped = pack(iter([("g line 1", np.arange(1, 15), np.r_[np.zeros(13), [1]].astype(np.uint8))]), 11, 99)
    assert len(cut) == 0 and dropped["dropped_no_target_left"] == 1  # its only target was cut off
    one_each, _, _ = pack(iter(convs[:3]), 11, separator=99, packing=False)
    assert one_each.shape == (3, 12)
    assert row_lengths(one_each, 99).tolist() == [6, 7, 5]  # each conversation and its separator
    assert row_lengths(tokens, 99).tolist() == [12, 12, 5]  # packed: up to the last one's separator; cut: whole
    with pytest.raises(DataError, match=r"f line 3: the conversation is 14 tokens, more than a block's 12 "):
        pack(iter(convs), 11, separator=99, truncate="refuse")


def test_the_separator_is_a_token_no_conversation_holds(tok):
    ids = [ChatRenderer(tok, None, "assistant").render(m, "x")[0] for m in _conversations()]
    assert tok.eos_token == "<|im_end|>"  # ends every turn: cannot separate conversations
    assert pick_separator(tok, ids) == tok.pad_token_id


def test_a_packed_blocks_loss_is_the_sum_of_its_conversations_one_by_one(tok, tmp_path):
    """With document masking, a packed block's summed target loss equals the sum of each
    conversation's alone (its own positions from 0, attending to itself only)."""
    from zoo.models.llama import LlamaForCausalLM, llama_shape
    from zoo.models.losses import IGNORE, cross_entropy_per_token

    renderer = ChatRenderer(tok, None, "assistant")
    rendered = [(f"c{i}", *renderer.render(m, "x")) for i, m in enumerate(_conversations(6))]
    sep = pick_separator(tok, [r[1] for r in rendered])
    tokens, mask, _ = pack(iter(rendered), 160, sep)
    write(tmp_path / "d", tokens, mask, vocab=len(tok), separator=sep, block_size=160,
          tokenizer_dir=tok.name_or_path, meta={})
    blocks = ChatBlocks(tmp_path / "d", 160, 0.0)
    row, row_mask = torch.from_numpy(blocks.train[0].astype(np.int64)), blocks.train.masks(0)[0]
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_shape("tiny", len(tok) + 2, n_layer=2, block_size=160)).eval()
    model.document_end = sep

    def summed(ids, m):
        x, y = ids[None, :-1], ids[None, 1:].masked_fill(torch.from_numpy(m[1:] == 0)[None], IGNORE)
        with torch.no_grad():
            return cross_entropy_per_token(model(x), y).sum()

    packed = summed(row, row_mask)
    ends = np.flatnonzero(row.numpy() == sep)
    starts = np.r_[0, ends[:-1] + 1]
    inside = [(s, e) for s, e in zip(starts, ends) if e > s]  # the conversations (the padding is separators)
    assert len(inside) >= 2
    model.document_end = None
    alone = sum(summed(row[s:e + 1], row_mask[s:e + 1]) for s, e in inside)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


def test_a_dataset_directory_of_conversations_is_read_row_by_row(tmp_path):
    import datasets

    rows = [GOOD, {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    source = open_chat(str(tmp_path / "ds"))
    read = [(where, to_messages(record, where)) for where, record in source.records()]
    assert [m for _, m in read] == [r["messages"] for r in rows]
    assert read[1][0] == f"data.path={tmp_path / 'ds'} row 2" and source.key.startswith("chat-dataset:")


def test_parquet_instruction_pairs_are_read_with_their_row_numbers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": ["p1", "p2"], "completion": ["c1", ""]}), tmp_path / "pairs.parquet")
    records = list(open_chat(str(tmp_path / "pairs.parquet")).records())
    assert to_messages(records[0][1], records[0][0])[1] == {"role": "assistant", "content": "c1"}
    with pytest.raises(DataError, match=r"pairs.parquet row 2: turn 1 is an empty assistant turn"):
        to_messages(records[1][1], records[1][0])


def test_workers_render_the_same_blocks_as_one_process(tok, tmp_path, monkeypatch):
    from data_pipelines import chat_prepare
    from data_pipelines.chat_synthetic import write_conversations

    chats = write_conversations(tmp_path / "chats.jsonl", 300)
    tok.save_pretrained(str(tmp_path / "tok"))
    monkeypatch.setattr(chat_prepare, "CHUNK", 64)  # several chunks a worker
    metas = []
    for workers in (1, 2):
        metas.append(chat_prepare.prepare_chat(str(chats), str(tmp_path / "tok"), tmp_path / f"w{workers}",
                                               block_size=96, workers=workers))
    assert metas[0]["shards"] == metas[1]["shards"] and metas[0]["conversations"] == 300
    assert (tmp_path / "w1" / "mask-00000.bin").read_bytes() == (tmp_path / "w2" / "mask-00000.bin").read_bytes()


def test_a_preparation_stopped_part_way_goes_on_from_its_rendered_shards(tok, tmp_path, monkeypatch):
    """Shards of 40 conversations: stopped after 130 were rendered, the second run renders the
    170 after the 120 of its three finished shards and writes the same bytes as one run;
    meta.json only at the end, the rendering shards gone; other arguments start over."""
    from data_pipelines import chat_prepare, chat_shards
    from data_pipelines.chat_synthetic import write_conversations

    chats = write_conversations(tmp_path / "chats.jsonl", 300)
    tok.save_pretrained(str(tmp_path / "tok"))
    monkeypatch.setattr(chat_shards, "SHARD_CONVERSATIONS", 40)
    prepare = lambda out, **kw: chat_prepare.prepare_chat(str(chats), str(tmp_path / "tok"), out,  # noqa: E731
                                                          block_size=96, workers=1, **kw)
    whole = prepare(tmp_path / "whole")
    real, rendered = chat_prepare.rendered_conversations, []

    def stopped(*args):
        for i, item in enumerate(real(*args)):
            if i == 130:
                raise KeyboardInterrupt
            yield item

    def counted(*args):
        for item in real(*args):
            rendered.append(item[0])
            yield item

    monkeypatch.setattr(chat_prepare, "rendered_conversations", stopped)
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "part")
    assert not (tmp_path / "part" / "meta.json").exists()
    assert sorted(f.name for f in (tmp_path / "part" / "rendering").glob("*.done")) == \
        ["conv-00000.done", "conv-00001.done", "conv-00002.done"]
    monkeypatch.setattr(chat_prepare, "rendered_conversations", counted)
    again = prepare(tmp_path / "part")
    assert len(rendered) == 180 and rendered[0].endswith("line 121")
    assert again["shards"] == whole["shards"] and again["mask_shards"] == whole["mask_shards"]
    assert not (tmp_path / "part" / "rendering").exists()
    with pytest.raises(KeyboardInterrupt):  # another data.train_on: nothing of the old shards is used
        monkeypatch.setattr(chat_prepare, "rendered_conversations", stopped)
        prepare(tmp_path / "other", train_on="all")
    rendered.clear()
    monkeypatch.setattr(chat_prepare, "rendered_conversations", counted)
    prepare(tmp_path / "other")
    assert len(rendered) == 300


def test_a_prepared_chat_directory_given_as_data_path_is_checked_before_anything_starts(tok, tmp_path, monkeypatch):
    """data=chat data.path=DIR (prepared with --format chat): its tokens and its target masks are
    checked against meta.json's sizes and digests in the validation pass, as data=prepared's are;
    a changed mask byte (which would train on the wrong tokens, silently) is one line naming
    the file and how to rebuild it."""
    from tests.unit.config.test_config import composed
    from zoo.config.paths import check_paths
    from zoo.families.registry import family
    from zoo.run.errors import ConfigError

    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    renderer = ChatRenderer(tok, None, "assistant")
    rendered = [(f"c{i}", *renderer.render(m, "x")) for i, m in enumerate(_conversations(6))]
    sep = pick_separator(tok, [r[1] for r in rendered])
    tokens, mask, _ = pack(iter(rendered), 160, sep)
    meta = write(tmp_path / "d", tokens, mask, vocab=len(tok), separator=sep, block_size=160,
                 tokenizer_dir=tok.name_or_path, meta={})
    assert meta["mask_shards"][0]["xxh3_64"]
    cfg = composed("model=qwen2", "data=chat", f"data.path={tmp_path / 'd'}")
    check_paths(cfg, family("llama"))  # intact
    masks = tmp_path / "d" / "mask-00000.bin"
    data = bytearray(masks.read_bytes())
    data[len(data) // 2] ^= 1
    masks.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=rf"^data.path={tmp_path / 'd'}: {masks} fails its checksum .*rebuild it"):
        check_paths(cfg, family("llama"))


def test_unpacked_rows_know_their_lengths_also_in_a_directory_written_before_them(tok, tmp_path):
    """data.packing=false: a row's input tokens (its conversation's, the separator after it
    predicting nothing), read from lengths-00000.npy, or counted from the rows without it."""
    renderer = ChatRenderer(tok, None, "assistant")
    rendered = [(f"c{i}", *renderer.render(m, "x")) for i, m in enumerate(_conversations(6))]
    sep = pick_separator(tok, [r[1] for r in rendered])
    tokens, mask, _ = pack(iter(rendered), 160, sep, packing=False)
    write(tmp_path / "d", tokens, mask, vocab=len(tok), separator=sep, block_size=160,
          tokenizer_dir=tok.name_or_path, meta={"packing": False})
    want = [len(ids) for _, ids, _ in rendered]
    rows = ChatBlocks(tmp_path / "d", 160, 0.0).train
    assert rows.lengths(np.arange(6)).tolist() == want and max(want) < 160
    assert rows.lengths(np.array([4, 1])).tolist() == [want[4], want[1]]
    (tmp_path / "d" / "lengths-00000.npy").unlink()
    assert ChatBlocks(tmp_path / "d", 160, 0.0).train.lengths(np.arange(6)).tolist() == want


def test_records_that_need_mending_leave_no_rendering_behind(tok, tmp_path):
    """An empty file or a bad record: one DataError, and the output is as it was (a directory
    that was not there is not left; one that was keeps only what it held)."""
    from data_pipelines import chat_prepare

    tok.save_pretrained(str(tmp_path / "tok"))
    empty, bad = tmp_path / "empty.jsonl", tmp_path / "bad.jsonl"
    empty.write_text("")
    bad.write_text(json.dumps(GOOD) + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(DataError, match="holds no conversations"):
        chat_prepare.prepare_chat(str(empty), str(tmp_path / "tok"), tmp_path / "new", block_size=96, workers=1)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    with pytest.raises(DataError, match="line 2: turn 0 has the unknown role 'robot'"):
        chat_prepare.prepare_chat(str(bad), str(tmp_path / "tok"), tmp_path / "mine", block_size=96, workers=1)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]

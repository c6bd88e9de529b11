"""Task files (zoo.evaluate.tasks): the two kinds read back, every mistake is one line naming
the file, the line and the fix, the published formats convert, and the generated task."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from zoo.evaluate.tasks import CHOICE, CONTINUATION, KEYWORDS, convert, python_keywords, read_task
from zoo.run.errors import DataError


def _write(tmp_path, *lines, name="task.jsonl"):
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_both_kinds_read_back(tmp_path):
    mc = read_task(_write(tmp_path, {"context": "2 + 2 =", "choices": [" 4", " 5"], "gold": 0}, "",
                          {"context": "The sky is", "choices": [" green", " blue", " red"], "gold": 1}))
    assert (mc.name, mc.kind, len(mc.examples)) == ("task", CHOICE, 2)
    assert mc.examples[1].choices == (" green", " blue", " red") and mc.examples[1].gold == 1
    cont = read_task(_write(tmp_path, {"context": "He drank the", "continuation": " wine"}, name="lambada.jsonl"))
    assert cont.kind == CONTINUATION and cont.examples[0].choices == (" wine",)


@pytest.mark.parametrize("line, says", [
    ('{"context": "a", "choices": [" b", " c"]', "task.jsonl:2: not JSON ("),
    ('[1, 2]', "task.jsonl:2: a list, not an object"),
    ({"choices": [" b", " c"], "gold": 0}, "task.jsonl:2: no \"context\""),
    ({"context": "a", "gold": 0}, "task.jsonl:2: give either \"choices\" and \"gold\" (multiple choice) or "
                                  "\"continuation\" (LAMBADA-style), found neither"),
    ({"context": "a", "choices": [], "gold": 0}, "task.jsonl:2: \"choices\" must be a list of at least 2"),
    ({"context": "a", "choices": [" b", " c"]}, "task.jsonl:2: \"gold\" must be the index of the right choice "
                                                "(an integer 0-1), got null"),
    ({"context": "a", "choices": [" b", " c", " d"], "gold": 3},
     "task.jsonl:2: \"gold\": 3 is out of range for 3 choices: give 0-2"),
    ({"context": "a", "continuation": " b"}, "task.jsonl:2: a continuation example where line 1 is a choice one"),
])
def test_a_mistake_is_one_line_with_the_file_the_line_and_the_fix(tmp_path, line, says):
    path = _write(tmp_path, {"context": "x", "choices": [" y", " z"], "gold": 1}, line)
    with pytest.raises(DataError) as err:
        read_task(path)
    assert str(err.value).startswith(f"{tmp_path}/{says}") and "\n" not in str(err.value), str(err.value)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    with pytest.raises(DataError, match=r"task.jsonl: no examples: one JSON object a line"):
        read_task(_write(tmp_path, ""))
    with pytest.raises(DataError, match=r"nope.jsonl does not exist: give a JSON Lines file"):
        read_task(tmp_path / "nope.jsonl")


def test_the_published_formats_convert(tmp_path):
    hella = {"ctx": "A man is sitting on a roof. he", "endings": ["starts pulling up roofing.", "is ripping level.",
                                                                   "is holding a rubik's cube.", "starts a tree."],
             "label": "0"}
    arc = {"question": "Which is a mammal?", "choices": {"text": ["shark", "whale"], "label": ["A", "B"]},
           "answerKey": "B"}
    piqa = {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "hit it with a hammer", "label": 0}
    assert convert("hellaswag", [hella])[0] == {"context": hella["ctx"], "choices": [" " + e for e in hella["endings"]],
                                                "gold": 0}
    assert convert("arc", [arc])[0] == {"context": "Question: Which is a mammal?\nAnswer:",
                                        "choices": [" shark", " whale"], "gold": 1}
    assert convert("piqa", [piqa])[0]["choices"] == [" twist the lid", " hit it with a hammer"]
    assert convert("lambada", [{"text": "he drank the wine"}]) == [{"context": "he drank the", "continuation": " wine"}]
    with pytest.raises(DataError, match=r"record 1 is not a arc record \(KeyError: 'answerKey'\)"):
        convert("arc", [{"question": "q", "choices": {"text": ["a"], "label": ["A"]}}])
    src = _write(tmp_path, arc, arc, name="arc_raw.jsonl")
    out = subprocess.run([sys.executable, "-m", "zoo.evaluate.tasks", "convert", "arc", str(src),
                          str(tmp_path / "arc.jsonl")], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "wrote 2 arc examples" in out.stdout, out.stderr
    assert len(read_task(tmp_path / "arc.jsonl").examples) == 2
    bad = subprocess.run([sys.executable, "-m", "zoo.evaluate.tasks", "convert", "mmlu", str(src),
                          str(tmp_path / "x.jsonl")], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr == ("zoo: error: format 'mmlu' is unknown: use one of hellaswag, arc, "
                                                  "piqa, lambada\n") and not (tmp_path / "x.jsonl").exists()


def test_the_generated_task_is_deterministic_and_reads_back(tmp_path):
    from pydoc_data.topics import topics

    corpus = "\n".join(topics[k] for k in sorted(topics))
    rows = python_keywords(50, seed=3)
    assert rows == python_keywords(50, seed=3) and rows != python_keywords(50, seed=4)
    task = read_task(_write(tmp_path, *rows, name="pydoc_keywords.jsonl"))
    assert task.kind == CHOICE and len(task.examples) == 50
    for ex in task.examples:
        assert len(ex.choices) == 4 and len(set(ex.choices)) == 4 and ex.choices[ex.gold].strip() in KEYWORDS
        assert 0 < len(ex.context) <= 160 and ex.context + ex.choices[ex.gold] + " " in corpus
    golds = [ex.gold for ex in task.examples]
    assert len(set(golds)) == 4  # the right answer is not always in one place

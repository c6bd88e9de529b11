"""Downstream tasks as local files (issue #55): the schema, the reader that checks it line by
line, the converters from the common published formats, and a task generated from the
built-in corpus for this machine's tests and the offline default.

A task file is JSON Lines, one example a line, all of one kind:

    {"context": "The capital of France is", "choices": [" Paris", " Rome"], "gold": 0}
        multiple choice: scored by each choice's summed (acc) and per-character (acc_norm)
        log-likelihood after the context
    {"context": "He raised his glass and drank the", "continuation": " wine"}
        continuation (LAMBADA-style): is the greedy continuation this one, and its perplexity

A choice or continuation carries its own leading space, as the harness's do. A mistake is one
line naming the file, the line and the fix (DataError: exit 2 before training starts).

    python -m zoo.evaluate.tasks convert hellaswag IN.jsonl OUT.jsonl   # also arc, piqa, lambada
"""
from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Sequence, Tuple

from zoo.run.errors import DataError

CHOICE, CONTINUATION = "choice", "continuation"


@dataclass(frozen=True)
class Example:
    context: str
    choices: Tuple[str, ...]  # a continuation example: its one continuation
    gold: int


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # CHOICE or CONTINUATION
    examples: Tuple[Example, ...]


def _example(record, where: str) -> Tuple[str, Example]:
    """(kind, example) of one parsed line; DataError naming `where` (file:line) and the fix."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a {type(record).__name__}, not an object: give {{\"context\": ..., \"choices\": "
                        f"[...], \"gold\": N}} or {{\"context\": ..., \"continuation\": ...}}")
    context = record.get("context")
    if not isinstance(context, str) or not context:
        raise DataError(f"{where}: no \"context\" (a non-empty string): the text the model continues")
    has_choices, has_cont = "choices" in record, "continuation" in record
    if has_choices == has_cont:
        raise DataError(f"{where}: give either \"choices\" and \"gold\" (multiple choice) or \"continuation\" "
                        f"(LAMBADA-style), {'not both' if has_choices else 'found neither'}")
    if has_cont:
        cont = record["continuation"]
        if not isinstance(cont, str) or not cont.strip():
            raise DataError(f"{where}: \"continuation\" must be a non-empty string (with its leading space: \" wine\")")
        return CONTINUATION, Example(context, (cont,), 0)
    choices = record["choices"]
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise DataError(f"{where}: \"choices\" must be a list of at least 2 non-empty strings, got "
                        f"{json.dumps(choices)[:80]}")
    gold = record.get("gold")
    if isinstance(gold, bool) or not isinstance(gold, int):
        raise DataError(f"{where}: \"gold\" must be the index of the right choice (an integer 0-{len(choices) - 1}), "
                        f"got {json.dumps(gold)}")
    if not 0 <= gold < len(choices):
        raise DataError(f"{where}: \"gold\": {gold} is out of range for {len(choices)} choices: give 0-{len(choices) - 1}")
    return CHOICE, Example(context, tuple(choices), gold)


def read_task(path) -> Task:
    """The task in the JSON Lines file `path`, every line checked."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"task file {path} does not exist: give a JSON Lines file (python -m zoo.evaluate.tasks "
                        f"convert FORMAT IN OUT makes one from HellaSwag, ARC, PIQA or LAMBADA records)")
    kind, first, examples = None, 0, []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not JSON ({err.msg} at column {err.colno}): one object a line") from None
            this, example = _example(record, where)
            if kind is None:
                kind, first = this, number
            elif this != kind:
                raise DataError(f"{where}: a {this} example where line {first} is a {kind} one: one kind a file "
                                f"(split them into two task files)")
            examples.append(example)
    if not examples:
        raise DataError(f"{path}: no examples: one JSON object a line")
    return Task(path.stem, kind, tuple(examples))


def metric_names(tasks: Sequence[Task]) -> List[str]:
    """The metrics zoo.evaluate.in_loop's `TaskScorer.metrics` reports for `tasks`."""
    return [f"{t.name}/{m}" for t in tasks for m in (("acc", "acc_norm") if t.kind == CHOICE else ("acc", "ppl"))]


def higher_is_better(metric: str) -> bool:
    """eval_loss and perplexities fall as a model improves; accuracies rise."""
    return metric.endswith("/acc") or metric.endswith("/acc_norm")


def best_fields(state: dict) -> dict:
    """summary.json's best evaluation: best_eval_step, best_eval_metric and its value
    (best_eval_loss when the metric is the loss, best_eval_value otherwise)."""
    metric = state.get("metric", "eval_loss")
    return {"best_eval_metric": metric, "best_eval_loss" if metric == "eval_loss" else "best_eval_value": state["best"],
            "best_eval_step": state["best_step"]}


BUILT_IN: Dict[str, Callable[[], List[dict]]] = {}  # filled below: names trainer.eval_tasks takes besides files


def _task_of(name: str, records: List[dict]) -> Task:
    examples, kind = [], None
    for number, record in enumerate(records, 1):
        kind, example = _example(record, f"built-in task {name}, example {number}")
        examples.append(example)
    return Task(name, kind, tuple(examples))


def load_task(name_or_path: str, key: str = "trainer.eval_tasks") -> Task:
    """A built-in task by name (BUILT_IN) or the task file at the path; DataError (naming `key`,
    where the name came from) otherwise."""
    if name_or_path in BUILT_IN:
        return _task_of(name_or_path, BUILT_IN[name_or_path]())
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        raise DataError(f"{key}: {name_or_path!r} is neither a built-in task ({', '.join(sorted(BUILT_IN))}) "
                        f"nor a task file: give a JSON Lines file's path (python -m zoo.evaluate.tasks convert makes "
                        f"one) or a built-in name")
    return read_task(path)


# The published formats, as the hub's datasets and lm-evaluation-harness hold them.
def _hellaswag(r: dict) -> dict:
    ctx = r.get("ctx") or f"{r['ctx_a']} {r['ctx_b'].capitalize()}".strip()
    return {"context": ctx, "choices": [" " + e for e in r["endings"]], "gold": int(r["label"])}


def _arc(r: dict) -> dict:
    labels = list(r["choices"]["label"])
    return {"context": f"Question: {r['question']}\nAnswer:", "choices": [" " + t for t in r["choices"]["text"]],
            "gold": labels.index(r["answerKey"])}


def _piqa(r: dict) -> dict:
    return {"context": f"Question: {r['goal']}\nAnswer:", "choices": [" " + r["sol1"], " " + r["sol2"]],
            "gold": int(r["label"])}


def _lambada(r: dict) -> dict:
    context, _, last = r["text"].rpartition(" ")
    return {"context": context, "continuation": " " + last}


FORMATS: Dict[str, Callable[[dict], dict]] = {"hellaswag": _hellaswag, "arc": _arc, "piqa": _piqa,
                                              "lambada": _lambada}


def convert(fmt: str, records: Iterable[dict]) -> List[dict]:
    """zoo's task records from `fmt`'s (FORMATS)."""
    if fmt not in FORMATS:
        raise DataError(f"format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    out = []
    for number, r in enumerate(records, 1):
        try:
            out.append(FORMATS[fmt](r))
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"record {number} is not a {fmt} record ({type(err).__name__}: {err}): its fields are "
                            f"those of the hub's {fmt} dataset") from None
    return out


KEYWORDS = ("if", "for", "while", "return", "import", "class", "def", "try", "with", "lambda", "yield", "raise")


def python_keywords(n: int = 200, seed: int = 0, text: str | None = None, skip: int = 0) -> List[dict]:
    """A multiple-choice task from the Python documentation inside CPython (the default
    corpus): the context is the text before a keyword in code or prose (up to 160 characters,
    from a word's start; context + the right choice is the text), the choices that keyword and
    three others: a model that learned the corpus does better than the chance 25%. `skip`:
    start past that many places (its train split is the 100 places after the scored ones)."""
    if text is None:
        from pydoc_data.topics import topics

        text = "\n".join(topics[k] for k in sorted(topics))
    rng = random.Random(seed)
    spots = [m for m in re.finditer(r"(?<= )(" + "|".join(KEYWORDS) + r")(?= )", text) if m.start() > 160]
    rng.shuffle(spots)
    out = []
    for m in spots[skip:skip + n]:
        start = text.find(" ", m.start() - 160) + 1
        others = rng.sample([k for k in KEYWORDS if k != m.group(1)], 3)
        choices = [m.group(1), *others]
        rng.shuffle(choices)
        out.append({"context": text[start:m.start() - 1], "choices": [" " + c for c in choices],  # as the text has it
                    "gold": choices.index(m.group(1))})
    return out


BUILT_IN["python_keywords"] = python_keywords


def _python_keywords_train() -> List[dict]:
    """python_keywords' train split: 100 places past the 200 scored ones whose text is none of
    theirs (the corpus repeats some passages word for word)."""
    scored = {r["context"] for r in python_keywords()}
    return [r for r in python_keywords(150, skip=200) if r["context"] not in scored][:100]


BUILT_IN_TRAIN = {"python_keywords": _python_keywords_train}  # their few-shot examples


def train_split(name_or_path: str, key: str = "trainer.eval_tasks") -> Task:
    """The task's own train split, its few-shot examples: a built-in's, or TASK.train.jsonl
    beside the task file TASK.jsonl; DataError naming the file to write otherwise."""
    if name_or_path in BUILT_IN_TRAIN:
        return _task_of(name_or_path + ".train", BUILT_IN_TRAIN[name_or_path]())
    path = Path(name_or_path).expanduser()
    train = path.with_name(path.stem + ".train" + path.suffix)
    if not train.is_file():
        raise DataError(f"{key}: few-shot examples come from the task's train split, and {path.name} has none: "
                        f"write its train examples, in the same schema, to {train} (python -m zoo.evaluate.tasks "
                        f"convert FORMAT TRAIN_RECORDS {train}), or ask for no shots")
    return read_task(train)


def shot_tasks(names: List[str], shots: int, seed: int = 0, key: str = "trainer.eval_tasks") -> List[Task]:
    """The tasks `names` (files or built-ins), each with `shots` few-shot examples (with_shots)."""
    tasks = [load_task(name, key) for name in names]
    return [with_shots(task, train_split(name, key), shots, seed) if shots else task for name, task in zip(names, tasks)]


def with_shots(task: Task, train: Task, shots: int, seed: int = 0) -> Task:
    """`task` with `shots` examples of `train` before each context, as the harness's
    num_fewshot writes them: each shot's context and right choice, then a blank line; the
    shots drawn per example (seeded by the task, the example and `seed`), never repeated
    within one. DataError where the train split holds fewer than `shots` examples."""
    if shots == 0:
        return task
    if len(train.examples) < shots:
        raise DataError(f"{train.name} holds {len(train.examples)} examples, fewer than the {shots} shots asked: give "
                        f"it more, or ask for at most {len(train.examples)}")
    if train.kind != task.kind:
        raise DataError(f"{train.name} holds {train.kind} examples and {task.name} {task.kind} ones: one kind for both")
    out = []
    for number, example in enumerate(task.examples):
        picked = random.Random(f"{seed}:{task.name}:{number}").sample(range(len(train.examples)), shots)
        prefix = "".join(train.examples[i].context + train.examples[i].choices[train.examples[i].gold] + "\n\n"
                         for i in picked)
        out.append(Example(prefix + example.context, example.choices, example.gold))
    return Task(task.name, task.kind, tuple(out))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m zoo.evaluate.tasks convert {" + ",".join(FORMATS) + "} IN.jsonl OUT.jsonl"
    if len(argv) != 4 or argv[0] != "convert":
        print(usage, file=sys.stderr)
        return 2
    _, fmt, src, dst = argv
    try:
        if not Path(src).is_file():
            raise DataError(f"{src} does not exist: give the {fmt} records as JSON Lines")
        records = [json.loads(line) for line in Path(src).read_text(encoding="utf-8").splitlines() if line.strip()]
        rows = convert(fmt, records)
    except (DataError, json.JSONDecodeError) as err:
        print(f"zoo: error: {err}", file=sys.stderr)
        return 2
    Path(dst).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    read_task(dst)  # what it wrote reads back
    print(f"zoo: wrote {len(rows)} {fmt} examples to {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

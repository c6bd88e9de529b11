"""In-loop task scoring (zoo.evaluate.in_loop, zoo.evaluate.likelihood): rows split and cut as
lm-evaluation-harness's HFLM does; batched, padded, sorted rows scored through the model's own
loss function give each row's log-likelihood as the row alone through a plain log-softmax;
the harness's metrics from the table; trainer.eval_tasks' mistakes in one line before a rank
starts. The same numbers on every layout is tests/e2e/test_eval_tasks.py."""
from __future__ import annotations

import json
import math

import pytest
import torch

from tests.unit.config.test_config import check, composed
from zoo.evaluate.in_loop import TaskScorer, encode_row, split_request
from zoo.evaluate.likelihood import LikelihoodTally
from zoo.evaluate.tasks import CHOICE, CONTINUATION, Example, Task
from zoo.families.accuracy import tallied
from zoo.models.gpt import GPT, gpt_shape
from zoo.run.errors import ConfigError, DataError


def _chars(text: str):
    return [ord(c) % 97 for c in text]  # one token a character, ids below the tiny vocabulary


def test_rows_are_split_and_cut_as_the_harness_does():
    assert split_request("The answer is ", "42") == ("The answer is", " 42")
    assert split_request("a", " b") == ("a", " b")
    tokens, first = encode_row(_chars, "abc  ", "de", block_size=100)
    assert tokens == _chars("abc  de") and first == 3  # the spaces are the continuation's
    tokens, first = encode_row(_chars, "abcdefghij", "xy", block_size=5)  # the last block_size + 1 tokens
    assert tokens == _chars("fghijxy")[-6:] and tokens[first:] == _chars("xy")
    with pytest.raises(ValueError, match="no token"):
        encode_row(lambda s: [1] if s else [], "a", "b", block_size=8)  # the context's tokens swallow it


def _tasks():
    choice = Task("pick", CHOICE, (Example("the cat sat on the", (" mat", " hat", " xylophone"), 0),
                                   Example("one two three", (" four", " five five five"), 1)))
    cont = Task("go on", CONTINUATION, (Example("abc abc abc ab", ("c",), 0), Example("hello wor", ("ld, hello",), 0)))
    return [choice, cont]


def _reference(model, tokens, first):
    """The row alone, unpadded: log-softmax of the full logits at the continuation's tokens."""
    ids = torch.tensor(tokens)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).float(), -1)[0]
    targets = ids[0, 1:]
    picked = logp[torch.arange(len(targets)), targets][first - 1:]
    greedy = bool((logp.argmax(-1)[first - 1:] == targets[first - 1:]).all())
    return float(picked.double().sum()), len(targets) - first + 1, greedy


@pytest.mark.parametrize("pad_to", [None, 32])
def test_batched_rows_score_as_each_row_alone(pad_to):
    torch.manual_seed(0)
    model = GPT(gpt_shape("tiny", 97, n_layer=2, block_size=32)).eval()
    scorer = TaskScorer(_tasks(), _chars, block_size=32)
    batches, owners = scorer.batches(micro_batch=2, dp_rank=0, dp_size=1, pad_to=pad_to)
    assert sorted(o for o in owners if o >= 0) == list(range(len(scorer.rows)))  # every row once
    if pad_to:
        assert all(x.shape == (2, 32) for x, _ in batches)
    tally = LikelihoodTally()
    with tallied(model, "loss_fn", tally), torch.no_grad():
        for x, y in batches:
            model(x, y)
    table = scorer.gather(tally, owners, True, torch.device("cpu"))
    for row, (tokens, first) in enumerate(scorer.rows):
        ll, n, greedy = _reference(model, tokens, first)
        assert table[row, 0].item() == pytest.approx(ll, rel=1e-5, abs=1e-5)
        assert table[row, 1:].tolist() == [n, float(greedy)]


def test_metrics_are_the_harness_s():
    scorer = TaskScorer(_tasks(), _chars, block_size=64)
    # rows: pick (3 + 2 choices), then go on (1 + 1)
    table = torch.tensor([[-4.0, 4, 0], [-3.0, 4, 0], [-9.5, 10, 0],   # acc and per char: " hat" (wrong)
                          [-2.0, 5, 0], [-4.5, 15, 0],                  # acc: " four" (wrong); per char: right
                          [-0.5, 1, 1], [-7.0, 9, 0]], dtype=torch.float64)
    got = scorer.metrics(table)
    assert got == {"pick/acc": 0.0, "pick/acc_norm": 0.5, "go on/acc": 0.5, "go on/ppl": math.exp(7.5 / 2)}


def _task_file(tmp_path, name, rows):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_eval_tasks_validate_before_any_rank(tmp_path):
    good = _task_file(tmp_path, "mine", [{"context": "a b", "choices": [" c", " d"], "gold": 0}])
    assert check(composed(f"trainer.eval_tasks=[{good},python_keywords]", "trainer.eval_metric=mine/acc")) is not None
    cases = [(["model=bert", "trainer.eval_tasks=[python_keywords]"], ConfigError,
              r"model.family=bert continues no text; use model=gpt or model=llama, or set trainer.eval_tasks=\[\]"),
             (["trainer.eval_tasks=[no_such_task]"], DataError, r"'no_such_task' is neither a built-in task "
                                                                r"\(python_keywords\) nor a task file"),
             (["trainer.eval_tasks=[python_keywords]", "trainer.eval_batches=0"], ConfigError,
              r"trainer.eval_batches=0 turns them off"),
             ([f"trainer.eval_tasks=[{good},{good}]"], ConfigError, r"names 'mine' twice"),
             ([f"trainer.eval_tasks=[{good}]", "trainer.eval_metric=mine/ppl"], ConfigError,
              r"trainer.eval_metric='mine/ppl' is none of the run's metrics; choose one of \['eval_loss', "
              r"'mine/acc', 'mine/acc_norm'\]"),
             (["trainer.eval_metric=acc"], ConfigError, r"a task's needs trainer.eval_tasks")]
    for overrides, error, message in cases:
        with pytest.raises(error, match=message):
            check(composed(*overrides))
    bad = _task_file(tmp_path, "bad", [{"context": "a", "choices": [" b", " c"], "gold": 0}, {"context": "a"}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: give either \"choices\" and \"gold\""):
        check(composed(f"trainer.eval_tasks=[{bad}]"))


def test_zoo_eval_without_the_harness_says_what_to_install(monkeypatch, tmp_path):
    import sys

    from zoo.evaluate.harness import harness_model

    monkeypatch.setitem(sys.modules, "lm_eval.models.huggingface", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"lacks .*: pip install 'lm_eval\[hf\]'"):
        harness_model(tmp_path, 8, None)


def test_shots_come_from_the_task_s_own_train_split(tmp_path):
    from zoo.evaluate.tasks import load_task, shot_tasks, train_split, with_shots

    scored, train = load_task("python_keywords"), train_split("python_keywords")
    assert not {e.context for e in scored.examples} & {e.context for e in train.examples}  # no leak
    two = with_shots(scored, train, 2, seed=7)
    assert two == with_shots(scored, train, 2, seed=7) != with_shots(scored, train, 2, seed=8)
    first, plain = two.examples[0], scored.examples[0]
    assert first.context.endswith("\n\n" + plain.context) and first.choices == plain.choices
    prefix, shots = first.context[:-len(plain.context)], {e.context + e.choices[e.gold] + "\n\n" for e in train.examples}
    assert any(prefix.startswith(a) and prefix[len(a):] in shots and prefix[len(a):] != a for a in shots)
    good = _task_file(tmp_path, "mine", [{"context": "a b", "choices": [" c", " d"], "gold": 0}])
    with pytest.raises(DataError, match=r"mine.jsonl has none: write its train examples, in the same schema, to "
                                        r".*mine.train.jsonl"):
        check(composed(f"trainer.eval_tasks=[{good}]", "trainer.eval_task_shots=1"))
    _task_file(tmp_path, "mine.train", [{"context": "x", "choices": [" y", " z"], "gold": 1}])
    with pytest.raises(DataError, match=r"mine.train holds 1 examples, fewer than the 2 shots asked"):
        check(composed(f"trainer.eval_tasks=[{good}]", "trainer.eval_task_shots=2"))
    assert shot_tasks([str(good)], 1)[0].examples[0].context == "x z\n\na b"
    with pytest.raises(ConfigError, match=r"trainer.eval_task_shots=-1 must be >= 0"):
        check(composed(f"trainer.eval_tasks=[{good}]", "trainer.eval_task_shots=-1"))

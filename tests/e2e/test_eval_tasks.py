"""In-loop downstream tasks (trainer.eval_tasks) on the distributed model in place: a random
transformers GPT-2 and Llama imported and scored under one process give the same metrics as
Llama under ZeRO-3 over dp 2, tp2, pp2, 3d, cp2 and cp2 x pp2 (imported onto context parallelism;
its ranks score whole sequences, the first of each cp group reports; under a pipeline the
stages send whole sequences while scoring, a share while training) and GPT under tp2 with sequence
parallelism, pp2 and 3d
(the tensor-parallel rules are each family's own; ZeRO's gathering and the pipeline are not), and
every choice's log-likelihood equals lm-evaluation-harness's HFLM
algorithm (reimplemented below on transformers' own model and the run's tokenizer: the
context's tokens, then those of context + choice past them, the last max_length + 1 tokens,
log-softmax) within 1e-5; a trained run's task history goes on after a resume and
checkpoint.best follows a task's accuracy."""
from __future__ import annotations

import json
import re

import pytest
import torch

from tests.e2e.test_llama import save_random_llama

pytestmark = pytest.mark.e2e

COMMON = ["trainer.sample_tokens=0", "trainer.eval_batches=1", "logger=none", "trainer.global_batch_size=12"]
LAYOUTS = {"one": ["parallel=ddp", "trainer.micro_batch_size=4"],
           "tp2": ["parallel=tp", "trainer.micro_batch_size=4"], "pp2": ["parallel=pp"],  # 6 micro-batches of 2
           "tp2-sp": ["parallel=tp", "parallel.sequence_parallel=true", "trainer.micro_batch_size=4"],
           "zero3": ["parallel=zero3", "trainer.micro_batch_size=2"], "3d": ["parallel=3d", "trainer.micro_batch_size=1"],
           "cp2": ["parallel=cp", "trainer.micro_batch_size=4"],
           "cp2-pp2": ["parallel=cp", "parallel.pp=2"]}  # 6 micro-batches of 2; the tasks' whole sequences piped


def _keyword_and_word_tasks(directory):
    """30 multiple-choice examples (Python keywords) and 20 continuations (a word) of the corpus."""
    from pydoc_data.topics import topics

    from zoo.evaluate.tasks import python_keywords

    text = "\n".join(topics[k] for k in sorted(topics))
    choice = directory / "keywords.jsonl"
    choice.write_text("".join(json.dumps(r) + "\n" for r in python_keywords(30, seed=1)))
    words = [m for m in re.finditer(r"(?<= )[a-z]{6,}(?=[ .,])", text) if m.start() > 120][::700][:20]
    cont = directory / "words.jsonl"  # LAMBADA's kind: the text up to a word, then the word
    cont.write_text("".join(json.dumps({"context": text[text.find(" ", m.start() - 120) + 1:m.start() - 1],
                                        "continuation": " " + m.group(0)}) + "\n" for m in words))
    return choice, cont


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return _keyword_and_word_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def random_hf(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=4096, n_positions=128, n_embd=128, n_layer=4, n_head=4)).save_pretrained(
        str(root / "gpt"), safe_serialization=True)
    return {"gpt": root / "gpt", "llama": save_random_llama(root / "llama", seed=2)}


@pytest.fixture(scope="module")
def scored(run_zoo, tasks, random_hf):
    done = {}

    def run(family: str, layout: str):
        if (family, layout) not in done:
            done[family, layout] = run_zoo(f"model={family}", f"model.init_from={random_hf[family]}",
                                           "trainer.max_steps=0", *COMMON, *LAYOUTS[layout],
                                           f"trainer.eval_tasks=[{tasks[0]},{tasks[1]}]")
        return done[family, layout]

    return run


def _rows(run):
    return [json.loads(line) for line in (run.run_dir / "tasks" / "step_0000000.jsonl").read_text().splitlines()]


def _harness_loglikelihoods(model_dir, tokenizer_dir, task_files, max_length):
    """lm-evaluation-harness's HFLM._loglikelihood_tokens, one request at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    out = []
    for path in task_files:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            for choice in r.get("choices", [r.get("continuation")]):
                context, continuation = r["context"], choice
                spaces = len(context) - len(context.rstrip())
                if spaces:
                    context, continuation = context[:-spaces], context[-spaces:] + continuation
                whole = tok.encode(context + continuation, add_special_tokens=False)
                context_enc = tok.encode(context, add_special_tokens=False)
                continuation_enc = whole[len(context_enc):]
                inp = torch.tensor((context_enc + continuation_enc)[-(max_length + 1):][:-1])[None]
                with torch.no_grad():
                    logp = torch.log_softmax(model(inp).logits.float(), -1)[0, -len(continuation_enc):]
                target = torch.tensor(continuation_enc)
                out.append(float(logp[torch.arange(len(target)), target].double().sum()))
    return out


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_one_process_equals_the_harness_algorithm_on_transformers(scored, tasks, random_hf, family):
    run = scored(family, "one")
    ours = [r["loglikelihood"] for r in _rows(run)]
    theirs = _harness_loglikelihoods(random_hf[family], run.run_dir / "tokenizer", tasks, 128)
    assert len(ours) == len(theirs) == 30 * 4 + len(tasks[1].read_text().splitlines())
    torch.testing.assert_close(torch.tensor(ours, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64),
                               rtol=1e-5, atol=1e-4)
    s = run.summary
    assert set(s) >= {"keywords/acc", "keywords/acc_norm", "words/acc", "words/ppl"}
    assert 0 <= s["keywords/acc"] <= 1 and s["words/ppl"] > 1
    assert re.search(r"zoo: result: .*keywords acc \d+\.\d% \(acc_norm \d+\.\d%\), words acc \d+\.\d% \(ppl ", run.stdout)


@pytest.mark.parametrize("family, layout", [("llama", "zero3"), ("llama", "tp2"), ("gpt", "tp2-sp"), ("gpt", "pp2"),
                                            ("gpt", "3d"), ("llama", "pp2"), ("llama", "cp2"), ("llama", "cp2-pp2"),
                                            ("llama", "3d")])
def test_every_layout_scores_as_one_process(scored, family, layout):
    one, run = scored(family, "one"), scored(family, layout)
    keys = ("keywords/acc", "keywords/acc_norm", "words/acc")
    assert {k: run.summary[k] for k in keys} == {k: one.summary[k] for k in keys}
    assert run.summary["words/ppl"] == pytest.approx(one.summary["words/ppl"], rel=1e-5)
    a, b = _rows(one), _rows(run)
    assert [(r["task"], r["example"], r["choice"], r["tokens"], r["greedy"]) for r in a] == \
        [(r["task"], r["example"], r["choice"], r["tokens"], r["greedy"]) for r in b]
    torch.testing.assert_close(torch.tensor([r["loglikelihood"] for r in b], dtype=torch.float64),
                               torch.tensor([r["loglikelihood"] for r in a], dtype=torch.float64),
                               rtol=1e-5, atol=1e-4)


def test_the_history_goes_on_after_a_resume_and_best_follows_a_task(run_zoo, tasks, tmp_path):
    """Evaluations at steps 2, 4, 6: stopped at 4 and resumed, the records of 2 and 4 stay and 6
    joins them; checkpoint.best holds the step of the highest keywords/acc (earliest of equals)."""
    train = ["model=gpt", "debug=fast", *COMMON, "trainer.micro_batch_size=4", "trainer.eval_every=2", "optim.warmup_steps=1",
             "optim.decay_steps=6", "checkpoint.every=2", "checkpoint.best=true",
             f"trainer.eval_tasks=[{tasks[0]}]", "trainer.eval_metric=keywords/acc"]
    run_dir = tmp_path / "run"
    run_zoo(*train, "trainer.max_steps=4", run_dir=run_dir)
    resumed = run_zoo(*train, "trainer.max_steps=6", "resume=auto", run_dir=run_dir)
    evals = {m["step"]: m["keywords/acc"] for m in resumed.metrics if "keywords/acc" in m}
    assert list(evals) == [2, 4, 6]
    assert sorted(p.name for p in (run_dir / "tasks").iterdir()) == [f"step_{s:07d}.jsonl" for s in (2, 4, 6)]
    s = resumed.summary
    best_step = max(evals, key=lambda k: (evals[k], -k))
    assert (s["best_eval_metric"], s["best_eval_value"], s["best_eval_step"]) == ("keywords/acc", evals[best_step],
                                                                                   best_step)
    best = json.loads((run_dir / "checkpoints" / "best" / "state.json").read_text())
    assert best["step"] == best_step and best["eval"]["metric"] == "keywords/acc"


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_zoo_evaluate_runs_the_harness_on_the_run_and_agrees_with_the_loop(scored, tasks, random_hf, family, tmp_path):
    """python -m zoo.evaluate exports the run and runs lm-evaluation-harness's HFLM on it: the same
    metrics as the in-loop scorer on the same weights; the harness's own per-request
    log-likelihoods on the imported transformers model equal the run's rows within 1e-5."""
    from lm_eval.api.instance import Instance

    from zoo.evaluate.harness import harness_model

    run = scored(family, "one")
    out = tmp_path / "harness.json"
    proc = run_zoo_eval(run.run_dir, f"{tasks[0]},{tasks[1]}", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())["metrics"]
    keys = ("keywords/acc", "keywords/acc_norm", "words/acc")
    assert {k: got[k] for k in keys} == {k: run.summary[k] for k in keys}
    assert got["words/ppl"] == pytest.approx(run.summary["words/ppl"], rel=1e-5)
    assert "keywords/acc" in proc.stdout and not list(run.run_dir.glob(".zoo_eval_*"))  # the export is gone
    # the harness on the imported transformers directory itself, with the run's tokenizer
    hf = tmp_path / "hf"
    hf.mkdir()
    for f in random_hf[family].iterdir():
        (hf / f.name).symlink_to(f)
    for f in (run.run_dir / "tokenizer").iterdir():
        (hf / f.name).symlink_to(f)
    lm = harness_model(hf, 8, None)
    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(r["context"], c), idx=0)
                for path in tasks for r in map(json.loads, path.read_text().splitlines())
                for c in r.get("choices", [r.get("continuation")])]
    theirs = [ll for ll, _ in lm.loglikelihood(requests)]
    torch.testing.assert_close(torch.tensor([r["loglikelihood"] for r in _rows(run)], dtype=torch.float64),
                               torch.tensor(theirs, dtype=torch.float64), rtol=1e-5, atol=1e-4)


def run_zoo_eval(src, tasks, out, *extra):
    import subprocess
    import sys

    from tests.conftest import REPO

    return subprocess.run([sys.executable, "-m", "zoo.evaluate", str(src), "--tasks", tasks, "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_zoo_evaluate_mistakes_are_one_line(tmp_path, tasks):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    cases = [(tmp_path / "none", "python_keywords", "does not exist: give a run directory"),
             (tmp_path / "bert", "python_keywords", "holds a bert model (bert), which continues no text"),
             (tmp_path / "bert", "nosuch", "--tasks: 'nosuch' is neither a built-in task")]
    for src, names, says in cases:
        proc = run_zoo_eval(src, names, tmp_path / "out.json")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and not (tmp_path / "out.json").exists()


def test_few_shot_contexts_are_the_same_in_the_loop_and_the_harness(run_zoo, random_hf, tmp_path):
    """trainer.eval_task_shots=2 (python_keywords' own train split) and zoo.evaluate --shots 2
    with the run's seed build the same contexts: the same metrics from both."""
    run = run_zoo("model=gpt", f"model.init_from={random_hf['gpt']}", "trainer.max_steps=0", *COMMON,
                  *LAYOUTS["one"], "trainer.eval_tasks=[python_keywords]", "trainer.eval_task_shots=2")
    rows = _rows(run)  # a keyword's 160-character context is about 40 tokens; two shots fill the block
    assert len(rows) == 800 and sorted(r["context_tokens"] for r in rows)[400] > 100
    out = tmp_path / "harness.json"
    proc = run_zoo_eval(run.run_dir, "python_keywords", out, "--shots", "2", "--seed", "1234")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["shots"] == 2 and got["metrics"] == {k: run.summary[k] for k in got["metrics"]}

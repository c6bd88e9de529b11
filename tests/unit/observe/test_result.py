"""The block a finished run ends with (zoo.observe.result) and the console line's number formats."""
from __future__ import annotations

from zoo.observe.metrics import console_line
from zoo.observe.result import result_lines

GPT = {"final_loss": 4.1, "eval_loss": 4.0, "eval_perplexity": 54.6, "unigram_perplexity": 631.5,
       "sample_prompt": "The for", "sample": "The for statement\nloops", "tokens_per_s": 4627.9,
       "samples_per_s": 36.2, "mfu": 0.249, "steps": 200, "peak_mem_bytes": 457363456, "wall_time_s": 81.3}


def test_a_finished_run_states_its_result_where_it_is_and_what_next(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "checkpoints").mkdir()
    lines = result_lines(GPT, tmp_path, resumable=True)
    assert lines[0] == "zoo: result: eval loss 4.0000, perplexity 54.6 (unigram 631.5)"
    assert lines[1] == ("zoo: run: 200 steps, 81.3 s from the first step to the end, 4,628 tokens/s, MFU 24.9%, "
                        "peak memory 0.43 GiB")
    # the sample as text, one indented line per line, not a repr with \n escapes
    assert lines[2:5] == ["zoo: sample (prompt 'The for'):", "    The for statement", "    loops"]
    assert lines[5] == f"zoo: run directory {tmp_path}: model.safetensors (weights), checkpoints/ (checkpoints)"
    assert lines[6] == f"zoo: next: python -m zoo.export {tmp_path} {tmp_path}/hf"
    assert any("resume=auto" in line for line in lines[7:])
    # no "continue" line where the run left no checkpoint of its last step to continue from
    assert not any("resume=auto" in line for line in result_lines(GPT, tmp_path))
    # no export line for a family without a Hugging Face form
    assert not any("zoo.export" in line for line in result_lines(GPT, tmp_path, export=False))


def test_each_family_states_its_own_metric_and_no_evaluation_is_said(tmp_path):
    bert = {"eval_loss": 2.5, "eval_accuracy": 0.31, "baseline_accuracy": 0.05, "eval_masked_tokens": 900,
            "tokens_per_s": 100.0, "samples_per_s": 1.0}
    assert result_lines(bert, tmp_path)[0] == ("zoo: result: eval loss 2.5000, masked-token accuracy 31.0% "
                                               "(baseline 5.0%)")
    cnn = {"eval_loss": 0.2, "eval_accuracy": 0.95, "majority_class_accuracy": 0.1, "samples_per_s": 50.0,
           "tokens_per_s": 50.0}
    lines = result_lines(cnn, tmp_path)
    assert lines[0] == "zoo: result: eval loss 0.2000, top-1 accuracy 95.0% (baseline 10.0%)"
    assert "50.0 samples/s" in lines[1]
    assert result_lines({"final_loss": 3.0}, tmp_path)[0] == "zoo: result: no evaluation (trainer.eval_batches=0)"


def test_console_numbers_have_one_precision():
    base = {"step": 1, "loss": 1.0, "lr": 1e-3, "tokens_per_s": 10.0, "samples_per_s": 1.0, "step_time_s": 0.1}
    line = console_line({**base, "grad_norm": 1.0, "comm_share": 0.01, "data_wait_share": 0.002})
    assert "gnorm 1.00" in line and "comm 1.0%" in line and "data wait 0.2%" in line
    assert "gnorm 0.797" in console_line({**base, "grad_norm": 0.797})


def test_a_resumed_run_counts_its_own_steps_and_the_peak_names_the_largest_rank(tmp_path):
    """#49: a start that resumed at step 44 and ran to 80 says 36 steps, not 80; the peak is
    the largest rank's, named, where there are several."""
    resumed = {**GPT, "steps": 80, "steps_run": 36, "peak_mem_bytes": 2**30, "peak_mem_rank": 3,
               "peak_mem_bytes_per_rank": [2**29, 2**29, 2**29, 2**30]}
    line = result_lines(resumed, tmp_path)[1]
    assert line.startswith("zoo: run: 36 steps (steps 45-80), 81.3 s from the first step to the end")
    assert line.endswith("peak memory 1.00 GiB (rank 3, the largest of 4)")
    one_rank = {**GPT, "steps_run": 200, "peak_mem_bytes_per_rank": [457363456], "peak_mem_rank": 0}
    assert result_lines(one_rank, tmp_path)[1] == result_lines(GPT, tmp_path)[1]  # nothing to name with one rank


def test_task_metrics_are_stated_on_the_console_the_result_and_compare(tmp_path):
    """trainer.eval_tasks: one short field a task on the console, acc with acc_norm or ppl in the
    result, a row a metric in zoo.compare; the best by a task's metric named as such."""
    from zoo.compare import Run, table

    tasks = {"keywords/acc": 0.31, "keywords/acc_norm": 0.14, "words/acc": 0.05, "words/ppl": 812.25}
    line = console_line({"step": 4, "eval_loss": 8.26, "eval_time_s": 2.2, **tasks})
    assert line == "step      4 | eval loss 8.2600 | keywords 31.0% | words 5.0% | eval 2.2 s"
    s = {**GPT, **tasks, "best_eval_metric": "keywords/acc", "best_eval_value": 0.4, "best_eval_step": 100}
    lines = result_lines(s, tmp_path)
    assert lines[0].endswith("(unigram 631.5), keywords acc 31.0% (acc_norm 14.0%), words acc 5.0% (ppl 812.2)")
    assert "zoo: best keywords/acc 0.4000 at step 100 (the final one is below it)" in lines
    text = table([Run("a", {"x": 1}, s, []), Run("b", {"x": 2}, GPT, [])])
    assert any(row.split()[:3] == ["keywords/acc", "31.0%", "-"] for row in text.splitlines()), text
    assert any(row.split()[:2] == ["words/ppl", "812.25"] for row in text.splitlines()), text

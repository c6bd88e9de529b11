"""zoo's task files scored by lm-evaluation-harness's own model backend (`HFLM`) on a
transformers directory (an export): the harness computes every request's log-likelihood and
greedy match, offline, and the metrics are computed from them as the in-loop scorer computes
its (zoo.evaluate.in_loop.TaskScorer.metrics), so the two compare number for number."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

from zoo.evaluate.tasks import Task
from zoo.run.errors import ConfigError

INSTALL = "pip install 'lm_eval[hf]'"


def harness_model(directory: Path, batch_size: int, max_length: int | None):
    """lm-evaluation-harness's HFLM over the transformers directory, on the CPU or the GPU."""
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError as err:
        raise ConfigError(f"python -m zoo.evaluate runs lm-evaluation-harness, which this environment lacks "
                          f"({err}): {INSTALL}") from None
    import torch

    return HFLM(pretrained=str(directory), device="cuda" if torch.cuda.is_available() else "cpu",
                batch_size=batch_size, max_length=max_length)


def harness_rows(lm, tasks: Sequence[Task]) -> List[tuple]:
    """(log-likelihood, greedy) of every (example, choice) of `tasks`, in the in-loop scorer's order."""
    from lm_eval.api.instance import Instance

    requests = [Instance(request_type="loglikelihood", doc={}, arguments=(example.context, choice), idx=c)
                for task in tasks for example in task.examples for c, choice in enumerate(example.choices)]
    return [(float(ll), bool(greedy)) for ll, greedy in lm.loglikelihood(requests)]


def harness_metrics(tasks: Sequence[Task], rows: List[tuple]) -> Dict[str, float]:
    import torch

    from zoo.evaluate.in_loop import task_metrics

    return task_metrics(tasks, torch.tensor([[ll, 0.0, float(greedy)] for ll, greedy in rows], dtype=torch.float64))

"""Downstream tasks scored at every evaluation (trainer.eval_tasks), on the distributed model
in place: every layout scores the same rows and gets the same numbers as one process.

Each (example, choice) is one row, split as lm-evaluation-harness's HFLM splits it: spaces
that end the context move to the start of the choice; the context and context + choice are
encoded without special tokens, and the choice's tokens are those of the whole past the
context's; the row is the last block_size + 1 tokens of context + choice (the harness's left
truncation), its targets the choice's tokens (-100 elsewhere). Rows go longest first to the
data-parallel ranks in rounds of one micro-batch each, as the held-out evaluation deals its
samples, the last round filled with rows that have no target; a round's micro-batches are as
wide as its longest row and hold a training micro-batch's tokens (under a pipeline, whose
stages exchange one activation shape, the training's micro-batch of whole blocks).
The forward's loss function records each row's log-likelihood, target count and greedy match
(zoo.evaluate.likelihood) on the last stage's first tensor-parallel rank, and one all-reduce
of a float64 (rows x 3) table brings every row to every rank: O(rows), not O(model).

Metrics, as the harness computes them: a multiple-choice task's `acc` (the choice of highest
summed log-likelihood is the gold one) and `acc_norm` (the same per character of the choice);
a continuation task's `acc` (every token of the continuation is the greedy one) and `ppl`
(exp of minus the mean log-likelihood of an example's continuation)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist

from zoo.evaluate.likelihood import LikelihoodTally
from zoo.evaluate.tasks import CHOICE, Task
from zoo.models.losses import IGNORE
from zoo.run.errors import DataError


def split_request(context: str, continuation: str) -> Tuple[str, str]:
    """The harness's split: trailing spaces of the context start the continuation."""
    spaces = len(context) - len(context.rstrip())
    return (context[:-spaces], context[-spaces:] + continuation) if spaces else (context, continuation)


def encode_row(encode: Callable[[str], List[int]], context: str, continuation: str,
               block_size: int) -> Tuple[List[int], int]:
    """(tokens, index of the first continuation token) of one request, cut to block_size + 1."""
    context, continuation = split_request(context, continuation)
    head = encode(context)
    tail = encode(context + continuation)[len(head):]  # the choice's tokens, as the harness takes them
    if not tail:
        raise ValueError(f"the continuation {continuation!r} encodes to no token after its context")
    whole = head + tail
    keep = whole[-(block_size + 1):]
    return keep, max(1, len(head) - (len(whole) - len(keep)))


class TaskScorer:
    """The rows of `tasks`, encoded once; `score(forward, ...)` runs them (collective)."""

    def __init__(self, tasks: Sequence[Task], encode: Callable[[str], List[int]], block_size: int,
                 pad_id: int = 0):
        self.tasks, self.block_size, self.pad_id = list(tasks), block_size, pad_id
        self.rows: List[Tuple[List[int], int]] = []
        self.spans: List[Tuple[int, int]] = []  # each task's rows: [start, stop)
        for task in self.tasks:
            start = len(self.rows)
            for number, example in enumerate(task.examples, 1):
                for choice in example.choices:
                    try:
                        self.rows.append(encode_row(encode, example.context, choice, block_size))
                    except ValueError:
                        raise DataError(f"task {task.name}, example {number}: the choice {choice!r} encodes to no "
                                        f"token past its context (the tokenizer merges it into the context's last "
                                        f"word, ...{example.context[-20:]!r}): start choices and continuations at a "
                                        f"word's start, with their leading space") from None
            self.spans.append((start, len(self.rows)))
        self.longest = max(len(tokens) - 1 for tokens, _ in self.rows)

    def batches(self, micro_batch: int, dp_rank: int, dp_size: int, pad_to: int | None = None,
                multiple: int = 1) -> Tuple[List[Tuple[torch.Tensor, torch.Tensor]], List[int]]:
        """This rank's micro-batches and the row of each of their samples (-1: a filler). Rows go
        longest first (as the harness orders them) in rounds of one micro-batch a data-parallel
        rank; a round's micro-batches are as wide as its longest row and hold as many tokens as
        one of the training's (`micro_batch` blocks): short rows go several to a block's slot, so
        scoring keeps the memory of an evaluation batch of the loss and takes fewer forwards.
        `pad_to` (a pipeline's one activation shape): every micro-batch `micro_batch` x pad_to;
        `multiple`: widths rounded up to it (sequence parallelism splits the sequence over tp)."""
        order = sorted(range(len(self.rows)), key=lambda i: -len(self.rows[i][0]))
        out, owners, at = [], [], 0
        while at < len(order):
            width = pad_to or -(-(len(self.rows[order[at]][0]) - 1) // multiple) * multiple
            rows = micro_batch if pad_to else max(micro_batch, micro_batch * self.block_size // width)
            x = torch.full((rows, width), self.pad_id, dtype=torch.long)
            y = torch.full((rows, width), IGNORE, dtype=torch.long)
            for k in range(rows):
                position = at + dp_rank * rows + k
                if position >= len(order):
                    owners.append(-1)
                    continue
                tokens, first = self.rows[order[position]]
                t = torch.tensor(tokens, dtype=torch.long)
                x[k, :len(t) - 1] = t[:-1]
                y[k, first - 1:len(t) - 1] = t[first:]
                owners.append(order[position])
            out.append((x, y))
            at += rows * dp_size
        return out, owners

    def gather(self, tally: LikelihoodTally, owners: List[int], observed: bool, device: torch.device) -> torch.Tensor:
        """Every row's (log-likelihood, tokens, greedy) on every rank: the rows this rank observed
        (`observed`: the last stage's first tensor-parallel rank) summed over the job."""
        table = torch.zeros(len(self.rows), 3, dtype=torch.float64, device=device)
        if observed:
            got = torch.cat(tally.rows) if tally.rows else torch.zeros(0, 3, dtype=torch.float64)
            if len(got) != len(owners):
                raise RuntimeError(f"in-loop tasks: {len(got)} rows observed for {len(owners)} sent")
            mine = torch.tensor([o >= 0 for o in owners])
            table[torch.tensor([o for o in owners if o >= 0], dtype=torch.long)] = got[mine].to(device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(table)
        return table.cpu()

    def write_rows(self, table: torch.Tensor, path: Path) -> None:
        """One line a row: task, example, choice, log-likelihood, tokens scored, greedy (what the
        harness's --log_samples keeps), and the context's tokens kept (after the block's cut), so
        that two runs or a harness run compare row by row."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for task, (start, _) in zip(self.tasks, self.spans):
            at = start
            for e, example in enumerate(task.examples):
                for c in range(len(example.choices)):
                    ll, tokens, greedy = table[at].tolist()
                    lines.append(json.dumps({"task": task.name, "example": e, "choice": c, "loglikelihood": ll,
                                             "tokens": int(tokens), "greedy": bool(greedy),
                                             "context_tokens": self.rows[at][1]}))
                    at += 1
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)

    def metrics(self, table: torch.Tensor) -> Dict[str, float]:
        return task_metrics(self.tasks, table)

def task_metrics(tasks: Sequence[Task], table: torch.Tensor) -> Dict[str, float]:
    """{"TASK/acc": ..., "TASK/acc_norm" or "TASK/ppl": ...} from every row's (log-likelihood,
    tokens, greedy), the rows of `tasks` in order (every example's choices)."""
    out: Dict[str, float] = {}
    at = 0
    for task in tasks:
        hits, normed, lls = 0, 0, []
        for example in task.examples:
            values = table[at:at + len(example.choices)]
            at += len(example.choices)
            if task.kind == CHOICE:
                ll = values[:, 0]
                chars = torch.tensor([float(len(c)) for c in example.choices], dtype=torch.float64)
                hits += int(int(ll.argmax()) == example.gold)
                normed += int(int((ll / chars).argmax()) == example.gold)
            else:
                hits += int(values[0, 2] == 1)
                lls.append(float(values[0, 0]))
        n = len(task.examples)
        out[f"{task.name}/acc"] = hits / n
        if task.kind == CHOICE:
            out[f"{task.name}/acc_norm"] = normed / n
        else:
            out[f"{task.name}/ppl"] = math.exp(-sum(lls) / n)
    return out


def task_scorer(cfg, task) -> "TaskScorer | None":
    """The run's scorer of trainer.eval_tasks (validated before any rank started), or None."""
    if not cfg.trainer.eval_tasks:
        return None
    from zoo.evaluate.tasks import shot_tasks

    t = cfg.trainer
    return TaskScorer(shot_tasks([str(e) for e in t.eval_tasks], t.eval_task_shots, t.seed),
                      _encoder(task.tokenizer), task.shape.block_size)


def _encoder(tok) -> Callable[[str], List[int]]:
    """Text -> token ids without special tokens: with `tokenizers` from the directory's
    tokenizer.json where there is one (the ids transformers' fast tokenizer gives, without
    importing transformers into every rank for the whole run: 35 MB of RSS a rank on this
    machine), else through the transformers tokenizer."""
    directory = getattr(tok, "directory", None)  # data_pipelines.tokenizer.LazyTokenizer's
    if directory and (Path(directory) / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        fast = Tokenizer.from_file(str(Path(directory) / "tokenizer.json"))
        return lambda text: fast.encode(text, add_special_tokens=False).ids
    return lambda text: list(tok(text, add_special_tokens=False)["input_ids"])


def score(scorer: TaskScorer, forward: Callable, *, micro_batch: int, dp_rank: int, dp_size: int,
          pad_to: int | None, multiple: int, tp_group, device: torch.device, to_device: Callable,
          rows_file: Path | None = None, cp_rank: int = 0) -> Dict[str, float]:
    """The tasks' metrics, the same on every rank (collective): `forward(batches, tally)` runs
    this rank's micro-batches through the model with `tally` observing its loss function.
    `rows_file` (rank 0's): every row's values as JSON Lines (`TaskScorer.write_rows`). Under
    context parallelism the forward runs whole sequences on every rank of a cp group (the task's
    contexts are short) and its first rank (`cp_rank` 0) reports them."""
    batches, owners = scorer.batches(micro_batch, dp_rank, dp_size, pad_to, multiple)
    tally = LikelihoodTally(tp_group)
    forward([to_device(b) for b in batches], tally)
    first_tp = (tp_group is None or dist.get_rank(tp_group) == 0) and cp_rank == 0
    table = scorer.gather(tally, owners, bool(tally.rows) and first_tp, device)
    if rows_file is not None:
        scorer.write_rows(table, rows_file)
    return scorer.metrics(table)

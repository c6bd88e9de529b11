"""Compare runs side by side.

    python -m zoo.compare RUN_DIR... [--plot FILE.png] [--labels A,B,...]
    python -m zoo.compare outputs/gpt-tiny/* --plot runs.png

One table with a column per run, headed by what tells the runs apart (the layout, the other
differing keys; `--labels` names them), then the run directories (the shortest path ends
that differ), the config keys that differ between the runs (from each run's config.yaml),
and what the runs achieved (summary.json): final and held-out loss, throughput, MFU, peak
memory, the shares of communication and data wait, wall time.
`--plot` draws the loss curves and the throughput of every run (metrics.jsonl) in one PNG.
An argument that is not a directory but a wandb run path (ENTITY/PROJECT/RUN_ID) is read
through wandb's API, which needs the network and credentials.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

# (summary key, row label, format)
RESULTS = [
    ("final_loss", "final loss", "{:.4f}"),
    ("eval_loss", "eval loss", "{:.4f}"),
    ("eval_perplexity", "eval perplexity", "{:.2f}"),
    ("eval_accuracy", "eval accuracy", "{:.2%}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("samples_per_s", "samples/s", "{:,.1f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("peak_mem_bytes", "peak memory GiB", None),  # the largest rank's
    ("peak_mem_rank", "peak memory rank", "{}"),
    ("peak_mem_share", "peak memory share", "{:.1%}"),
    ("comm_share", "communication share", "{:.1%}"),
    ("data_wait_share", "data wait share", "{:.1%}"),
    ("padding_efficiency", "padding efficiency", "{:.3f}"),
    ("steps", "steps", "{}"),
    ("wall_time_s", "wall time s", "{:.1f}"),
]


def task_results(runs: List["Run"]) -> list:
    """RESULTS' rows of trainer.eval_tasks' metrics (TASK/acc, TASK/acc_norm, TASK/ppl) in any run."""
    keys = sorted({k for r in runs for k in r.summary if "/" in k and not k.startswith("best")})
    return [(k, k, "{:,.2f}" if k.endswith("/ppl") else "{:.1%}") for k in keys]


@dataclass
class Run:
    name: str
    config: Dict[str, Any]  # flattened: "optim.lr" -> 0.001
    summary: Dict[str, Any]
    history: List[Dict[str, Any]]  # metrics.jsonl records


def flatten(tree: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def load_dir(path: Path) -> Run:
    if not (path / "config.yaml").exists():
        raise ValueError(f"{path} is not a run directory (no config.yaml)")
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").exists() else {}
    metrics = path / "metrics.jsonl"
    history = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    harness = path / "eval" / "harness.json"  # python -m zoo.evaluate's, beside the run's own task metrics
    if harness.exists():
        summary.update({f"harness {k}": v for k, v in json.loads(harness.read_text()).get("metrics", {}).items()})
    return Run(path.name, flatten(yaml.safe_load((path / "config.yaml").read_text()) or {}), summary, history)


def load_wandb(run_path: str) -> Run:
    """A run logged online, by its wandb path ENTITY/PROJECT/RUN_ID."""
    import wandb

    run = wandb.Api().run(run_path)
    history = [row for row in run.scan_history() if "loss" in row]
    for row in history:
        row.setdefault("step", row.get("_step"))
    return Run(run.name, flatten(dict(run.config)), dict(run.summary), history)


def load(arg: str) -> Run:
    path = Path(arg)
    if path.is_dir():
        return load_dir(path)
    if not path.exists() and arg.count("/") == 2:
        return load_wandb(arg)
    raise ValueError(f"{arg} is neither a run directory nor a wandb run path (ENTITY/PROJECT/RUN_ID)")


def differing_keys(runs: List[Run]) -> List[str]:
    keys = sorted(set().union(*(r.config for r in runs)))
    return [k for k in keys if len({json.dumps(r.config.get(k, "<unset>"), sort_keys=True) for r in runs}) > 1]


LABEL_KEYS = 3  # differing keys named in a run's label at most


def _layout(r: Run) -> Optional[str]:
    s = r.summary
    if all(k in s for k in ("tp", "pp", "dp", "zero_stage")):
        return f"tp{s['tp']}-pp{s['pp']}-dp{s['dp']}_zero{s['zero_stage']}"
    c = r.config
    if "parallel.tp" in c:
        return f"tp{c.get('parallel.tp')}-pp{c.get('parallel.pp')}-dp{c.get('parallel.dp')}_zero{c.get('parallel.zero_stage')}"
    return None


def labels(runs: List[Run]) -> List[str]:
    """Each run named by what differs: its layout when a parallel key differs, then the other
    differing keys (`tp2-pp1-dp1_zero0 lr=0.0003`); the directory name where nothing differs
    or the labels would collide."""
    diff = differing_keys(runs)
    parallel = any(k.startswith("parallel.") for k in diff)
    others = [k for k in diff if not k.startswith("parallel.")][:LABEL_KEYS]
    out = []
    for r in runs:
        parts = ([_layout(r) or ""] if parallel else []) + [f"{k.split('.')[-1]}={r.config.get(k, '<unset>')}"
                                                            for k in others]
        out.append(" ".join(p for p in parts if p) or r.name)
    if len(set(out)) < len(out):
        out = [f"{label} ({r.name})" if label != r.name else label for label, r in zip(out, runs)]
    return out


def _cell(value: Any, fmt: Optional[str]) -> str:
    if value is None:
        return "-"
    if fmt is None:  # bytes
        return f"{value / 2**30:.2f}"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):  # "nan", or a type the format does not take
        return str(value)


def short_names(paths: List[str]) -> List[str]:
    """The shortest path ends that tell the paths apart (`a/run`, `b/run`), not whole paths."""
    parts = [Path(p).resolve().parts if Path(p).exists() else Path(p).parts for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return list(paths)


def table(runs: List[Run], heads: Optional[List[str]] = None) -> str:
    """The side-by-side table (plain text, one column per run, headed by `heads` or `labels`)."""
    heads = heads or labels(runs)
    rows = [("config (differing keys)", None)]
    rows += [(k, [str(r.config.get(k, "<unset>")) for r in runs]) for k in differing_keys(runs)] or [
        ("(none: the runs share one config)", ["" for _ in runs])]
    rows.append(("results", None))
    for key, label, fmt in RESULTS + task_results(runs):
        if any(key in r.summary for r in runs):
            rows.append((label, [_cell(r.summary.get(key), fmt) for r in runs]))
    rows.insert(0, ("run", [r.name for r in runs]))
    width0 = max(len(label) for label, _ in rows)
    widths = [max([len(h)] + [len(cells[i]) for _, cells in rows if cells]) for i, h in enumerate(heads)]
    lines = ["  ".join([" " * width0] + [h.rjust(w) for h, w in zip(heads, widths)])]
    for label, cells in rows:
        if cells is None:
            lines.append(f"-- {label} --")
        else:
            lines.append("  ".join([label.ljust(width0)] + [c.rjust(w) for c, w in zip(cells, widths)]))
    return "\n".join(lines)


def plot(runs: List[Run], path: Path, heads: Optional[List[str]] = None) -> None:
    """Loss and tokens/s against the step, one line per run, in one PNG."""
    import matplotlib.pyplot as plt

    fig = figure(runs, heads)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(runs: List[Run], heads: Optional[List[str]] = None):
    """The plot's figure: one legend for both panels, below them, where it covers no curve and
    no axis label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, speed_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r, label in zip(runs, heads or labels(runs)):
        train = [m for m in r.history if "loss" in m]
        steps = [m["step"] for m in train]
        line, = loss_ax.plot(steps, [float(m["loss"]) for m in train], marker=".", label=label)
        evals = [m for m in r.history if "eval_loss" in m]
        if evals:  # periodic evaluation: dashed, in the run's colour
            loss_ax.plot([m["step"] for m in evals], [float(m["eval_loss"]) for m in evals], linestyle="--",
                         marker="x", color=line.get_color(), label=f"{label} (eval)")
        speed_ax.plot(steps, [m.get("tokens_per_s", float("nan")) for m in train], marker=".", color=line.get_color())
    loss_ax.set(xlabel="step", ylabel="loss", title="loss (dashed: held-out, x)")
    speed_ax.set(xlabel="step", ylabel="tokens/s", title="throughput")
    for ax in (loss_ax, speed_ax):
        ax.grid(alpha=0.3)
    handles, names = loss_ax.get_legend_handles_labels()
    if names:
        _legend_below(fig, handles, names)
    else:
        fig.tight_layout()
    return fig


def _legend_below(fig, handles, names) -> None:
    """One legend under both panels that fits the figure's width: long labels wrapped, then
    fewer columns until its measured width fits; the panels shrink to leave its measured height."""
    import textwrap

    names = [textwrap.fill(n, LEGEND_LABEL_CHARS) for n in names]
    renderer = fig.canvas.get_renderer()
    width, height = fig.get_size_inches() * fig.dpi
    for columns in range(min(len(names), 4), 0, -1):
        legend = fig.legend(handles, names, loc="lower center", ncol=columns, fontsize="small", frameon=False)
        box = legend.get_window_extent(renderer)
        if box.width <= 0.98 * width or columns == 1:
            break
        legend.remove()
    fig.tight_layout(rect=(0, min(0.6, (box.height + 6) / height), 1, 1))


LEGEND_LABEL_CHARS = 60  # a label's line in the legend, at most


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m zoo.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (or wandb run paths ENTITY/PROJECT/RUN_ID)")
    parser.add_argument("--plot", type=Path, help="write loss curves and throughput to this PNG")
    parser.add_argument("--labels", help="comma-separated names for the runs, in their order (default: what differs)")
    args = parser.parse_args(argv)
    heads = None
    if args.labels is not None:
        heads = [h.strip() for h in args.labels.split(",")]
        if len(heads) != len(args.runs) or not all(heads):
            print(f"zoo.compare: error: --labels={args.labels} names {len(heads)} run(s) but {len(args.runs)} are "
                  f"compared; give one non-empty label per run, comma-separated, in their order", file=sys.stderr)
            raise SystemExit(2)
    try:
        runs = [load(a) for a in args.runs]
    except ValueError as err:
        print(f"zoo.compare: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if len({r.name for r in runs}) < len(runs):  # e.g. .../a/run and .../b/run: a/run and b/run
        for r, name in zip(runs, short_names(args.runs)):
            r.name = name
    print(table(runs, heads))
    if args.plot:
        plot(runs, args.plot, heads)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()

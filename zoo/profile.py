"""The time breakdown of a run that profiled (trainer.profile.start=S), or of two side by side.

    python -m zoo.profile RUN_DIR            # per rank: forward, backward, optimizer, each
                                             # collective, data wait, idle; the spread; diagnoses
    python -m zoo.profile RUN_A RUN_B        # mean over ranks, ms a step, A vs B
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from zoo.observe.breakdown import KINDS


def load_summary(path: str) -> dict:
    """RUN_DIR/profile/summary.json (or a summary.json, or the directory holding one)."""
    p = Path(path).expanduser()
    for candidate in (p / "profile" / "summary.json", p / "summary.json", p):
        if candidate.is_file():
            try:
                summary = json.loads(candidate.read_text())
            except (OSError, json.JSONDecodeError) as err:
                raise ValueError(f"{candidate} is not readable JSON ({type(err).__name__})") from None
            if "ranks" in summary:
                return summary
    if config := next((c for c in (p / "config.yaml",) if c.is_file()), None):
        raise ValueError(f"{path} is a run that did not profile ({config.parent / 'profile'} has no summary.json); "
                         f"run it with trainer.profile.start=S (e.g. 3) trainer.profile.steps=K")
    raise ValueError(f"{path}: no profile summary here; give a run directory that ran with trainer.profile.start=S")


def side_by_side(a: dict, b: dict, names: List[str]) -> List[str]:
    def mean(summary, kind=None):
        rows = summary["ranks"]
        return sum((r["ms"].get(kind, 0.0) if kind else r["step_ms"]) for r in rows) / len(rows)  # a kind it predates: 0

    lines = [f"A: {names[0]}", f"B: {names[1]}", f"{'ms a step (mean over ranks)':<28}{'A':>10}{'B':>10}{'B / A':>8}"]
    for kind in ("step", *KINDS):
        x, y = (mean(a), mean(b)) if kind == "step" else (mean(a, kind), mean(b, kind))
        if kind != "step" and max(x, y) < 0.05:
            continue
        ratio = f"{y / x:.2f}x" if x > 0 else "-"
        lines.append(f"{kind:<28}{x:>10.1f}{y:>10.1f}{ratio:>8}")
    lines.append(f"{'ranks':<28}{len(a['ranks']):>10}{len(b['ranks']):>10}")
    return lines


def main(argv: Optional[List[str]] = None) -> None:
    from zoo.observe.profiler import table_lines

    parser = argparse.ArgumentParser(prog="python -m zoo.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="one or two run directories that profiled")
    args = parser.parse_args(argv)
    if len(args.runs) > 2:
        print(f"zoo.profile: error: {len(args.runs)} runs given; give one (its breakdown) or two (side by side)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        summaries = [load_summary(r) for r in args.runs]
    except ValueError as err:
        print(f"zoo.profile: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    if len(summaries) == 1:
        lines = table_lines(summaries[0]) + [f"zoo: diagnosis: {d}" for d in summaries[0]["diagnoses"]]
    else:
        lines = side_by_side(*summaries, names=args.runs)
    print("\n".join(lines))


if __name__ == "__main__":
    main()

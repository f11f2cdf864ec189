"""How often the advisor's dry run picks what its real runs picked: every committed advice (results/advise/*/
advice.json) planned again, theory only, with today's time model (studies/advise/step_times.py), and its first choice
set beside the measured winner, and beside the first choice of the plan the advice was made with.

    python -m harness advise-agreement [--advice results/advise] [--out results/advise/agreement.md]

A choice agrees on the backend (the question a user asks: which strategy) and on the candidate (backend,
micro-batch and checkpointing). The measured winner is among the candidates that were probed, which the plan of
the day chose; a dry-run first choice that was never probed is said so, not counted against it.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import List

from ...config import axes
from ...config.command_line import parse
from ...core.paths import results_dir
from ...core.rundir import write_text
from .search import plan


def first_fitting(candidates: List[dict]) -> dict:
    fitting = [c for c in candidates if c["fits"]]
    return min(fitting, key=lambda c: c["predicted_step_s"])


def compare(advice: dict) -> dict:
    """One advice: the measured winner, the plan-of-the-day's first choice, today's dry run's."""
    p = advice["plan"]
    backends = sorted({c["backend"] for c in p["candidates"]})
    # the same question as then: an advice made before a parallel axis was searched searched the flat mesh only
    flat = not any(c.get(name, 1) > 1 for c in p["candidates"] for name in axes.AXES)
    held = [f"parallelism.{name}=1" for name in axes.AXES if name not in axes.pinned(p["overrides"])]
    overrides = [*p["overrides"], *held] if flat else p["overrides"]
    today = plan(overrides, p["budget_bytes"], p["global_batch"], backends, p["margin"])
    ours = min(today.priced, key=lambda c: c.predicted_step_s)
    then = first_fitting(p["candidates"])
    winner = advice.get("winner")
    probed = {c["name"] for c in p["candidates"] if c.get("status")}
    return {"advice": advice["command"], "winner": winner, "then": then["name"], "today": ours.name,
            "today_backend_agrees": bool(winner) and ours.backend == winner.split("-mb")[0],
            "then_backend_agrees": bool(winner) and then["backend"] == winner.split("-mb")[0],
            "today_agrees": ours.name == winner, "then_agrees": then["name"] == winner,
            "today_probed": ours.name in probed, "time_model": today.rates.get("time_model", "")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness advise-agreement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--advice", default=str(results_dir("advise")))
    ap.add_argument("--out", default=str(results_dir("advise", "agreement.md")))
    args = parse("advise-agreement", ap, argv, takes_overrides=False)[0]
    rows = [compare(json.loads(path.read_text())) for path in sorted(Path(args.advice).glob("*/advice.json"))]
    n = len(rows)
    count = lambda key: sum(r[key] for r in rows)  # noqa: E731
    lines = ["# The advisor's dry run against its measured winners", "",
             f"`python -m harness advise-agreement`: {n} committed advice(s) in {args.advice}, each planned again "
             "with today's time model, theory only.", "",
             f"- today's dry run: the winner's backend {count('today_backend_agrees')} of {n}, the winning candidate "
             f"{count('today_agrees')} of {n}",
             f"- the plan the advice was made with: the winner's backend {count('then_backend_agrees')} of {n}, the "
             f"winning candidate {count('then_agrees')} of {n}", "",
             "| advice | measured winner | dry run then | dry run today | today's first was probed |",
             "|---|---|---|---|---|"]
    lines += [f"| `{r['advice']}` | {r['winner']} | {r['then']} | {r['today']} | {'yes' if r['today_probed'] else 'no'} |"
              for r in rows]
    models = sorted({re.sub(r"of \d+ replayed candidates", "of the replayed candidates", r["time_model"]) for r in rows})
    lines += ["", "Step times today: " + "; ".join(models), ""]
    write_text(Path(args.out), "\n".join(lines))
    print("\n".join(lines))
    return 0

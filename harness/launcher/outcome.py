"""Turn what the ranks left behind into the summary of a run that did not end ok.

Each rank writes its RankOutcome; a rank with no outcome file died without a report (a signal, the OOM
killer), and torchrun's log says how. The run's status is its worst rank's, and among equally bad ranks the
cause is named before its symptoms (RankOutcome.peer, a field the rank set, never a phrase matched here).
"""
from __future__ import annotations

import re
from typing import Dict, List

from ..core.records import Identity, RankOutcome, RunSummary, Status
from ..core.rundir import RunDir, read_json


def exit_codes(log_text: str) -> Dict[int, int]:
    """Per-rank exit codes from torchrun's failure report (`rank: R ... exitcode: C`)."""
    return {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log_text)}


def rank_outcomes(run_dir: RunDir, world: int) -> List[RankOutcome]:
    log = run_dir.launcher_log.read_text(errors="replace") if run_dir.launcher_log.exists() else ""
    codes = exit_codes(log)
    outcomes = []
    for rank in range(world):
        found = read_json(run_dir.rank_outcome(rank))
        outcomes.append(RankOutcome.from_dict(found) if found else RankOutcome.killed(rank, codes.get(rank)))
    return outcomes


def figures_reached(run_dir: RunDir, worst: RankOutcome) -> dict:
    """A failed run's figures: the steps it completed (metrics.jsonl), its last loss, and what the rank
    that caused the failure had reached (memory high-water marks; for an OOM, the bytes over budget)."""
    steps = run_dir.read_metrics()
    out = {"train/steps_completed": len(steps), **worst.reached}
    if steps:
        out["loss/last_loss"] = steps[-1].get("loss/loss")
    return out


def failure_summary(identity: Identity, run_dir: RunDir, world: int, returncode: int) -> RunSummary:
    outcomes = rank_outcomes(run_dir, world)
    worst = min(outcomes, key=RankOutcome.sort_key)
    if worst.status == Status.OK:
        reason = f"launcher exited with code {returncode} after every rank reported ok"
    else:
        reason = f"rank {worst.rank} {worst.status}: {worst.error} {worst.reason}"
        others = [f"rank {o.rank} {o.status}" for o in outcomes if o is not worst]
        reason += f" ({', '.join(others)})" if others else ""
    traceback = run_dir.rank_traceback(worst.rank)
    return RunSummary.of_status(
        worst.status, identity, " ".join(reason.split()),
        params=next((o.params for o in outcomes if o.params), None),  # counted by the ranks, if they got that far
        figures=figures_reached(run_dir, worst), ranks=[o.to_dict() for o in outcomes],
        traceback=str(traceback.relative_to(run_dir.root)) if traceback.exists() else None)

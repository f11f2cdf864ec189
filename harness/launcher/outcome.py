"""Turn what the ranks left behind into the run's summary.json, which only the launcher's process writes.

A run whose every rank reported ok has its figures computed here from the reports rank 0 left
(ranks/report.json), with the notes the launcher kept (they never go through the ranks). Otherwise: each rank writes its RankOutcome; a rank with no outcome file died without a report (a signal, the OOM
killer), and torchrun's log says how. The run's status is its worst rank's, and among equally bad ranks the
cause is named before its symptoms (RankOutcome.peer, a field the rank set, never a phrase matched here).
"""
from __future__ import annotations

import json
import re
from typing import Dict, List

from ..config import derive
from ..config.mesh import Mesh, mesh_of
from ..core.fatal_dump import read_dump
from ..core.records import Identity, RankOutcome, RankReport, RunSummary, Status
from ..core.rundir import NODE_ENDED, RunDir, read_json, read_jsonl, write_json
from ..reporting.run_summary import summary_of_finished_run
from ..core.runlock import holder


def exit_codes(log_text: str) -> Dict[int, int]:
    """Per-rank exit codes from torchrun's failure report (`rank: R ... exitcode: C`)."""
    return {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log_text)}


def rank_outcomes(run_dir: RunDir, mesh: Mesh) -> List[RankOutcome]:
    """Every rank's outcome, on every node of the run's mesh (their files share the run dir); a rank without one
    was killed."""
    log = run_dir.launcher_log.read_text(errors="replace") if run_dir.launcher_log.exists() else ""
    codes = exit_codes(log)
    outcomes = []
    for rank in range(mesh.world):
        found = read_json(run_dir.rank_outcome(rank))
        node = mesh.node_of(rank)
        outcomes.append(RankOutcome.from_dict(found) if found else RankOutcome.killed(
            rank, codes.get(rank), node, read_dump(run_dir.rank_fatal(rank))))
    return outcomes


def where(o: RankOutcome, nnodes: int) -> str:
    """`rank R`, or `rank R (node K)` in a multi-node run."""
    return f"rank {o.rank}" + (f" (node {o.node})" if nnodes > 1 and o.node is not None else "")


def missing_nodes(run_dir, nnodes: int) -> List[int]:
    """Nodes whose launcher holds no node lock now (launcher/nodes.py): they never started, or they are gone.
    flock reaches other hosts only where the shared filesystem honours it (core/runlock.py)."""
    return [k for k in range(1, nnodes) if holder(run_dir, f".lock.node{k}") is None]


def lost_nodes(run_dir: RunDir, nnodes: int) -> List[int]:
    """Nodes whose launcher started and is gone without saying its torchrun ended (launcher/nodes.follow's last
    line): SIGKILLed, its host lost, its link cut."""
    out = []
    for k in range(1, nnodes):
        log = run_dir.root / f"launcher.node{k}.log"
        if log.exists() and holder(run_dir.root, f".lock.node{k}") is None and NODE_ENDED not in log.read_text():
            out.append(k)
    return out


def rendezvous_timeout(run_dir: RunDir, outcomes: List[RankOutcome], nnodes: int, timeout_s: int) -> str | None:
    """A multi-node run whose nodes never all met: torchrun's rendezvous gave up and no rank started."""
    log = run_dir.launcher_log.read_text(errors="replace") if run_dir.launcher_log.exists() else ""
    if nnodes == 1 or any(run_dir.rank_outcome(o.rank).exists() for o in outcomes):
        return None
    if "RendezvousTimeoutError" not in log and "RendezvousClosedError" not in log:
        return None
    missing = missing_nodes(run_dir.root, nnodes)
    named = f"node {', '.join(map(str, missing))}" if missing else f"a node of {nnodes}"
    return (f"{named} never joined the rendezvous within dist.rendezvous_timeout_s={timeout_s} s; start every "
            "node's launcher (SHARDBENCH_NODE_RANK=k) or raise the timeout")


def figures_reached(run_dir: RunDir, worst: RankOutcome) -> dict:
    """A failed run's figures: the steps it completed (metrics.jsonl), its last loss, and what the rank
    that caused the failure had reached (memory high-water marks; for an OOM, the bytes over budget)."""
    steps = run_dir.read_metrics()
    out = {"train/steps_completed": len(steps), **worst.reached}
    if steps:
        out["loss/last_loss"] = steps[-1].get("loss/loss")
    return out


def params_reached(run_dir: RunDir, outcomes: List[RankOutcome]) -> int | None:
    """The model's size for a failed row: counted by a rank that reported, else the settings rank 0 wrote once
    the model was built (a rank killed before its report, and its peers stopped by torchrun before theirs,
    leave no count in their outcomes: the fault drill's kill row then lost its size, about once in 20)."""
    counted = next((o.params for o in outcomes if o.params), None)
    if counted:
        return counted
    return ((read_json(run_dir.settings) or {}).get("workload") or {}).get("params")


def failure_summary(identity: Identity, run_dir: RunDir, mesh: Mesh, returncode: int,
                    rendezvous_timeout_s: int = 0) -> RunSummary:
    outcomes, nnodes = rank_outcomes(run_dir, mesh), mesh.nodes
    worst = min(outcomes, key=RankOutcome.sort_key)
    missing = rendezvous_timeout(run_dir, outcomes, nnodes, rendezvous_timeout_s)
    if missing:
        return RunSummary.of_status(Status.TIMEOUT, identity, missing, figures={"train/steps_completed": 0},
                                    ranks=[o.to_dict() for o in outcomes])
    if worst.status == Status.OK:
        reason = f"launcher exited with code {returncode} after every rank reported ok"
    elif worst.status == Status.PREEMPTED:  # every rank stopped on purpose, at the same step
        reason = f"preempted: {worst.reason}"
    else:
        reason = f"{where(worst, nnodes)} {worst.status}: {worst.error} {worst.reason}"
        others = [f"{where(o, nnodes)} {o.status}" for o in outcomes if o is not worst]
        reason += f" ({', '.join(others)})" if others else ""
        lost = lost_nodes(run_dir, nnodes)
        if lost:  # the cause, before what the ranks saw of it
            steps = int(figures_reached(run_dir, worst).get("train/steps_completed", 0))
            reason = (f"node {', '.join(map(str, lost))} lost after {steps} steps: its launcher ended without its "
                      f"torchrun's end (killed, host or link lost), and its ranks with it; the ranks saw: {reason}")
    traceback = run_dir.rank_traceback(worst.rank)
    return RunSummary.of_status(
        worst.status, identity, " ".join(reason.split()),
        params=params_reached(run_dir, outcomes),
        figures=figures_reached(run_dir, worst), ranks=[o.to_dict() for o in outcomes],
        traceback=str(traceback.relative_to(run_dir.root)) if traceback.exists() else None)


def finished_summary(cfg, run_dir: RunDir, outcomes: List[RankOutcome], notes: List[str]) -> RunSummary | None:
    """The summary of a run whose every rank reported ok and left its report; None otherwise."""
    if not outcomes or any(o.status != Status.OK for o in outcomes) or not run_dir.reports.exists():
        return None
    try:  # Python's JSON: a loss that went non-finite is read back as NaN, as the rank measured it
        left = json.loads(run_dir.reports.read_text())
    except (OSError, ValueError):
        return None
    ranks = [RankReport.from_dict(r) for r in left["ranks"]]
    return summary_of_finished_run(cfg, ranks, left["flop_counts"], left["warnings"], read_json(run_dir.settings),
                                   notes, (read_json(run_dir.env) or {}).get("device", ""))


def summarise(cfg, run_dir: RunDir, returncode: int, notes: List[str], reason_prefix: str = "") -> dict:
    """Write and return the run's summary.json: its figures when every rank finished, else the failure the
    rank outcomes tell (`reason_prefix` first, e.g. a full disk)."""
    mesh = mesh_of(cfg)
    summary = finished_summary(cfg, run_dir, rank_outcomes(run_dir, mesh), notes)
    if summary is None:
        summary = failure_summary(derive.identity(cfg), run_dir, mesh, returncode, cfg.dist.rendezvous_timeout_s)
        summary.reason = reason_prefix + summary.reason
    out = summary.to_dict()
    restarts = read_jsonl(run_dir.restarts)  # torchelastic's restarts (launch.max_restarts), as the ranks wrote them
    if restarts:
        out["restarts"] = restarts
        out.setdefault("figures", {})["launch/restarts"] = len(restarts)
    write_json(run_dir.summary, out)
    return out

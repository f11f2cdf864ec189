"""Stage 2 of the advisor: short real runs of the candidates theory ordered (studies/advise/search.py makes the plan):
the best predicted candidate of each backend probed, the next after an OOM, one near the boundary of what theory
pruned, and both leaders again when they are closer than their noise."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional
from ..capacity.probe import device_bytes, run_probe
from .search import Candidate, Plan, size


# a probe's length: the capacity probes' 3 steps (1 warm-up) say fit or OOM, but time 2 steps, too few to
# rank by or to see the noise in
TIMED = ["train.steps=10", "train.warmup_steps=2"]


BOUNDARY_X = 1.5  # a pruned candidate predicted within this factor of the budget is worth one probe


def measure(p: Plan, max_probes: int, out: Path, force: bool) -> None:
    """Stage 2: probe each backend's best fitting candidate (fastest predicted first), its next one after a
    measured OOM, then the boundary of each backend whose fastest candidate was pruned, up to max_probes."""
    by_backend: Dict[str, List[Candidate]] = {}
    for c in p.fitting:
        by_backend.setdefault(c.backend, []).append(c)
    queue = [(cands[0], "best") for cands in by_backend.values()]
    probes = 0
    while queue and probes < max_probes:
        c, role = queue.pop(0)
        probe(c, role, p, out, force)
        probes += 1
        if c.status == "oom":  # the model was wrong: the backend's next candidate takes its place
            rest = [n for n in by_backend[c.backend] if not n.status]
            if rest:
                queue.insert(0, (rest[0], "next"))
    close = contenders(p)
    if close and probes + 2 <= max_probes and gap_pct(*close) <= max(c.noise_pct or 0 for c in close):
        print(f"  {close[0].name} and {close[1].name} are {gap_pct(*close):.1f}% apart, within their noise: "
              "running both again", flush=True)
        for c in close:
            probe(c, "repeat", p, out, force, repeat=True)
        probes += 2
    for pruned in boundaries(p):
        if probes >= max_probes:
            break
        probe(pruned, "boundary", p, out, force)
        probes += 1


def contenders(p: Plan) -> Optional[tuple]:
    """The fastest measured candidate and the fastest of another backend, when there are two."""
    ok = sorted((c for c in p.candidates if c.status == "ok" and c.tokens_per_s), key=lambda c: -c.tokens_per_s)
    rival = next((c for c in ok[1:] if c.backend != ok[0].backend), None) if ok else None
    return (ok[0], rival) if rival else None


def gap_pct(first: Candidate, second: Candidate) -> float:
    return 100 * (first.tokens_per_s - second.tokens_per_s) / second.tokens_per_s


def boundaries(p: Plan) -> List[Candidate]:
    """For each backend whose fastest candidate was pruned, its pruned candidate nearest the budget, when
    that is within BOUNDARY_X of it (a prediction many times over the budget needs no run to be believed);
    nearest first."""
    out = []
    for backend in dict.fromkeys(c.backend for c in p.candidates):
        mine = [c for c in p.candidates if c.backend == backend]
        if not mine[0].fits:
            nearest = min((c for c in mine if not c.fits), key=lambda c: c.predicted_peak_bytes)
            if nearest.predicted_peak_bytes <= BOUNDARY_X * p.budget_bytes:
                out.append(nearest)
    return sorted(out, key=lambda c: c.predicted_peak_bytes / p.budget_bytes)


def probe(c: Candidate, role: str, p: Plan, out: Path, force: bool, repeat: bool = False) -> None:
    """One short real run of `c` under the budget; a finished one (ok or oom) is reused unless `force`. A
    repeat runs in its own dir, and its tokens/s joins the first run's (see the module doc)."""
    run_dir = out / "probes" / (c.name + ("-repeat" if repeat else ""))
    overrides = [*p.overrides, *c.overrides, *TIMED, f"train.memory_budget_bytes={p.budget_bytes}"]
    summary = run_probe([*overrides, "force=true"] if force else overrides, run_dir, reuse=not force)
    figures = summary.get("figures", {})
    if repeat and summary.get("status") != "ok":  # the first run's figures stand; say what the repeat did
        print(f"  probe {c.name} (repeat): {summary.get('status')}: {summary.get('reason', '')}", flush=True)
        return
    c.role = c.role if repeat else role
    c.status, c.reason, c.run_dir = summary.get("status", "failed"), summary.get("reason", ""), str(run_dir)
    if figures.get("throughput/tokens_per_s"):
        c.runs.append(figures["throughput/tokens_per_s"])
        p50, p90 = figures.get("throughput/step_time_p50_s"), figures.get("throughput/step_time_p90_s")
        spreads = [c.noise_pct or 0.0] + ([100 * (p90 - p50) / p50] if p50 and p90 else [])
        if len(c.runs) > 1:
            spreads.append(100 * (max(c.runs) - min(c.runs)) / min(c.runs))
        c.noise_pct = max(spreads)
    c.tokens_per_s = sum(c.runs) / len(c.runs) if c.runs else None
    c.peak_bytes = device_bytes(summary)  # for an OOM, what it reached
    c.reused = bool(summary.get("reused"))
    print(f"  probe {c.name} ({role}): {c.status}" + (" (reused: same config, code and device)" if c.reused else "")
          + (f", {c.tokens_per_s:,.0f} tokens/s ± {c.noise_pct:.1f}%" if c.tokens_per_s else "")
          + (f", peak {size(c.peak_bytes)} (predicted {size(c.predicted_peak_bytes)})" if c.peak_bytes else "")
          + (f": {c.reason}" if c.status not in ("ok", "oom") else ""), flush=True)

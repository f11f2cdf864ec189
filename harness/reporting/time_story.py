"""One generated sentence per backend against the fastest run of its group, naming the part of the step
(runtime/measure/time_profile.py's breakdown) that accounts for most of the gap, e.g. "fsdp: +21.0 ms per step
against ddp, of which 15.2 ms is exposed communication".

The step figures are the table's: the median step of the timed window. The parts come from the breakdown steps
after it (`train.breakdown_steps`, profiled), whose own step is named beside them where it differs from the
median by more than 5%: they are other steps, not a split of the median.
"""
from __future__ import annotations

from typing import Callable, Dict, List

PART_NAMES = {"forward": "forward", "backward": "backward compute", "optimizer": "the optimizer step",
              "comm_exposed": "exposed communication", "other": "data and host overhead"}
APART = 0.05  # a profiled step further than this from the median is named


def _step(f: dict) -> float:
    return f.get("throughput/step_time_p50_s") or f["time/profiled_step_s"]


def straggler(f: dict) -> str:
    """A run's straggler (reporting/time_and_comm.stragglers), named after its label."""
    if "time/straggler_rank" not in f:
        return ""
    return (f" (rank {f['time/straggler_rank']:.0f} straggles: the others wait "
            f"{f['time/waiting_on_straggler_s'] * 1e3:.1f} ms a step on it)")


def sentences(rows: List[dict], labels: List[str], group_of: Callable[[dict], tuple]) -> List[str]:
    """For every ok run with a breakdown: its gap to the fastest run of its group, and the largest part."""
    timed = [(r, lab) for r, lab in zip(rows, labels)
             if r.get("status") == "ok" and "time/forward_s" in (r.get("figures") or {})]
    groups: Dict[tuple, list] = {}
    for r, lab in timed:
        groups.setdefault(group_of(r), []).append((r, lab))
    out = []
    for members in groups.values():
        members = [(r, lab + straggler(r["figures"])) for r, lab in members]
        fastest, fastest_label = min(members, key=lambda m: _step(m[0]["figures"]))
        base = fastest["figures"]
        for r, lab in sorted(members, key=lambda m: _step(m[0]["figures"])):
            f = r["figures"]
            profiled = f["time/profiled_step_s"]
            apart = abs(profiled / _step(f) - 1) > APART
            if r is fastest:
                out.append(f"{lab}: the fastest, {1e3 * _step(f):.1f} ms per step, of which "
                           f"{f['time/comm_exposed_pct']:.0f}% is exposed communication"
                           + (f" (in its profiled steps, {1e3 * profiled:.1f} ms)" if apart else ""))
                continue
            gaps = {part: f[f"time/{part}_s"] - base[f"time/{part}_s"] for part in PART_NAMES}
            part = max(gaps, key=gaps.get)
            gap = _step(f) - _step(base)
            profiled_gap = profiled - base["time/profiled_step_s"]
            out.append(f"{lab}: +{1e3 * gap:.1f} ms per step against {fastest_label}, of which "
                       f"{1e3 * gaps[part]:.1f} ms is {PART_NAMES[part]}"
                       + (f" (of the profiled steps' +{1e3 * profiled_gap:.1f} ms)"
                          if abs(profiled_gap - gap) > APART * _step(f) else ""))
    return out

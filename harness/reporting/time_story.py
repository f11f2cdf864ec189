"""One generated sentence per backend against the fastest run of its group, naming the part of the step
(runtime/time_profile.py's breakdown) that accounts for most of the gap, e.g. "fsdp: +21.0 ms per step
against ddp, of which 15.2 ms is exposed communication"."""
from __future__ import annotations

from typing import Callable, Dict, List

PART_NAMES = {"forward": "forward", "backward": "backward compute", "optimizer": "the optimizer step",
              "comm_exposed": "exposed communication", "other": "data and host overhead"}


def sentences(rows: List[dict], labels: List[str], group_of: Callable[[dict], tuple]) -> List[str]:
    """For every ok run with a breakdown: its gap to the fastest run of its group, and the largest part."""
    timed = [(r, lab) for r, lab in zip(rows, labels)
             if r.get("status") == "ok" and "time/forward_s" in (r.get("figures") or {})]
    groups: Dict[tuple, list] = {}
    for r, lab in timed:
        groups.setdefault(group_of(r), []).append((r, lab))
    out = []
    for members in groups.values():
        fastest, fastest_label = min(members, key=lambda m: m[0]["figures"]["time/profiled_step_s"])
        base = fastest["figures"]
        for r, lab in sorted(members, key=lambda m: m[0]["figures"]["time/profiled_step_s"]):
            f = r["figures"]
            if r is fastest:
                out.append(f"{lab}: the fastest, {1e3 * f['time/profiled_step_s']:.1f} ms per step, of which "
                           f"{f['time/comm_exposed_pct']:.0f}% is exposed communication")
                continue
            gaps = {part: f[f"time/{part}_s"] - base[f"time/{part}_s"] for part in PART_NAMES}
            part = max(gaps, key=gaps.get)
            gap = f["time/profiled_step_s"] - base["time/profiled_step_s"]
            out.append(f"{lab}: +{1e3 * gap:.1f} ms per step against {fastest_label}, of which "
                       f"{1e3 * gaps[part]:.1f} ms is {PART_NAMES[part]}")
    return out

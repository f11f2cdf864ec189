"""The host's costs on CPU, solved from calibration runs (studies/timing/device_costs.py): each run's counted work and
its measured breakdown give, per part, the seconds that the roofline does not explain, and a least-squares
fit over every part of every run gives a cost per unit of HOST_TERMS. On CUDA nothing is fitted: the host's
costs are measured op by op (studies/timing/device_costs_cuda.py)."""
from __future__ import annotations

from typing import Dict, List

from .op_costs import HOST_TERMS, KINDS, PARTS_COUNTED, DeviceCosts, op_rows, priced_phases


def calibration_rows(work: dict, measured: Dict[str, float], costs: DeviceCosts) -> List[tuple]:
    """One row per counted part of a calibration run: (its host units, in HOST_TERMS' order, the measured
    seconds less the part's roofline time, the measured seconds)."""
    roofline = {p: t["arithmetic"] + t["memory"] for p, t in priced_phases(work, costs).items()}
    column = {k: HOST_TERMS.index("light" if k in ("view", "alloc") else k) for k in KINDS}
    units = {p: [0.0] * len(HOST_TERMS) for p in PARTS_COUNTED}
    for r in op_rows(work):
        if r.phase in units:
            units[r.phase][column[r.kind]] += r.count
    for phase, lines in work.get("lines", {}).items():
        if phase in units:
            units[phase][HOST_TERMS.index("line")] = float(lines)
    for c in work.get("collectives", []):
        if c.get("phase") in units:
            units[c["phase"]][HOST_TERMS.index("collective")] += c["count"]
    return [(units[p], measured[p] - roofline[p], measured[p]) for p in PARTS_COUNTED if measured.get(p, 0) > 0]


def calibrate(rows: List[tuple]) -> List[float]:
    """Host costs (seconds per unit of each of HOST_TERMS) that best explain `rows`, by least
    squares on the relative error of each part (so that a 2 ms phase counts as much as a 40 ms one), none
    below zero: a term whose free solution is negative is dropped and the rest solved again."""
    import numpy as np

    units = np.array([r[0] for r in rows], dtype=float)
    target = np.array([r[1] for r in rows], dtype=float)
    weight = 1.0 / np.array([r[2] for r in rows], dtype=float)
    active = [j for j in range(units.shape[1]) if units[:, j].any()]
    while True:
        a = units[:, active] * weight[:, None]
        solution, *_ = np.linalg.lstsq(a, target * weight, rcond=None)
        if (solution >= 0).all() or not active:
            break
        active = [j for j, v in zip(active, solution) if v >= 0]
    out = [0.0] * units.shape[1]
    for j, v in zip(active, solution):
        out[j] = float(v)
    return out

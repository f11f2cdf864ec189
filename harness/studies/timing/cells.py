"""The time check's cells, shared with the extrapolation and the device costs: the parts a step is split into, the
settings of a timed cell, its repeats and the least disturbed of them, a part's comparison with the model, and the
costs the model is calibrated with."""
from __future__ import annotations

from typing import Dict, List, Tuple

from ...config.compose import compose
from ...reporting.time_and_comm import load_device_costs, miss_cause


PARTS = ("forward", "backward", "optimizer", "other", "comm_exposed")


CELL = ["logger=none", "train.steps=25", "train.warmup_steps=5", "train.profile_memory=false"]


REPEATS = 2  # each cell runs twice, the second pass in reverse order; the least disturbed run counts


CALIBRATION_SHAPE = {"model": "tiny_llama", "precision": "fp32", "world": 2}


def repeated(cells: List[tuple], repeats: int) -> List[tuple]:
    """Every cell `repeats` times, each pass after the first in the reverse order of the one before it, so
    that a slow stretch of a shared host falls on different cells in different passes."""
    out, order = [], list(cells)
    for r in range(repeats):
        out += [(f"{name}@{r + 1}", overrides) for name, overrides in order]
        order.reverse()
    return out


def least_disturbed(summaries: Dict[str, dict], name: str, repeats: int) -> Tuple[str, dict, List[float]]:
    """The repeat of a cell whose step was fastest (a shared host's slowdowns only ever add time): its run
    dir's name and summary, and every ok repeat's step time (their spread is the measurement's noise)."""
    runs = {f"{name}@{r + 1}": summaries[f"{name}@{r + 1}"] for r in range(repeats)}
    ok = {k: s for k, s in runs.items() if s["status"] == "ok" and "time/profiled_step_s" in (s.get("figures") or {})}
    if not ok:
        return next(iter(runs.items())) + ([],)
    best = min(ok, key=lambda k: ok[k]["figures"]["time/profiled_step_s"])
    return best, ok[best], [s["figures"]["time/profiled_step_s"] for s in ok.values()]


def compared(summary: dict, tolerance: float) -> dict:
    """One run's parts, measured and predicted, with errors (measured against predicted) and named misses."""
    f = summary.get("figures") or {}
    row = {"status": summary["status"], "parts": {}, "misses": []}
    if summary["status"] != "ok" or "time/forward_predicted_s" not in f:
        row["reason"] = summary.get("reason") or "no prediction (no counted work or no device costs)"
        return row
    for part in (*PARTS, "step"):
        measured = f["time/profiled_step_s"] if part == "step" else f[f"time/{part}_s"]
        predicted = f[f"time/{part}_predicted_s"]
        error = 100 * (measured - predicted) / predicted if predicted else float("inf")
        row["parts"][part] = {"measured_s": measured, "predicted_s": predicted, "error_pct": error}
        if abs(error) > tolerance and part != "step":
            row["misses"].append(f"{part} {error:+.0f}%: {miss_cause(f, part)}")
    return row


def part_cells(parts: Dict[str, dict], tolerance: float) -> List[str]:
    """A row's cells for each part and the step: measured / predicted ms (error), bold past the tolerance."""
    cells = []
    for part in (*PARTS, "step"):
        p = parts[part]
        mark = "**" if abs(p["error_pct"]) > tolerance and part != "step" else ""
        cells.append(f"{p['measured_s'] * 1e3:.2f} / {p['predicted_s'] * 1e3:.2f} {mark}({p['error_pct']:+.0f}%){mark}")
    return cells


def calibrated_costs(overrides: List[str], command: str):
    """This device's costs with host costs, or None, having said in one line why not and what to run."""
    costs, why = load_device_costs(compose(overrides))
    if costs is None or costs.host is None:
        print(f"{command}: {why or 'the device costs hold no host costs'}; run `make device-costs` first")
        return None
    return costs

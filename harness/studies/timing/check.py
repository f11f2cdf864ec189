"""`make time-check`: the time model (theory/op_costs.py) against the measured breakdown, part by part, over a
matrix of runs in one launch a model, as `make memory-check` does for memory.

    python -m harness time-check [--models tiny_llama,small_llama,tiny_gpt2] [--precisions fp32,bf16]
        [--backends ddp,...] [--tolerance 30] [--out results/time_check] [overrides]

Every backend x model x precision on 2 ranks is a cell: a run of 25 steps whose last 20 are clocked by phase
(runtime/measure/time_profile.py), then counted (runtime/measure/work_count.py). Each cell runs --repeats times (the
passes in alternating order) and the least disturbed run, the one with the fastest step, is compared: this host is a
shared VM whose speed moved by up to 2x within minutes while this was written, and a slowdown only adds time.
The table shows every repeat's step; the report, the launch's matmul rate against the calibration's. Each part of its step (forward, backward,
optimizer, other, exposed communication) and the step itself are set beside the prediction priced from that
run's counted work at this device's costs (results/device_costs/, `make device-costs`, calibrated on 2-rank
tiny_llama fp32 runs: those cells are the calibration's shape, the rest are not). A part whose measured time
is more than --tolerance percent off its prediction is a miss, named with what its prediction rests on most.
Writes time_check.{md,json}; exits 1 only if a cell fails to run (misses are results, named, not failures).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

from ...config.command_line import parse
from ...config.compose import flat_backends
from ...core.paths import REPO, results_dir
from ...core.rundir import write_json, write_text
from ...launcher.cells import run_cells
from .cells import PARTS, CELL, REPEATS, CALIBRATION_SHAPE, repeated, least_disturbed, compared, part_cells, calibrated_costs


def table(rows: List[dict], tolerance: float) -> List[str]:
    head = ("| backend | model | precision | ranks | " + " | ".join(p.replace("_", " ") for p in (*PARTS, "step"))
            + " | repeats' steps, ms |")
    out = [head, "|" + "---|" * 4 + "---:|" * (len(PARTS) + 2)]
    for r in rows:
        cells = [r["backend"], r["model"], r["precision"], str(r["world"])]
        tail = [", ".join(f"{t * 1e3:.1f}" for t in r.get("repeat_steps_s", []))]
        if not r["parts"]:
            out.append("| " + " | ".join(cells) + f" | {r['status']}: {r.get('reason', '')} |" + " |" * (len(PARTS) + 1))
            continue
        out.append("| " + " | ".join(cells + part_cells(r["parts"], tolerance) + tail) + " |")
    return out


def summarise(rows: List[dict], tolerance: float) -> Dict[str, object]:
    """How many parts hold the bound, over every cell and over the cells not of the calibration's shape."""
    def count(rs):
        parts = [p for r in rs for name, p in r["parts"].items() if name != "step"]
        return {"parts": len(parts), "within": sum(abs(p["error_pct"]) <= tolerance for p in parts),
                "steps_within": sum(abs(r["parts"]["step"]["error_pct"]) <= tolerance for r in rs if r["parts"]),
                "cells": len([r for r in rs if r["parts"]])}
    held_out = [r for r in rows if not r["calibration_shape"]]
    return {"all": count(rows), "held_out": count(held_out)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness time-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny_llama,small_llama,tiny_gpt2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--backends", default="")
    ap.add_argument("--tolerance", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--out", default=str(results_dir("time_check")))
    args, overrides = parse("time-check", ap, argv)
    costs = calibrated_costs(overrides, "time-check")
    if costs is None:
        return 2
    backends = args.backends.split(",") if args.backends else flat_backends("cpu")
    cells = [(f"{m}-{p}-{b}", [f"backend={b}", f"model={m}", f"train.precision={p}"])
             for m in args.models.split(",") for p in args.precisions.split(",") for b in backends]
    out = Path(args.out)
    # one launch a model: each rank's heap grows over a launch (0.39 to 1.48 GB a rank over the 132 runs of
    # one launch of the 11 backends), and the cells in its middle read slowest; shorter launches keep every cell
    # near a fresh rank's state (a launch costs about 8 s to start)
    summaries: Dict[str, dict] = {}
    for model in args.models.split(","):
        mine = [c for c in cells if c[0].startswith(f"{model}-")]
        summaries.update(run_cells(out / "runs" / model, repeated(mine, args.repeats), common=[*CELL, *overrides],
                                   report=False))
    rows = []
    for name, cell in cells:
        backend, model, precision = (o.split("=", 1)[1] for o in cell)
        _, summary, steps = least_disturbed(summaries, name, args.repeats)
        f = summary.get("figures") or {}
        rate = f.get("flops/measured_peak_tflops_per_device")
        row = {"backend": backend, "model": model, "precision": precision, "world": 2,
               "calibration_shape": {"model": model, "precision": precision, "world": 2} == CALIBRATION_SHAPE,
               "repeat_steps_s": steps, "host_speed": rate / costs.matmul_tflops[precision] if rate else None,
               **compared(summary, args.tolerance)}
        rows.append(row)
    totals = summarise(rows, args.tolerance)
    write_json(out / "time_check.json", {"tolerance_pct": args.tolerance, "device_costs": costs.source,
                                         "totals": totals, "rows": rows})
    write_text(out / "time_check.md", report(rows, totals, args.tolerance, costs.source, " ".join(argv or sys.argv[1:])))
    a, h = totals["all"], totals["held_out"]
    print(f"time-check: {a['within']} of {a['parts']} parts within {args.tolerance:.0f}% ({h['within']} of "
          f"{h['parts']} outside the calibration's shape); steps within: {a['steps_within']} of {a['cells']}; "
          f"wrote {out / 'time_check.md'}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def report(rows: List[dict], totals: dict, tolerance: float, source: str, args: str) -> str:
    a, h = totals["all"], totals["held_out"]
    speeds = sorted({round(r["host_speed"], 2) for r in rows if r.get("host_speed")})
    speed = (f"The launch's 1024^3 matmul ran at {', '.join(f'{x:.2f}' for x in speeds)}x the calibration's rate "
             "(the host's speed while it ran). " if speeds else "")
    lines = ["# Time check: the step-time model against the measured breakdown", "",
             f"Command: `python -m harness time-check {args}`. Device costs: {source}.", "",
             "Each cell: milliseconds per step on the slowest rank, measured / predicted (measured against "
             f"predicted); bold where they differ by more than {tolerance:.0f}%. {speed} Measured: the mean of 20 clocked "
             "steps (runtime/measure/time_profile.py); predicted: that run's counted work priced at the device's costs "
             "(theory/op_costs.py). The tiny_llama fp32 cells have the calibration's shape (other runs of it).", "",
             f"**{a['within']} of {a['parts']} parts within {tolerance:.0f}%** ({h['within']} of {h['parts']} in "
             f"cells outside the calibration's shape); steps within {tolerance:.0f}%: {a['steps_within']} of "
             f"{a['cells']}.", "", *table(rows, tolerance), "", "## Every miss, with what its prediction rests on", ""]
    for r in rows:
        for miss in r["misses"]:
            lines.append(f"- {r['backend']} {r['model']} {r['precision']}: {miss}")
    return "\n".join(lines) + "\n"

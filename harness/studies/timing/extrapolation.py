"""`make time-extrapolate`: the time model's real test. Calibrated on 2-rank tiny_llama runs only (results/
device_costs/, `make device-costs`), it predicts runs it has never seen, before they run, then they run.

    python -m harness time-extrapolate [--backends ddp,...] [--repeats 2] [--out results/time_model] [overrides]

Targets, every flat backend, fp32: tiny_llama on 3 and on 4 ranks (on this 2-core host: a rank without a
core of its own), and small_llama (24x the parameters) on 2.

1. Predict. Each target's first and last rank are replayed, each in one process over the mirror process group
   (runtime/simulate/replay.py), which counts a rank's step's work without the run; the work is priced at the device's
   costs (theory/op_costs.py), and the slower rank is the prediction. The predictions are written to
   predictions.json, with the time, before any target runs.
2. Run. One launch per world size (cells), each target --repeats times, the least disturbed run kept
   (studies/timing/check.py says why).
3. Compare, part by part: forward, backward, optimizer, other, exposed communication, and the step. Beside
   it, the work the replay counted against the work the real run's same rank counted (ops, lines,
   collectives): how far the prediction's input was from the run's own.

Writes extrapolation.{md,json}; exits 1 only if a target fails to run.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Dict, List

from ...config.command_line import parse
from ...config.compose import compose, flat_backends
from ...config.derive import world_size
from ...core.paths import REPO, results_dir
from ...core.rundir import RunDir, write_json, write_text
from ...launcher.cells import run_cells
from ...launcher.replays import replay_work
from ...reporting.time_and_comm import slowest_work
from ...theory.op_costs import predict_counted, work_totals
from ...theory.shape import shape_of
from .cells import CELL, PARTS, REPEATS, calibrated_costs, least_disturbed, part_cells, repeated

TARGETS = {"tiny_llama@3": ["model=tiny_llama", "parallelism.nproc_per_node=3"],
           "tiny_llama@4": ["model=tiny_llama", "parallelism.nproc_per_node=4"],
           "small_llama@2": ["model=small_llama", "parallelism.nproc_per_node=2"]}


def work_difference(replayed: dict, real: dict) -> Dict[str, float]:
    """Percent difference of the replay's counts from the real run's, summed over the step: ops (every kind),
    Python lines, collectives."""
    def sums(work):
        t = work_totals(work)
        return {"ops": sum(v for row in t.values() for k, v in row.items() if k not in ("lines", "flops", "bytes")),
                "lines": sum(row["lines"] for row in t.values()),
                "collectives": sum(c["count"] for c in work.get("collectives", []))}
    a, b = sums(replayed), sums(real)
    return {k: 100 * (a[k] - b[k]) / b[k] if b[k] else 0.0 for k in a}


def predict(names: Dict[str, List[str]], overrides: List[str], costs, out: Path) -> Dict[str, dict]:
    """Replay every target's first and last rank and price their work; the slower is the prediction (a step
    goes at its slowest rank's pace): {name: {"parts": predicted seconds, "work": counted, "rank": which}}."""
    from ...runtime import models

    configs = {name: compose([*CELL, *cell, *overrides]) for name, cell in names.items()}
    safe = {name: name.replace("/", "-").replace("@", "-at-") for name in configs}
    by_world: Dict[int, Dict[str, object]] = {}
    for name, cfg in configs.items():
        by_world.setdefault(world_size(cfg), {})[safe[name]] = cfg
    replays = {0: replay_work({safe[n]: c for n, c in configs.items()}, out / "replays")}
    for world, group in by_world.items():
        replays.setdefault(world - 1, {}).update(replay_work(group, out / "replays", rank=world - 1))
    predicted = {}
    for name, cfg in configs.items():
        world = world_size(cfg)
        shape = shape_of(cfg, world, models.param_count(cfg.model, cfg.workload))
        options = []
        for rank in (0, world - 1):
            result = replays[rank][safe[name]]
            if result["ok"]:
                parts = predict_counted(cfg.backend, shape, result["work"], costs)
                options.append({"parts": parts, "work": result["work"], "rank": rank})
            elif rank == 0:
                break
        # a rank past 0 fails where a framework checks its state against rank 0's by a broadcast (ZeRO-3's
        # module order), which the mirror group cannot answer with rank 0's value: rank 0's work stands alone
        predicted[name] = (max(options, key=lambda o: o["parts"]["step"]) if options
                           else {"error": replays[0][safe[name]]["error"]})
        predicted[name]["ranks_replayed"] = [o["rank"] for o in options]
    return predicted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness time-extrapolate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--tolerance", type=float, default=30.0)
    ap.add_argument("--out", default=str(results_dir("time_model")))
    args, overrides = parse("time-extrapolate", ap, argv)
    costs = calibrated_costs(overrides, "time-extrapolate")
    if costs is None:
        return 2
    out = Path(args.out)
    backends = args.backends.split(",") if args.backends else flat_backends(compose(overrides).parallelism.device)
    targets = args.targets.split(",")
    names = {f"{b}/{t}": [f"backend={b}", *TARGETS[t]] for t in targets for b in backends}
    predicted = predict(names, overrides, costs, out)
    write_json(out / "predictions.json", {"written": datetime.datetime.now().isoformat(timespec="seconds"),
                                          "device_costs": costs.source, "host_costs": costs.host.source,
                                          "predictions": {n: p.get("parts", p) for n, p in predicted.items()}})
    print(f"predicted {len(predicted)} runs before running them: {out / 'predictions.json'}")
    rows: List[dict] = []
    for target in targets:
        cells = [(f"{b}", [f"backend={b}", *TARGETS[target]]) for b in backends]
        summaries = run_cells(out / "runs" / target.replace("@", "-at-"), repeated(cells, args.repeats),
                              common=[*CELL, *overrides], report=False)
        for b in backends:
            key, summary, steps = least_disturbed(summaries, b, args.repeats)
            rows.append(compare(f"{b}/{target}", b, target, summary, steps, predicted[f"{b}/{target}"],
                                out / "runs" / target.replace("@", "-at-") / key, args.tolerance))
    within = [p for r in rows for name, p in r["parts"].items() if name != "step"]
    totals = {"parts": len(within), "within": sum(abs(p["error_pct"]) <= args.tolerance for p in within),
              "steps": len([r for r in rows if r["parts"]]),
              "steps_within": sum(abs(r["parts"]["step"]["error_pct"]) <= args.tolerance for r in rows if r["parts"])}
    write_json(out / "extrapolation.json", {"tolerance_pct": args.tolerance, "device_costs": costs.source,
                                            "host_costs": costs.host.source, "totals": totals, "rows": rows})
    write_text(out / "extrapolation.md", report(rows, totals, args.tolerance, costs, " ".join(argv or sys.argv[1:])))
    print(f"time-extrapolate: {totals['within']} of {totals['parts']} parts within {args.tolerance:.0f}%, steps "
          f"{totals['steps_within']} of {totals['steps']}; wrote {out / 'extrapolation.md'}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def compare(name: str, backend: str, target: str, summary: dict, steps: List[float], predicted: dict,
            run_dir: Path, tolerance: float) -> dict:
    row = {"name": name, "backend": backend, "target": target, "status": summary["status"], "parts": {},
           "repeat_steps_s": steps, "misses": []}
    f = summary.get("figures") or {}
    if summary["status"] != "ok" or "parts" not in predicted or "time/forward_s" not in f:
        row["reason"] = summary.get("reason") or predicted.get("error", "no breakdown")
        return row
    parts = predicted["parts"]
    for part in (*PARTS, "step"):
        measured = f["time/profiled_step_s"] if part == "step" else f[f"time/{part}_s"]
        row["parts"][part] = {"measured_s": measured, "predicted_s": parts[part],
                              "error_pct": 100 * (measured - parts[part]) / parts[part]}
    row["work_difference_pct"] = work_difference(predicted["work"], slowest_work(RunDir(run_dir), predicted["rank"]))
    row["replayed_rank"] = predicted["rank"]
    row["ranks_replayed"] = predicted["ranks_replayed"]
    row["misses"] = [f"{p} {v['error_pct']:+.0f}%" for p, v in row["parts"].items()
                     if p != "step" and abs(v["error_pct"]) > tolerance]
    return row


def report(rows: List[dict], totals: dict, tolerance: float, costs, args: str) -> str:
    lines = ["# Extrapolation: the time model on runs it was not calibrated on, predicted before they ran", "",
             f"Command: `python -m harness time-extrapolate {args}`. Device costs: {costs.source}; host costs "
             f"{costs.host.source}.", "",
             "Milliseconds per step on the slowest rank, measured / predicted (measured against predicted), bold "
             f"beyond {tolerance:.0f}%. Predicted from the replayed rank's work (runtime/simulate/replay.py) before "
             "the run; measured: the least disturbed of the repeats. 'work' is how far the replay's counts were from "
             "the real run's same rank (ops, Python lines, collectives), and which of the first and last ranks were "
             "replayed and gave the prediction (the slower).", "",
             f"**{totals['within']} of {totals['parts']} parts within {tolerance:.0f}%; steps {totals['steps_within']} "
             f"of {totals['steps']}.**", "",
             "| backend | target | " + " | ".join(p.replace("_", " ") for p in (*PARTS, "step"))
             + " | work: ops / lines / collectives | repeats' steps, ms |",
             "|---|---|" + "---:|" * (len(PARTS) + 3)]
    for r in rows:
        cells = [r["backend"], r["target"]]
        if not r["parts"]:
            lines.append("| " + " | ".join(cells) + f" | {r['status']}: {r.get('reason', '')} |" + " |" * (len(PARTS) + 2))
            continue
        cells += part_cells(r["parts"], tolerance)
        w = r["work_difference_pct"]
        cells.append(f"{w['ops']:+.1f}% / {w['lines']:+.1f}% / {w['collectives']:+.0f}% (rank {r['replayed_rank']} of "
                     f"{', '.join(map(str, r['ranks_replayed']))} replayed)")
        cells.append(", ".join(f"{t * 1e3:.1f}" for t in r["repeat_steps_s"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

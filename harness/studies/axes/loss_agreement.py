"""Runs of one sweep side by side with a reference run: same config but one axis (FSDP1 against FSDP2, model-dtype
masters against fp32 ones). For each run, its states, peak and bytes beside theory, its median step, its final
loss, the largest relative loss difference from its reference over the steps both ran, and the first step at
which that difference passes `--diverge` (the divergence step, if any). Read from the sweep's run dirs alone.

    shardbench loss-agreement --sweep <dir> --axis train.master_weights --reference fp32
    shardbench loss-agreement --sweep <dir> --axis backend --pairs fsdp1:fsdp,fsdp1_grad_op:fsdp_grad_op

Writes agreement.md (and agreement.json) into the sweep dir; the sweep's own report has the loss curves.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ...config.command_line import parse
from ...core.rundir import read_jsonl, write_text
from ...reporting.collect import collect

TAIL = 50  # the last steps whose mean loss says where a run ended, past one batch's noise
COLUMNS = ("states MiB (theory)", "peak MiB (theory)", "kB sent/step (theory)", "step p50 ms", "final loss",
           f"mean loss, last {TAIL}", "max rel. loss diff", "diverges at")


def losses(run_dir: Path) -> Dict[int, float]:
    return {r["step"]: r["loss/loss"] for r in read_jsonl(Path(run_dir) / "metrics.jsonl") if "loss/loss" in r}


def compare(mine: Dict[int, float], ref: Dict[int, float], diverge: float) -> tuple:
    """(largest relative difference, first step past `diverge`) over the steps both ran."""
    steps = sorted(set(mine) & set(ref))
    diffs = [(s, abs(mine[s] - ref[s]) / abs(ref[s])) for s in steps]
    worst = max((d for _, d in diffs), default=None)
    return worst, next((s for s, d in diffs if d > diverge), None)


def axis_key(axis: str) -> str:
    """The config key that holds the axis' value: a backend is varied as a whole, by its name."""
    return "backend.name" if axis == "backend" else axis


def rest_of(config: dict, axis: str) -> dict:
    """What must be equal for two runs to differ only in `axis` (run dirs, sweep names and, across backends, the
    backends' own fields aside)."""
    skip = ("hydra", "paths.", "sweep.", *(("backend.",) if axis == "backend" else ()))
    return {k: v for k, v in config.items() if k != axis_key(axis) and not k.startswith(skip)}


def reference_of(row: dict, rows: List[dict], axis: str, target: Optional[str]) -> Optional[dict]:
    """The run whose config differs from `row`'s only in `axis`, where `axis` is `target`."""
    mine = rest_of(row["config"], axis)
    return next((other for other in rows if target is not None and other is not row
                 and str(other["config"].get(axis_key(axis))) == target and rest_of(other["config"], axis) == mine),
                None)


def table(sweep_dir: Path, axis: str, targets: Dict[str, str], diverge: float) -> List[dict]:
    everything = [{**r, "run_dir": Path(sweep_dir) / r["run_dir"], "config": r.get("config") or {}}
                  for r in collect(sweep_dir)]
    rows = [r for r in everything if r["config"]]  # a refused run has no config: a row with its reason only
    out = []
    for r in everything:
        ref = reference_of(r, rows, axis, targets.get(str(r["config"].get(axis_key(axis)))))
        f, mine = r.get("figures", {}), losses(r["run_dir"])
        worst, at = compare(mine, losses(ref["run_dir"]), diverge) if ref else (None, None)
        tail = [mine[s] for s in sorted(mine)[-TAIL:]]
        out.append({"run": Path(r["run_dir"]).name, "status": r.get("status"), "reason": r.get("reason", ""),
                    "reference": Path(ref["run_dir"]).name if ref else None,
                    "states": f.get("memory/model_states_total_bytes_max"),
                    "states_pred": f.get("memory/model_states_predicted_bytes"),
                    "peak": f.get("memory/tensor_peak_bytes_max"), "peak_pred": f.get("memory/tensor_peak_predicted_bytes"),
                    "bytes": f.get("comm/measured_bytes_per_step"), "bytes_pred": f.get("comm/predicted_bytes_per_step"),
                    "step_ms": 1e3 * f["throughput/step_time_p50_s"] if "throughput/step_time_p50_s" in f else None,
                    "final_loss": mine[max(mine)] if mine else None, "max_rel_diff": worst, "diverges_at": at,
                    "tail_mean": sum(tail) / len(tail) if tail else None})
    return out


def render(rows: List[dict], command: str, diverge: float) -> str:
    def pair(a, b, scale, digits=2):
        return "" if a is None else f"{a / scale:,.{digits}f} ({b / scale:,.{digits}f})" if b else f"{a / scale:,.{digits}f}"

    lines = [f"Command: `{command}`. Each run against its reference (the run that differs only in the axis); "
             f"\"diverges at\": the first step whose loss differs by more than {diverge:g} (relative) from the "
             f"reference's at the same step (the same batch); \"mean loss, last {TAIL}\": where the run ended, past "
             "one batch's noise.", "",
             "| run | reference | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['run']} | | {r['status']}: {r['reason']} |" + " |" * (len(COLUMNS) - 1))
            continue
        diff = "" if r["max_rel_diff"] is None else f"{r['max_rel_diff']:.1e}"
        at = "" if r["reference"] is None else (f"step {r['diverges_at']}" if r["diverges_at"] is not None else "no")
        lines.append(f"| {r['run']} | {r['reference'] or ''} | {pair(r['states'], r['states_pred'], 2**20, 3)} | "
                     f"{pair(r['peak'], r['peak_pred'], 2**20)} | {pair(r['bytes'], r['bytes_pred'], 1e3, 1)} | "
                     f"{r['step_ms']:.1f} | {r['final_loss']:.5f} | {r['tail_mean']:.5f} | {diff} | {at} |")
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, required=True, help="the sweep's dir (its run dirs inside)")
    parser.add_argument("--axis", required=True, help="the config key that differs (backend, train.master_weights)")
    parser.add_argument("--reference", help="the axis value every other run is held to")
    parser.add_argument("--pairs", default="", help="run:reference values of the axis, comma-separated")
    parser.add_argument("--diverge", type=float, default=0.02, help="relative loss difference called divergence")
    args, _ = parse("loss-agreement", parser, argv, takes_overrides=False)
    if not args.sweep.is_dir():
        print(f"loss-agreement: --sweep {args.sweep}: no such sweep dir", file=sys.stderr)
        return 2
    targets = dict(p.split(":") for p in args.pairs.split(",") if p)
    if args.reference:
        values = {str(r["config"].get(args.axis)) for r in collect(args.sweep) if r.get("config")}
        targets.update({v: args.reference for v in values if v != args.reference})
    rows = table(args.sweep, args.axis, targets, args.diverge)
    command = "shardbench loss-agreement " + " ".join(sys.argv[1:] if argv is None else argv)
    write_text(args.sweep / "agreement.md", render(rows, command.strip(), args.diverge))
    write_text(args.sweep / "agreement.json", json.dumps(rows, indent=1, default=str))
    print((args.sweep / "agreement.md").read_text())
    return 0

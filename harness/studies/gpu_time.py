"""The time model against a GPU's measured steps: `time_model.md` of `make gpu-check` (studies/gpu_check.py), one
row per run and part, measured beside predicted.

What is measured: each part is the profiler's (runtime/time_profile.py: a phase is the busy time of the kernels
launched inside it, `other` the rest of the profiled step, mostly the device waiting on the host), on a step
after the timed window; the timed steps' median is beside it. What is predicted: the step's counted work
(runtime/work_count.py) priced at the device costs `make device-costs` measured on this GPU
(theory/op_costs.py), nothing fitted to any step.
"""
from __future__ import annotations

from typing import List

PARTS = ("forward", "backward", "optimizer", "other", "comm_exposed")
BOUND = 30  # percent, as `make time-check` holds each part


def error(measured: float, predicted: float) -> float:
    return 100 * (measured - predicted) / predicted if predicted else float("nan")


def render(rows: List[dict], device: str, source: str) -> str:
    ok = [r for r in rows if r.get("status") == "ok" and "time/forward_predicted_s" in r.get("figures", {})]
    lines = [f"# The time model on one {device}: each part measured against predicted", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "", f"Device costs: {source or 'none measured here'}.", "",
             "| run | part | measured ms | predicted ms | error | predicted host ms | predicted kernels ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    within = total = 0
    for r in ok:
        f, who = r["figures"], f"{r['model']}/{r['backend']}"
        for part in PARTS + ("step",):
            measured = f.get("time/profiled_step_s" if part == "step" else f"time/{part}_s")
            predicted = f.get(f"time/{part}_predicted_s")
            if measured is None or predicted is None or (part == "comm_exposed" and predicted < 1e-6):
                continue
            host = sum(f.get(f"time/{part}_{t}_predicted_s", 0.0) for t in ("host", "lines"))
            kernels = sum(f.get(f"time/{part}_{t}_predicted_s", 0.0) for t in ("arithmetic", "memory"))
            err = error(measured, predicted)
            if part != "step":
                total += 1
                within += abs(err) <= BOUND
            lines.append(f"| {who} | {part} | {measured * 1e3:.2f} | {predicted * 1e3:.2f} | {err:+.0f}% | "
                         + (f"{host * 1e3:.2f} | {kernels * 1e3:.2f} |" if part in PARTS[:4] else "- | - |"))
        timed = f.get("throughput/step_time_p50_s")
        if timed:
            lines.append(f"| {who} | timed step (p50, no profiler) | {timed * 1e3:.2f} | "
                         f"{f['time/step_predicted_s'] * 1e3:.2f} | {error(timed, f['time/step_predicted_s']):+.0f}% | - | - |")
    lines[2:2] = [f"**{within} of {total} parts within {BOUND}%** over {len(ok)} runs.", ""]
    missing = [f"{r.get('model')}/{r.get('backend')} ({r.get('status')})" for r in rows if r not in ok]
    if missing:
        lines += ["", "Runs without a prediction: " + ", ".join(missing)]
    return "\n".join(lines) + "\n"

"""The time model against a GPU's measured steps: `time_model.md` of `make gpu-check` (studies/gpu/check.py), one
row per run and part, measured beside predicted.

What is measured: each part is the profiler's (runtime/measure/time_profile.py: a phase is the busy time of the kernels
launched inside it, `other` the rest of the profiled step, mostly the device waiting on the host), on a step
after the timed window; the timed steps' median is beside it. What is predicted: the step's counted work
(runtime/measure/work_count.py) priced at the device costs `make device-costs` measured on this GPU
(theory/op_costs.py), nothing fitted to any step.
"""
from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import List, Optional

PARTS = ("forward", "backward", "optimizer", "other", "comm_exposed")
BOUND = 30  # percent, as `make time-check` holds each part


def read_run(run_dir: Path) -> tuple:
    """(its rank-0 Chrome trace, its ranks' reports), each None where the run dir has none."""
    from ...core.records import RankReport

    trace, report = run_dir / "traces" / "rank0.json.gz", run_dir / "ranks" / "report.json"
    return (json.loads(gzip.open(trace).read()) if trace.exists() else None,
            [RankReport.from_dict(r) for r in json.loads(report.read_text())["ranks"]] if report.exists() else None)


def refresh(row: dict, run_dir: Path, record: Optional[dict], trace: Optional[dict], ranks: Optional[list]) -> dict:
    """The row with its time figures taken again from what its run dir holds: the measured parts from its Chrome
    `trace` (runtime/measure/time_profile.Timeline.from_chrome, as the loop measures them now), and the predicted ones
    from its `ranks`' counted work priced at the device-costs `record` (results/device_costs/cuda.json), the
    timed steps' median from the reports where the summary has none. So a run whose breakdown was measured
    under an older rule, or whose prediction failed, is set beside the model as it stands."""
    figures = dict(row.get("figures") or {})
    if trace:
        from ...runtime.measure.time_profile import Timeline

        timeline = Timeline.from_chrome(trace)
        windows = sorted(timeline.ranges.get("step", []))
        if windows:
            parts = timeline.step(windows[-1])
            figures.update({f"time/{k}_s": v for k, v in parts.items() if k != "step"})
            figures["time/profiled_step_s"] = parts["step"]
    if record and ranks:
        from omegaconf import OmegaConf

        from ...reporting.time_and_comm import device_costs, slowest_rank
        from ...theory.op_costs import predict_counted
        from ...theory.shape import shape_of

        cfg = OmegaConf.load(run_dir / "config.yaml")
        work = slowest_rank(ranks).work
        if work:
            parts = predict_counted(cfg.backend, shape_of(cfg, None, ranks[0].params), work, device_costs(record))
            figures.update({f"time/{k}_predicted_s": v for k, v in parts.items()})
        if "throughput/step_time_p50_s" not in figures and ranks[0].timed_step_s:
            figures["throughput/step_time_p50_s"] = statistics.median(ranks[0].timed_step_s)
    return {**row, "figures": figures}


def write(out: Path, runs: List[tuple], record: Optional[dict], device: str) -> None:
    """time_model.md and, for runs with a trace, time_by_op.md under `out`, from (row, run dir) pairs, each run
    dir read once."""
    from ...core.rundir import write_text
    from ...reporting.time_and_comm import device_costs

    timed, traced = [], []
    for row, run_dir in runs:
        trace, ranks = read_run(run_dir)
        timed.append(refresh(row, run_dir, record, trace, ranks))
        if trace and ranks and record:
            traced.append((f"{row['model']}/{row['backend']}", trace, ranks[0].work or {}))
    if not any("time/forward_predicted_s" in r["figures"] for r in timed):
        return
    costs = device_costs(record) if record else None
    source = f"{costs.source}; host costs {costs.host.source if costs.host else 'none'}" if costs else ""
    write_text(out / "time_model.md", render(timed, device, source))
    if traced:
        write_text(out / "time_by_op.md", render_by_op(traced, record))


def error(measured: float, predicted: float) -> float:
    return 100 * (measured - predicted) / predicted if predicted else float("nan")


def render(rows: List[dict], device: str, source: str) -> str:
    ok = [r for r in rows if "time/forward_predicted_s" in r.get("figures", {}) and "time/forward_s" in r["figures"]]
    lines = [f"# The time model on one {device}: each part measured against predicted", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "", f"Device costs: {source or 'none measured here'}.", "",
             "| run | part | measured ms | predicted ms | error | the phase's predicted host ms | its predicted kernels ms |",
             "|---|---|---:|---:|---:|---:|---:|"]
    within = total = 0
    for r in ok:
        f, who = r["figures"], f"{r['model']}/{r['backend']}"
        for part in PARTS + ("step",):
            measured = f.get("time/profiled_step_s" if part == "step" else f"time/{part}_s")
            predicted = f.get(f"time/{part}_predicted_s")
            if measured is None or predicted is None or (part == "comm_exposed" and max(measured, predicted) < 1e-4):
                continue  # one rank: nothing to expose, measured or predicted
            host = sum(f.get(f"time/{part}_{t}_predicted_s", 0.0) for t in ("host", "lines"))
            kernels = sum(f.get(f"time/{part}_{t}_predicted_s", 0.0) for t in ("arithmetic", "memory"))
            err = error(measured, predicted)
            if part != "step":
                total += 1
                within += abs(err) <= BOUND
            lines.append(f"| {who} | {part} | {measured * 1e3:.2f} | {predicted * 1e3:.2f} | {err:+.0f}% | "
                         + (f"{host * 1e3:.2f} | {kernels * 1e3:.2f} |" if part in PARTS[:4] else "- | - |"))
        if r.get("status") != "ok":
            lines.append(f"| {who} | (the run's row reads {r.get('status')}: {(r.get('reason') or '')[:90]}) | | | | | |")
        timed = f.get("throughput/step_time_p50_s")
        if timed:
            lines.append(f"| {who} | timed step (p50, no profiler) | {timed * 1e3:.2f} | "
                         f"{f['time/step_predicted_s'] * 1e3:.2f} | {error(timed, f['time/step_predicted_s']):+.0f}% | - | - |")
    lines[2:2] = [f"**{within} of {total} parts within {BOUND}%** over {len(ok)} runs.", ""]
    missing = [f"{r.get('model')}/{r.get('backend')} ({r.get('status')})" for r in rows if r not in ok]
    if missing:
        lines += ["", "Runs without a prediction: " + ", ".join(missing)]
    return "\n".join(lines) + "\n"


def _base(name: str) -> str:
    """An aten op without its overload (`aten::mul.Tensor` -> `aten::mul`): the trace names ops without one."""
    return name.split(".")[0]


def launcher(chain: List[str], counted) -> str:
    """Of the ops enclosing a kernel's launch (outermost first), the one the work counter counted for it: the
    innermost counted one (autocast's `addmm` wraps the `_to_copy` that casts its weight, and both are counted),
    except a `copy_` that `_to_copy` runs, which the counter sees as the `_to_copy`."""
    names = [_base(n) for n in chain]
    for i in range(len(names) - 1, -1, -1):
        if names[i] in counted:
            if names[i] == "aten::copy_" and i and names[i - 1] == "aten::_to_copy":
                return "aten::_to_copy"
            return names[i]
    return names[-1] if names else "?"


def by_op(trace: dict, work: dict, record: dict, phase: str) -> List[tuple]:
    """[(op, kernels, measured s, counted ops, predicted s)] of one phase: each kernel of the Chrome trace set
    against the op that launched it (`launcher`), beside the op's predicted kernel time. Where a phase's miss
    comes from, op by op."""
    import bisect
    import collections

    from ...reporting.time_and_comm import device_costs
    from ...runtime.measure.time_profile import PREFIX
    from ...theory.op_costs import op_rows, op_seconds

    costs = device_costs(record)
    predicted = collections.defaultdict(lambda: [0, 0.0])
    for r in op_rows(work):
        if r.phase == phase:
            s = op_seconds(r, costs)
            predicted[_base(r.op)][0] += r.count
            predicted[_base(r.op)][1] += (s["arithmetic"] + s["memory"]) * r.count
    events = trace.get("traceEvents", [])
    inside = [(e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "user_annotation" and e.get("name") == PREFIX + phase]
    ops = collections.defaultdict(list)  # thread -> its ops by start
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e["tid"]].append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    for spans in ops.values():
        spans.sort()
    launches = {e["args"]["correlation"]: (e["ts"], e["tid"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    measured = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        launch = launches.get(e.get("args", {}).get("correlation")) if e.get("cat") in (
            "kernel", "gpu_memcpy", "gpu_memset") else None
        if not launch or not any(a <= launch[0] < b for a, b in inside):
            continue
        spans = ops[launch[1]]
        chain = [n for a, b, n in spans[:bisect.bisect_right(spans, (launch[0], float("inf"), ""))]
                 if a <= launch[0] <= b]  # enclosing ops, outermost first
        name = launcher(chain, predicted)
        measured[name][0] += 1
        measured[name][1] += e["dur"] / 1e6
    names = set(measured) | set(predicted)
    return sorted(((n, measured[n][0], measured[n][1], predicted[n][0], predicted[n][1]) for n in names),
                  key=lambda row: -abs(row[2] - row[4]))


def render_by_op(runs: List[tuple], record: dict, top: int = 6) -> str:
    """time_by_op.md: for each run (label, trace, work) and phase, the ops whose kernels miss most."""
    lines = ["# Where each part's miss comes from, op by op", "",
             by_op.__doc__.split("\n\n")[0].replace("\n    ", " ").strip(), "",
             "| run | phase | op | kernels | measured ms | counted ops | predicted ms |", "|---|---|---|---:|---:|---:|---:|"]
    for label, trace, work in runs:
        for phase in PARTS[:3]:
            for name, kernels, m, n, p in by_op(trace, work, record, phase)[:top]:
                lines.append(f"| {label} | {phase} | {name} | {kernels} | {m * 1e3:.2f} | {n} | {p * 1e3:.2f} |")
    return "\n".join(lines) + "\n"

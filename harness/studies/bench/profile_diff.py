"""Where the harness's step differs from an independent loop's: both under torch's profiler with Python stacks,
then their traces diffed by op and by Python frame (`make bench ARGS="--profile fsdp"`).

    python -m harness bench --profile fsdp [--profile-steps 3] [overrides...]

The harness runs with `train.profile=true train.profile_stack=true train.breakdown_steps=<k>` (k profiled steps
after its timed window, plus the profiler's own warm-up step); the independent loop (studies/bench/independent_loop.py)
profiles k steps the same way, with the same profiler settings. For rank 0 of each, every complete event of the
main thread gets its self time (its duration less its children's), and the self times are summed per step by
op (`cpu_op`: aten and the collectives) and by Python frame (`python_function`, file and function), and the
profiled steps' wall time is read from the profiler's own `ProfilerStep#n` ranges. What one loop spends and the
other does not, per step, sorted by the difference, is the diff; the profiler's overhead falls on both sides.
"""
from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

FRAME = re.compile(r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<func>.*)$")


def load(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def frame_key(name: str) -> str:
    """A Python frame by file and function (lines move between versions; functions do not), trimmed to the
    package path: `torch/distributed/fsdp/...: foo`, `harness/runtime/loop.py: __call__`."""
    m = FRAME.match(name)
    if not m:
        return re.sub(r" at 0x[0-9a-f]+", "", re.sub(r"pybind11_detail_function_record\S*", "pybind11", name))
    path = m.group("file")
    for root in ("site-packages/", "/work/", "harness/"):
        if root in path:
            path = path.split(root, 1)[1] if root != "harness/" else "harness/" + path.split(root, 1)[1]
            break
    return f"{path}: {m.group('func')}"


def nested_self_times(events: List[dict]) -> List[tuple]:
    """(event, self µs) for events that nest by time (cpu_ops of one thread: aten::linear around aten::addmm)."""
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    out, stack = [], []  # stack: [event, children's µs]

    for e in events:
        while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
            event, children = stack.pop()
            out.append((event, max(event["dur"] - children, 0.0)))
        if stack:
            stack[-1][1] += e["dur"]
        stack.append([e, 0.0])
    out += [(event, max(event["dur"] - children, 0.0)) for event, children in stack]
    return out


def python_self_times(events: List[dict]) -> List[tuple]:
    """(event, self µs) for Python frames, by the tracer's own tree ("Python id" and "Python parent id"): the
    frames already running when the profiler started end where it stopped, so they do not nest by time."""
    children: Dict[int, float] = defaultdict(float)
    for e in events:
        parent = e.get("args", {}).get("Python parent id")
        if parent is not None:
            children[parent] += e["dur"]
    return [(e, max(e["dur"] - children.get(e.get("args", {}).get("Python id"), 0.0), 0.0)) for e in events]


def self_times(trace: dict) -> dict:
    """Per-step self time (µs) and count by op and by Python frame on the busiest thread of the trace, and the
    mean step wall time from ProfilerStep ranges."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    by_thread: Dict[tuple, List[dict]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    main = max(by_thread.values(), key=lambda es: sum(e["dur"] for e in es if e.get("cat") == "cpu_op"))
    ops: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0])
    frames: Dict[str, List[float]] = defaultdict(lambda: [0.0, 0])
    for table, pairs, key in (
            (ops, nested_self_times([e for e in main if e.get("cat") == "cpu_op"]), lambda e: e["name"]),
            (frames, python_self_times([e for e in main if e.get("cat") == "python_function"]),
             lambda e: frame_key(e["name"]))):
        for event, own in pairs:
            table[key(event)][0] += own
            table[key(event)][1] += 1
    n = max(len(steps), 1)
    per_step = lambda table: {k: (v[0] / n, v[1] / n) for k, v in table.items()}  # noqa: E731
    return {"steps": len(steps), "step_us": sum(e["dur"] for e in steps) / n, "ops": per_step(ops),
            "frames": per_step(frames)}


def diff(harness: dict, independent: dict, kind: str, top: int = 15) -> List[dict]:
    """The `kind` ("ops" or "frames") that differ most per step: harness µs, independent µs, counts."""
    keys = set(harness[kind]) | set(independent[kind])
    rows = [{"name": k, "harness_us": harness[kind].get(k, (0, 0))[0], "independent_us": independent[kind].get(k, (0, 0))[0],
             "harness_count": harness[kind].get(k, (0, 0))[1], "independent_count": independent[kind].get(k, (0, 0))[1]}
            for k in keys]
    for r in rows:
        r["delta_us"] = r["harness_us"] - r["independent_us"]
    return sorted(rows, key=lambda r: -abs(r["delta_us"]))[:top]


def count_differences(harness: dict, independent: dict) -> List[dict]:
    """The ops called a different number of times a step in the two loops: deterministic, unlike their times."""
    rows = diff(harness, independent, "ops", top=10**6)
    return sorted([r for r in rows if abs(r["harness_count"] - r["independent_count"]) > 0.01],
                  key=lambda r: r["name"])


def render(folder: Path, backend: str) -> List[str]:
    """The diff of the traces a `make bench ARGS="--profile <backend>"` left in <folder>/<backend>-{ops,stack}."""
    pairs = []
    for kind in ("ops", "stack"):
        run_dir = folder / f"{backend}-{kind}"
        harness = next((run_dir / "traces").glob("rank0.*"))
        pairs.append((self_times(load(harness)), self_times(load(run_dir / "independent_trace.json"))))
    return markdown(backend, *pairs)


def markdown(backend: str, ops: tuple, frames: tuple) -> List[str]:
    """The diff tables: `ops` and `frames` are (harness, independent) self_times of the profiles without and
    with Python stacks."""
    lines = [f"### {backend}: per profiled step, rank 0", "",
             f"Step wall time under the profiler: harness {ops[0]['step_us'] / 1e3:.2f} ms, independent "
             f"{ops[1]['step_us'] / 1e3:.2f} ms without Python stacks; {frames[0]['step_us'] / 1e3:.2f} and "
             f"{frames[1]['step_us'] / 1e3:.2f} ms with them. Self time in µs a step (an op's or frame's own time, "
             "its children's taken out), and calls a step. Ops from the profile without stacks, frames from the "
             "one with.", ""]
    for kind, title, (harness, independent) in (("ops", "op", ops), ("frames", "Python frame", frames)):
        lines += [f"| {title} | harness µs | independent µs | difference | harness calls | independent calls |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| `{r['name'][:90]}` | {r['harness_us']:,.0f} | {r['independent_us']:,.0f} | {r['delta_us']:+,.0f} | "
                  f"{r['harness_count']:g} | {r['independent_count']:g} |" for r in diff(harness, independent, kind)]
        total = {side: sum(v[0] for v in table[kind].values()) for side, table in (("h", harness), ("i", independent))}
        lines += ["", f"All {title}s' self time a step: harness {total['h'] / 1e3:,.1f} ms, independent "
                  f"{total['i'] / 1e3:,.1f} ms.", ""]
    extra = count_differences(*ops)
    lines += ["Ops whose count a step differs (what one loop does and the other does not; the profile without "
              "stacks):", "", "| op | harness calls | independent calls | harness µs | independent µs |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| `{r['name'][:80]}` | {r['harness_count']:g} | {r['independent_count']:g} | {r['harness_us']:,.0f} | "
              f"{r['independent_us']:,.0f} |" for r in extra]
    lines.append("")
    own = {k: v for k, v in frames[0]["frames"].items() if k.startswith("harness/")}
    lines += [f"The harness's own Python frames (harness/...): {sum(v[0] for v in own.values()) / 1e3:.2f} ms a step "
              "under the profiler, an upper bound on what its code adds in Python.", ""]
    return lines

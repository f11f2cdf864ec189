"""The report's first lines: what the sweep found, with how sure it is.

Per group of runs that differ only in backend: the fastest (the table's tokens/s), the least memory (the table's
peak of live tensors), and which neighbours in the ranking are inside the noise. The noise is each run's own: a
95% bootstrap interval of its median step time over the timed window's steps (metrics.jsonl, warm-up
excluded), as `make bench` reports its ratios. Two runs whose intervals overlap are a tie, not a ranking. An
interval is within one launch; launches on a shared machine differ by more (`results/bench/README.md`), which
the verdict says. On a CPU it also says that the ranking does not carry over to GPUs.
"""
from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..core.rundir import RunDir

RESAMPLES = 2000
MIN_STEPS = 5  # fewer timed steps give no interval
MiB = 2**20


def timed_steps(sweep_dir: Path, row: dict) -> List[float]:
    """The step times of the timed window (metrics.jsonl's lines after warm-up)."""
    lines = RunDir(Path(sweep_dir) / row["run_dir"]).read_metrics() if row.get("run_dir") else []
    return [m["throughput/step_time_s"] for m in lines if not m.get("warmup") and "throughput/step_time_s" in m]


def median_interval(times: List[float], level: float = 0.95, seed: int = 0) -> Optional[Tuple[float, float]]:
    """A percentile-bootstrap interval of the median (seeded: the same report from the same runs)."""
    if len(times) < MIN_STEPS:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(times, k=len(times))) for _ in range(RESAMPLES))
    tail = (1 - level) / 2
    return medians[int(tail * RESAMPLES)], medians[int((1 - tail) * RESAMPLES) - 1]


def _ms(interval: Tuple[float, float]) -> str:
    return f"{interval[0] * 1e3:.1f}-{interval[1] * 1e3:.1f} ms"


def group_verdict(members: List[Tuple[dict, str, Optional[Tuple[float, float]], int]]) -> List[str]:
    """Sentences for one group: members are (row, label, step interval, timed steps)."""
    ranked = sorted(members, key=lambda m: -m[0]["figures"]["throughput/tokens_per_s"])
    row, label, interval, steps = ranked[0]
    f = row["figures"]
    fastest = f"Fastest: {label}, {f['throughput/tokens_per_s']:,.0f} tokens/s"
    if interval:
        fastest += f" (median step 95% interval {_ms(interval)} over its {steps} timed steps)"
    out = [fastest + "."]
    with_peak = [m for m in members if m[0]["figures"].get("memory/peak_mem_bytes")]
    if with_peak:
        lean = min(with_peak, key=lambda m: m[0]["figures"]["memory/peak_mem_bytes"])
        most = max(with_peak, key=lambda m: m[0]["figures"]["memory/peak_mem_bytes"])
        out.append(f"Least memory: {lean[1]}, {lean[0]['figures']['memory/peak_mem_bytes'] / MiB:,.2f} MiB of live "
                   f"tensors a rank at its peak (the most: {most[1]}, "
                   f"{most[0]['figures']['memory/peak_mem_bytes'] / MiB:,.2f} MiB).")
    ties = [(a, b) for a, b in zip(ranked, ranked[1:])
            if a[2] and b[2] and a[2][0] <= b[2][1] and b[2][0] <= a[2][1]]
    if ties:
        out.append("Inside the noise (their median steps' intervals overlap, so their order is not measured): "
                   + "; ".join(f"{a[1]} and {b[1]}" for a, b in ties) + ".")
    elif len(ranked) > 1 and all(m[2] for m in ranked):
        out.append("Every neighbour in the ranking is apart beyond its runs' intervals.")
    return out


def sentences(rows: List[dict], labels: List[str], group_of: Callable[[dict], tuple], sweep_dir: Path) -> List[str]:
    """The verdict: per group of runs that differ only in backend, then what the intervals do not cover."""
    groups: Dict[tuple, list] = {}
    for r, label in zip(rows, labels):
        if r.get("status") == "ok" and (r.get("figures") or {}).get("throughput/tokens_per_s"):
            times = timed_steps(sweep_dir, r)
            groups.setdefault(group_of(r), []).append((r, label, median_interval(times), len(times)))
    out = []
    for key, members in groups.items():
        lines = group_verdict(members)
        out += [f"{' '.join(k.strip(chr(39)) for k in key)}: {lines[0]}" if key and len(groups) > 1 else lines[0],
                *lines[1:]]
    if out and not any(m[2] for members in groups.values() for m in members):
        out.append(f"No run had the {MIN_STEPS} timed steps an interval needs; launches on a shared machine differ by "
                   "up to 16% (one config's forward and backward across runs on this project's 2-core machine: "
                   "results/bench/README.md), so read a smaller gap as noise.")
    elif out:
        out.append("Each interval is within one launch; launches on a shared machine differ by more (one config's "
                   "forward and backward spread 16% across runs on this project's 2-core machine: "
                   "results/bench/README.md), so rerun the sweep before trusting a gap of that size.")
    if any(str(r.get("device", "")).startswith("cpu") for r in rows):
        out.append("This ranking is a CPU's: there a step is host work (Python, op dispatch, gloo over loopback), and "
                   "it does not carry over to GPUs, where compute and NCCL decide and the order differs "
                   "(results/gpu/, docs/gpu.md).")
    return out

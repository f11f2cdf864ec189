"""The advisor's frontier: the candidates that fit and that no other fitting candidate beats on both predicted
tokens/s per GPU and predicted peak memory per GPU (the Pareto frontier), each with the time model's measured
error band, and a plot of them.

The band is not fitted to anything: it is the spread of measured ÷ predicted that the last committed check of
the same time model on the same kind of device found.
- A plan priced by the counted-work model on this CPU: the step times of `make time-check`
  (results/time_check/time_check.json), 10th to 90th percentile of measured ÷ predicted.
- A CUDA plan with no GPU here: step times are the roofline at the committed rates of the GPU measured last
  (results/device_costs/cuda.json), else at an H100's datasheet peak. Its band is what the lent GPUs measured
  against that roofline on llama_1b (results/gpu/*/axes.json, `make gpu-axes`): measured ÷ roofline = the
  roofline's matmul rate in the run's precision ÷ the rate the run achieved (100 / MFU at the datasheet peak).

Two candidates whose bands overlap are a tie: the model cannot order them.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import List, Optional, Tuple

from ...core.paths import REPO
from .search import Candidate, Plan, size


def band(p: Plan) -> Optional[Tuple[float, float, str]]:
    """(lowest, highest measured ÷ predicted, where it comes from), or None where no check has measured it."""
    if p.device == "cpu":
        path = REPO / "results" / "time_check" / "time_check.json"
        if not path.exists():
            return None
        steps = [r["parts"]["step"] for r in json.loads(path.read_text())["rows"] if r.get("status") == "ok"]
        ratios = sorted(s["measured_s"] / s["predicted_s"] for s in steps if s.get("predicted_s"))
        if len(ratios) < 10:
            return None
        deciles = statistics.quantiles(ratios, n=10)
        return deciles[0], deciles[-1], f"make time-check's {len(ratios)} CPU steps, 10th to 90th percentile"
    return cuda_band(bool(p.rates.get("rates_committed")))


def cuda_band(committed: bool) -> Optional[Tuple[float, float, str]]:
    """The band of a CUDA shape's roofline, at the committed GPU measurement's rates (`committed`, as
    predict/rates.py's rates_for priced it where no GPU is) or at the datasheet's:
    measured ÷ the roofline's compute, over the lent GPUs' llama_1b runs, is the roofline's matmul rate in the
    run's precision over the rate the run achieved (at the datasheet peak, 100 / MFU)."""
    from ...reporting.time_and_comm import committed_gpu_rates
    from ...theory.time import STATED_CUDA_TFLOPS

    measured = committed_gpu_rates() if committed else None
    rates = measured["tflops"] if measured else STATED_CUDA_TFLOPS
    ratios, where = [], []
    for path in sorted((REPO / "results" / "gpu").glob("*/axes.json")):
        rows = [r for r in json.loads(path.read_text())["rows"] if r["status"] == "ok"]
        ratios += [rates[r["precision"]] / r["figures"]["flops/achieved_tflops_per_device"] for r in rows
                   if r["figures"].get("flops/achieved_tflops_per_device") and r["precision"] in rates]
        where.append(path.parent.name)
    if not ratios:
        return None
    return min(ratios), max(ratios), (f"llama_1b on one {', '.join(where)} against the same roofline "
                                      f"(make gpu-axes, {len(ratios)} runs)")


def frontier(p: Plan) -> List[Candidate]:
    """The fitting candidates no other fitting one beats on both tokens/s and peak, from the smallest peak up."""
    fitting = p.priced  # not a candidate only bounded by its twin's step (search.Candidate.step_from)
    out = [c for c in fitting
           if not any(o.predicted_tokens_per_s >= c.predicted_tokens_per_s and o.predicted_peak_bytes
                      <= c.predicted_peak_bytes and (o.predicted_tokens_per_s, o.predicted_peak_bytes)
                      != (c.predicted_tokens_per_s, c.predicted_peak_bytes) for o in fitting)]
    return sorted(out, key=lambda c: c.predicted_peak_bytes)


def tied(a: Candidate, b: Candidate, measured: Optional[Tuple[float, float, str]]) -> bool:
    """Their bands overlap: each prediction divided by the band's ends, the faster one's slow end below the
    slower one's fast end."""
    if measured is None:
        return False
    low, high = measured[:2]
    fast, slow = sorted((a.predicted_tokens_per_s, b.predicted_tokens_per_s), reverse=True)
    return fast / high <= slow / low


def lines(p: Plan) -> List[str]:
    """The frontier, each point with its band, and the winner against the runner-up: by how much, or a tie."""
    measured, points = band(p), frontier(p)
    if not points:
        return []
    per_gpu = lambda c: c.predicted_tokens_per_s / p.world  # noqa: E731 (the candidates' figure is the world's)
    rng = (lambda c: f", measured would be {per_gpu(c) / measured[1]:,.0f} to "  # noqa: E731
           f"{per_gpu(c) / measured[0]:,.0f}") if measured else (lambda c: "")
    bounded = len(p.fitting) - len(p.priced)
    out = [f"Frontier ({len(points)} of {len(p.priced)} that fit and were priced; none of the others is faster at a "
           "lower peak" + (f"; {bounded} only bounded by a twin doing no more work (step_times.bounded_by_twin) are "
                           "left out" if bounded else "") + "):"]
    out += [f"  {c.name} ({c.mesh or 'dp'}): peak {size(c.predicted_peak_bytes)} a GPU, "
            f"{per_gpu(c):,.0f} tokens/s a GPU predicted{rng(c)}" for c in points]
    # what a smaller budget could still run: checkpointing or a smaller micro-batch buys memory for time
    lowest = min((c for c in p.fitting if c.step_from), key=lambda c: c.predicted_peak_bytes, default=None)
    if lowest is not None and lowest.predicted_peak_bytes < points[0].predicted_peak_bytes:
        out.append(f"  lower, not priced: {lowest.name} ({lowest.mesh or 'dp'}) peaks at "
                   f"{size(lowest.predicted_peak_bytes)} a GPU, at most {per_gpu(lowest):,.0f} tokens/s a GPU (its "
                   f"twin {lowest.step_from}'s); a budget below the frontier's replays it")
    out.append(f"Error band: measured / predicted {measured[0]:.2f} to {measured[1]:.2f}x on {measured[2]}."
               if measured else "Error band: none measured for this device and time model yet.")
    fastest = sorted(p.priced, key=lambda c: (-c.predicted_tokens_per_s, c.predicted_peak_bytes))  # the top point
    if len(fastest) > 1:
        first, second = fastest[0], next((c for c in fastest[1:] if c.backend != fastest[0].backend), fastest[1])
        gap = 100 * (first.predicted_tokens_per_s / second.predicted_tokens_per_s - 1)
        headroom = p.budget_bytes - first.predicted_peak_bytes
        if tied(first, second, measured):
            out.append(f"A tie within the band: {first.name} is predicted {gap:.1f}% faster than {second.name}, "
                       "less than the band's spread; probe both (advise without --dry-run) to order them.")
        else:
            out.append(f"Winner {first.name}, {gap:.1f}% faster than the runner-up {second.name}, beyond the band; "
                       f"{link_words(first)} against {link_words(second)}, {size(headroom)} of headroom under the "
                       "budget.")
    return out


def link_words(c: Candidate) -> str:
    """The bytes a rank sends a step, on each kind of link (the dry run's recommendation says them too)."""
    return (f"{c.predicted_intra_node_bytes / 1e9:,.1f} GB a step inside a node and "
            f"{c.predicted_inter_node_bytes / 1e9:,.1f} GB across nodes per rank")


def plot(p: Plan, path: Path) -> None:
    """Predicted tokens/s against predicted peak, every candidate that fits, the frontier joined, the band
    drawn around it, and the budget."""
    from ...reporting.plots import pyplot

    measured, points = band(p), frontier(p)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    gib = 2**30
    colours = {}
    for c in p.priced:
        colour = colours.setdefault(c.backend, f"C{len(colours) % 10}")
        ax.scatter(c.predicted_peak_bytes / gib, c.predicted_tokens_per_s / p.world, color=colour, s=18, alpha=0.5)
    xs, ys = [c.predicted_peak_bytes / gib for c in points], [c.predicted_tokens_per_s / p.world for c in points]
    ax.plot(xs, ys, color="k", marker="o", label="frontier (predicted)")
    if measured:
        ax.fill_between(xs, [y / measured[1] for y in ys], [y / measured[0] for y in ys], color="k", alpha=0.12,
                        step=None, label=f"measured would be ({measured[0]:.2f}-{measured[1]:.2f}x)")
    for c, x, y in zip(points, xs, ys):
        ax.annotate(c.name, (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
    for backend, colour in colours.items():
        ax.scatter([], [], color=colour, label=backend)
    ax.axvline(p.budget_bytes / gib, color="k", linestyle="--", label="budget")
    ax.set(xlabel="predicted peak per GPU (GiB)", ylabel="predicted tokens/s per GPU",
           title=f"{p.model} on {p.world} {p.device} ranks: the frontier")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

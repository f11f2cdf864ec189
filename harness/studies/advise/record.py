"""The advisor's answer as it is written and shown: its tables, advice.md and advice.json, its plot, and its W&B run
(studies/advise/answer.py decides the answer)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List
from ...config.compose import compose
from ...core.rundir import write_json, write_text
from ...reporting.plots import pyplot
from ...reporting.sweep_report import log_summary_run
from . import frontier as advise_frontier
from .search import Candidate, Plan, size, to_dict


def error_pct(c: Candidate):
    return None if not c.peak_bytes else 100 * (c.peak_bytes - c.predicted_peak_bytes) / c.predicted_peak_bytes


def table(p: Plan) -> List[str]:
    """The measured candidates, fastest first, with theory beside each figure."""
    rows = sorted((c for c in p.candidates if c.status), key=lambda c: (c.status != "ok", -(c.tokens_per_s or 0)))
    lines = ["| rank | candidate | probe | status | tokens/s | noise | predicted | peak | predicted | headroom |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, c in enumerate(rows, 1):
        headroom = f"{100 * (1 - c.peak_bytes / p.budget_bytes):.0f}%" if c.peak_bytes and c.status == "ok" else "-"
        rate = f"{c.tokens_per_s:,.0f}" if c.tokens_per_s and c.status == "ok" else "-"
        status = c.status + (" (reused)" if c.reused else "")  # an earlier probe: same config, code and device
        noise = f"±{c.noise_pct:.1f}% ({len(c.runs)} run{'s' if len(c.runs) > 1 else ''})" \
            if c.noise_pct is not None and c.status == "ok" else "-"
        lines.append(f"| {i if c.status == 'ok' else ''} | {c.name} | {c.role} | {status} | {rate} | {noise} | "
                     f"{c.predicted_tokens_per_s:,.0f} | {size(c.peak_bytes)} | {size(c.predicted_peak_bytes)} | {headroom} |")
    return lines


def theory_table(p: Plan) -> List[str]:
    lines = ["| candidate | mesh | grad_accum | predicted peak | fits | GB/step in a node | GB/step across nodes "
             "| predicted step ms | predicted tokens/s |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {c.name} | {c.mesh} | {c.grad_accum} | {size(c.predicted_peak_bytes)} | {'yes' if c.fits else 'no'} | "
              f"{c.predicted_intra_node_bytes / 1e9:,.2f} | {c.predicted_inter_node_bytes / 1e9:,.2f} | "
              f"{'≥' if c.step_from else ''}{c.predicted_step_s * 1e3:,.2f} | {'≤' if c.step_from else ''}"
              f"{c.predicted_tokens_per_s:,.0f} |" for c in p.candidates]
    return lines


def write(p: Plan, result: dict, out: Path, command: str) -> None:
    rates = p.rates
    lines = [f"# Advice: {p.model} on {p.world} {p.device} rank(s), {p.precision}, global batch {p.global_batch}, "
             f"{size(p.budget_bytes)} per rank", "", f"**{result['sentence']}**", "", f"Command: `{command}`", "",
             "## Measured candidates", "",
             "Each probe: 10 steps (2 warm-up) under `train.memory_budget_bytes`; tokens/s over the timed steps "
             "(the mean of the runs where a close race was run again); noise = (p90 - p50) / p50 of the step "
             "time, or how far the runs differ if more; "
             "peak = the device's peak of live tensors (CUDA: the allocator's; CPU: the profiled step's, less "
             "offloaded host states). Headroom = budget less the measured peak.", "", *table(p), "",
             "## Why each backend lost", "", *[f"- **{b}**: {w}" for b, w in result["why"].items()], ""]
    if result["misses"]:
        lines += ["## Where the memory model was wrong", "",
                  *[f"- {m['candidate']}: {m['why']} (peak {size(m['peak_bytes'])}, predicted "
                    f"{size(m['predicted_peak_bytes'])})" for m in result["misses"]], ""]
    errors = [error_pct(c) for c in p.candidates if c.status == "ok" and c.peak_bytes]
    speed = [c.tokens_per_s / c.predicted_tokens_per_s for c in p.candidates if c.status == "ok" and c.tokens_per_s]
    lines += ["## Theory", "",
              f"Peak memory: theory/predict.py; measured against predicted over the probes that trained: median "
              f"{statistics.median(errors) if errors else float('nan'):+.1f}%. Step time: "
              f"{rates.get('time_model', 'roofline lower bound')}; the roofline with this device's measured matmul "
              f"peak ({rates['matmul_tflops']:.3g} TFLOP/s) and copy bandwidth ({rates['copy_gbps']:.3g} GB/s), "
              f"{rates['flops_per_token']:,.0f} FLOPs per token (FlopCounterMode), collectives from "
              f"{'this machine' if rates['collectives_measured'] else 'the stated default link'}"
              f"; measured ÷ predicted tokens/s: median {statistics.median(speed) if speed else float('nan'):.2f} "
              "(theory orders the candidates; the probes decide).", "", *theory_table(p), "",
              "![advice](advice.png)", "", "## The predicted frontier", "", *advise_frontier.lines(p), "",
              "![frontier](frontier.png)", ""]
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "advice.json", {"command": command, **result, "plan": to_dict(p)})
    write_text(out / "advice.md", "\n".join(lines))
    plot(p, result, out / "advice.png")
    advise_frontier.plot(p, out / "frontier.png")
    log_wandb(p, result, out)
    print("\n".join([f"\n{result['sentence']}\n", *table(p), "", *[f"  {b}: {w}" for b, w in result["why"].items()],
                     "", f"written to {out}/advice.{{md,json,png}}"]))


def plot(p: Plan, result: dict, path: Path) -> None:
    """Tokens/s against device peak per probed candidate: measured (filled) joined to predicted (hollow), one
    colour per backend, the winner starred, OOMs as crosses on a band below at the peak they reached, and
    the budget as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    probed = [c for c in p.candidates if c.status]
    speeds = [v for c in probed for v in (c.tokens_per_s, c.predicted_tokens_per_s) if v]
    floor = min(speeds) / 3 if speeds else 1.0  # the OOM band
    colours: Dict[str, str] = {}
    failed: Dict[float, List[str]] = {}  # OOMs at the same peak share one label
    for c in probed:
        colour = colours.setdefault(c.backend, f"C{len(colours) % 10}")
        mib = lambda b: b / 2**20  # noqa: E731
        ax.scatter(mib(c.predicted_peak_bytes), c.predicted_tokens_per_s, facecolors="none", edgecolors=colour)
        if c.status == "ok" and c.tokens_per_s:
            ax.plot([mib(c.predicted_peak_bytes), mib(c.peak_bytes)], [c.predicted_tokens_per_s, c.tokens_per_s],
                    color=colour, linewidth=0.6, alpha=0.6)
            star = c.name == result["winner"]
            ax.scatter(mib(c.peak_bytes), c.tokens_per_s, color=colour, marker="*" if star else "o", s=180 if star else 40)
            ax.annotate(c.name, (mib(c.peak_bytes), c.tokens_per_s), fontsize=7, xytext=(4, -10), textcoords="offset points")
        elif c.peak_bytes:
            ax.scatter(mib(c.peak_bytes), floor, color=colour, marker="x")
            failed.setdefault(round(mib(c.peak_bytes), 1), []).append(f"{c.name} ({c.status})")
    for x, names in failed.items():
        ax.annotate("\n".join(names), (x, floor), fontsize=7, xytext=(4, 4), textcoords="offset points")
    for backend, colour in colours.items():
        ax.scatter([], [], color=colour, label=backend)
    ax.axvline(p.budget_bytes / 2**20, color="k", linestyle="--", label="budget")
    ax.set(xlabel="device peak per rank (MiB)", ylabel="tokens/s (log; OOMs on the bottom band)", yscale="log",
           title=f"{p.model}: measured (filled), predicted (hollow), budget {size(p.budget_bytes)}")
    ax.set_ylim(floor / 2, max(speeds, default=1.0) * 2)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_wandb(p: Plan, result: dict, out: Path) -> None:
    """One W&B run of job type `advise` with the answer, the table and the plot, unless the logger is off."""
    columns = ["candidate", "status", "tokens_per_s", "predicted_tokens_per_s", "peak_bytes", "predicted_peak_bytes"]
    rows = [[c.name, c.status, c.tokens_per_s, c.predicted_tokens_per_s, c.peak_bytes, c.predicted_peak_bytes]
            for c in p.candidates if c.status]
    log_summary_run(compose(p.overrides), out, f"advise-{out.name}", "advise", "advice/table", columns, rows,
                    images={"advice/plot": out / "advice.png"},
                    summary={"advice/sentence": result["sentence"], "advice/winner": result["winner"]})

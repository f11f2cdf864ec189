"""The plots of a sweep's report, one function each (matplotlib, Agg). Each takes the ok rows with their
labels and returns a saved figure's path, or None when there is nothing to draw."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..core.rundir import RunDir

MiB = 2**20
Labelled = List[Tuple[dict, str]]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def tradeoff(ok: Labelled, out_dir: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for r, lab in ok:
        x, y = r["figures"].get("memory/peak_mem_bytes", 0) / MiB, r["figures"]["throughput/tokens_per_s"]
        ax.scatter(x, y, s=50)
        ax.annotate(lab, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set(xscale="log", xlabel="peak tensor memory per rank (MiB, log)", ylabel="tokens/s (global)",
           title="Throughput against peak memory (up and left is better)")
    ax.grid(alpha=0.3)
    return _save(fig, out_dir / "tradeoff.png")


def bars(ok: Labelled, out_dir: Path) -> Path:
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5))
    names = [lab for _, lab in ok]
    axes[0].barh(names, [r["figures"]["throughput/tokens_per_s"] for r, _ in ok], color="tab:blue")
    axes[0].set(xlabel="tokens/s (global)", title="Throughput")
    axes[1].barh(names, [r["figures"].get("memory/peak_mem_bytes", 0) / MiB for r, _ in ok], color="tab:orange")
    axes[1].set(xscale="log", xlabel="MiB per rank (log)", title="Peak tensor memory")
    axes[1].set_yticklabels([])
    return _save(fig, out_dir / "bars.png")


def memory_predicted_vs_measured(ok: Labelled, out_dir: Path) -> Path:
    fig, ax = pyplot().subplots(figsize=(11, 4.5))
    width, xs = 0.27, range(len(ok))
    for i, (key, name) in enumerate((("memory/model_states_paper_bytes", "paper formula"),
                                     ("memory/model_states_predicted_bytes", "predicted (layout)"),
                                     ("memory/model_states_total_bytes_max", "measured (max rank)"))):
        ax.bar([x + (i - 1) * width for x in xs], [r["figures"].get(key, 0) / MiB for r, _ in ok], width,
               label=name)
    ax.set_xticks(list(xs), [lab for _, lab in ok], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="MiB per rank", title="Model-state memory: predicted against measured")
    ax.legend()
    return _save(fig, out_dir / "memory_predicted_vs_measured.png")


MEASURED_KINDS = ("params", "grads", "optimizer", "activations", "temporaries", "unattributed")
PEAK_PHASES = ("forward_end", "backward_start", "block_backward", "gradient_reduce", "step", "param_gather")  # theory/peak.PHASES


def peak_by_kind(ok: Labelled, out_dir: Path) -> Optional[Path]:
    """Two bars per run, measured and predicted, each split into its kinds as a share of its own total, with
    the total in MiB at its end: one shared MiB axis would hide a 3 MiB run beside DeepSpeed's 2 GB bucket."""
    ok = [(r, lab) for r, lab in ok if "memory/tensor_peak_bytes_max" in r["figures"]]
    if not ok:
        return None
    predicted_terms = ("model states", "buffers", "activations (theory)", "transients (the peak's phase)")
    fig, ax = pyplot().subplots(figsize=(11, 0.9 * len(ok) + 2.2))
    colours = pyplot().get_cmap("tab10")
    for i, (r, lab) in enumerate(ok):
        f = r["figures"]
        measured = [f.get(f"memory/tensor_peak_{k}_bytes", 0) for k in MEASURED_KINDS]
        # the phase the theory puts the peak in, and its terms beyond states and buffers; a negative term
        # (gradients that do not exist yet) is taken off the states, so that every segment is a size
        phase = max(PEAK_PHASES, key=lambda ph: f.get(f"memory/peak_at_{ph}_predicted_bytes", 0))
        terms = {k: v for k, v in f.items() if k.startswith(f"memory/{phase}_") and k.endswith("_predicted_bytes")}
        activations = terms.pop(f"memory/{phase}_activations_predicted_bytes", 0)
        predicted = [f.get("memory/model_states_predicted_bytes", 0) + sum(min(v, 0) for v in terms.values()),
                     f.get("memory/buffers_predicted_bytes", 0), activations, sum(max(v, 0) for v in terms.values())]
        for row, values, names, offset in ((2 * i, measured, MEASURED_KINDS, 0), (2 * i + 1, predicted, predicted_terms, 6)):
            total, left = sum(values), 0.0
            for j, (v, name) in enumerate(zip(values, names)):
                share = 100 * v / total if total else 0
                ax.barh(row, share, left=left, color=colours(j + offset), label=name if i == 0 else None)
                left += share
            ax.text(101, row, f"{total / MiB:,.2f} MiB", va="center", fontsize=7)
    ax.set_yticks([x for i in range(len(ok)) for x in (2 * i, 2 * i + 1)],
                  [f"{lab} {side}" for _, lab in ok for side in ("measured", "predicted")], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlim=(0, 118), xlabel="% of the bar's own peak (rank with the highest peak); the total is at its end",
           title="Peak tensor memory by kind: measured and predicted")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.09))
    return _save(fig, out_dir / "peak_by_kind.png")


TIME_PARTS = ("forward", "backward", "optimizer", "comm_exposed", "other")


def time_breakdown(ok: Labelled, out_dir: Path) -> Optional[Path]:
    """Two bars per run, the measured step and the time model's, each stacked by part (ms)."""
    ok = [(r, lab) for r, lab in ok if "time/forward_s" in r["figures"]]
    if not ok:
        return None
    fig, ax = pyplot().subplots(figsize=(11, 0.9 * len(ok) + 2.2))
    colours = pyplot().get_cmap("tab10")
    for i, (r, lab) in enumerate(ok):
        f = r["figures"]
        for row, suffix in ((2 * i, "_s"), (2 * i + 1, "_predicted_s")):
            left = 0.0
            for j, part in enumerate(TIME_PARTS):
                ms = 1e3 * f.get(f"time/{part}{suffix}", 0.0)
                ax.barh(row, ms, left=left, color=colours(j), label=part.replace("_", " ") if i == 0 and row == 0 else None)
                left += ms
            if suffix == "_predicted_s" and "time/step_predicted_s" not in f:
                ax.text(0, row, " no prediction (FLOPs not measured)", va="center", fontsize=7)
    ax.set_yticks([x for i in range(len(ok)) for x in (2 * i, 2 * i + 1)],
                  [f"{lab} {side}" for _, lab in ok for side in ("measured", "predicted")], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="ms per step (rank with the slowest step); 'other' is not modelled",
           title="Where the step time goes: measured and predicted")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.09))
    return _save(fig, out_dir / "time_breakdown.png")


def loss_curves(rows: Labelled, sweep_dir: Path, out_dir: Path) -> Optional[Path]:
    curves = [(lab, [x for x in RunDir(sweep_dir / r["run_dir"]).read_metrics()
                     if x.get("loss/loss") is not None and "step" in x]) for r, lab in rows]
    curves = [(lab, recs) for lab, recs in curves if recs]
    if not curves:
        return None
    fig, ax = pyplot().subplots(figsize=(9, 4.5))
    for lab, recs in curves:
        ax.plot([x["step"] for x in recs], [x["loss/loss"] for x in recs], marker=".", label=lab, alpha=0.8)
    ax.set(xlabel="step", ylabel="loss (mean over ranks)", title="Loss curves: parity across backends")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, out_dir / "loss_curves.png")


# what each plot shows, as the report captions it (a caption was the file's name: "tradeoff", "bars")
CAPTIONS = {
    "tradeoff": "Throughput against peak tensor memory per rank: up and to the left is better.",
    "bars": "Throughput (tokens/s over all ranks) and peak tensor memory per rank, per backend.",
    "memory_predicted_vs_measured": "Model states per rank: the ZeRO paper's formula, the memory model's layout "
                                    "and the measured bytes (the largest rank).",
    "peak_by_kind": "The peak of live tensors per rank split by kind, measured beside predicted.",
    "time_breakdown": "Where the step time goes: forward, backward compute, the optimizer, exposed communication "
                      "and the rest, measured beside the time model's prediction.",
    "loss_curves": "Loss per step for every run of the sweep.",
}


def caption(stem: str) -> str:
    return CAPTIONS.get(stem, stem.replace("_", " "))


def all_plots(rows: List[dict], labels: List[str], sweep_dir: Path, out_dir: Path) -> Dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    labelled = list(zip(rows, labels))
    ok = [(r, lab) for r, lab in labelled if r.get("status") == "ok" and r["figures"]]
    made = [tradeoff(ok, out_dir), bars(ok, out_dir), memory_predicted_vs_measured(ok, out_dir),
            peak_by_kind(ok, out_dir), time_breakdown(ok, out_dir)] if ok else []
    made.append(loss_curves(labelled, sweep_dir, out_dir))
    return {p.stem: p for p in made if p is not None}

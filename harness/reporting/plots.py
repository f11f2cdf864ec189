"""The plots of a sweep's report, one function each (matplotlib, Agg). Each takes the ok rows with their
labels and returns a saved figure's path, or None when there is nothing to draw."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..config import families
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
    """One marker per run, named in the legend beside the plot: labels written at the points collide when
    runs sit close together (eight backends of one tiny model do)."""
    fig, ax = pyplot().subplots(figsize=(9, 4.5))
    markers = "os^Dv<>Ph*X"
    for i, (r, lab) in enumerate(ok):
        x, y = r["figures"].get("memory/peak_mem_bytes", 0) / MiB, r["figures"]["throughput/tokens_per_s"]
        ax.scatter(x, y, s=60, marker=markers[i % len(markers)], label=lab, alpha=0.85)
    ax.set(xscale="log", xlabel="peak tensor memory per rank (MiB, log)", ylabel="tokens/s (global)",
           title="Throughput against peak memory (up and left is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
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


# runtime/measure/memory_profile.KINDS
KINDS = ("params", "grads", "optimizer", "activations", "temporaries", "unattributed")
PEAK_PHASES = ("forward_end", "backward_start", "block_backward", "gradient_reduce", "step", "param_gather")  # theory/peak.PHASES
STATE_KIND = {"params": "params", "grads": "grads", "master": "optimizer", "optimizer": "optimizer"}


def predicted_kinds(f: dict) -> Dict[str, float]:
    """The predicted peak in the measured kinds: the states by component, the theory's activations at the
    peak's phase, and its buffers and transient terms (buckets, gathered layers, the optimizer's temporaries)
    as temporaries. A negative term (gradients that do not exist yet at that moment) comes off the grads."""
    out = dict.fromkeys(KINDS, 0.0)
    for component, kind in STATE_KIND.items():
        out[kind] += f.get(f"memory/model_states_{component}_predicted_bytes", 0) + \
            f.get(f"memory/model_states_host_{component}_predicted_bytes", 0)
    phase = max(PEAK_PHASES, key=lambda ph: f.get(f"memory/peak_at_{ph}_predicted_bytes", 0))
    terms = {k: v for k, v in f.items() if k.startswith(f"memory/{phase}_") and k.endswith("_predicted_bytes")}
    out["activations"] = terms.pop(f"memory/{phase}_activations_predicted_bytes", 0)
    out["grads"] += sum(min(v, 0) for v in terms.values())
    out["temporaries"] = f.get("memory/buffers_predicted_bytes", 0) + sum(max(v, 0) for v in terms.values())
    return out


def peak_by_kind(ok: Labelled, out_dir: Path) -> Optional[Path]:
    """One panel per run, all on one MiB axis (log when the sizes span more than 30x): for each kind a
    measured bar and a predicted one, in that kind's colour (predicted hatched), and the totals."""
    ok = [(r, lab) for r, lab in ok if "memory/tensor_peak_bytes_max" in r["figures"]]
    if not ok:
        return None
    plt = pyplot()
    colours = plt.get_cmap("tab10")
    cols = 2 if len(ok) > 1 else 1
    rows = -(-len(ok) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.3 * rows + 1.2), sharex=True, squeeze=False)
    sizes = []
    names = (*KINDS, "total")
    for ax, (r, lab) in zip(axes.flat, ok):
        f = r["figures"]
        measured = {k: f.get(f"memory/tensor_peak_{k}_bytes", 0) for k in KINDS}
        measured["total"] = f["memory/tensor_peak_bytes_max"]
        predicted = predicted_kinds(f)
        predicted["total"] = f.get("memory/tensor_peak_predicted_bytes", 0)
        for j, kind in enumerate(names):
            colour = "0.35" if kind == "total" else colours(j)
            ax.barh(j - 0.2, measured[kind] / MiB, 0.4, color=colour, label="measured" if j == 0 else None)
            ax.barh(j + 0.2, predicted[kind] / MiB, 0.4, color=colour, alpha=0.45, hatch="//",
                    label="predicted" if j == 0 else None)
        sizes += [v / MiB for v in (*measured.values(), *predicted.values()) if v > 0]
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{lab}: {measured['total'] / MiB:,.2f} MiB measured, "
                     f"{predicted['total'] / MiB:,.2f} predicted", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(ok):]:
        ax.set_visible(False)
    log = bool(sizes) and max(sizes) / min(sizes) > 30
    for ax in axes[-1]:
        ax.set_xlabel("MiB per rank" + (" (log)" if log else ""), fontsize=8)
    if log:  # down to 1e-5 of the largest: a few KiB beside a 2 GB bucket would only stretch the axis
        axes[0][0].set_xscale("log")
        axes[0][0].set_xlim(left=max(min(sizes) / 2, max(sizes) * 1e-5))
        for ax in axes.flat:  # minor ticks on eight shared log axes cost a second of layout, and say nothing
            ax.minorticks_off()
    fig.suptitle("Peak of live tensors per rank by kind: measured (solid) and predicted (hatched), "
                 "on one axis", fontsize=10)
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
                ax.text(0, row, " no prediction (no counted work: train.count_collectives=false)", va="center", fontsize=7)
    ax.set_yticks([x for i in range(len(ok)) for x in (2 * i, 2 * i + 1)],
                  [f"{lab} {side}" for _, lab in ok for side in ("measured", "predicted")], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="ms per step (rank with the slowest step); predicted: the step's counted work at the device's "
                  "measured costs (theory/op_costs.py)",
           title="Where the step time goes: measured and predicted")
    ax.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.09))
    return _save(fig, out_dir / "time_breakdown.png")


def loss_curves(rows: Labelled, sweep_dir: Path, out_dir: Path) -> Optional[Path]:
    """The first run's loss (all_plots puts the baseline first), and every other run's difference from it: identical curves drawn over each other hide
    any disagreement, a difference of zero shows it."""
    curves = [(lab, {x["step"]: x["loss/loss"] for x in RunDir(sweep_dir / r["run_dir"]).read_metrics()
                     if x.get("loss/loss") is not None and "step" in x}) for r, lab in rows]
    curves = [(lab, losses) for lab, losses in curves if losses]
    if not curves:
        return None
    (ref_label, ref), others = curves[0], curves[1:]
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(12, 4.5))
    left.plot(list(ref), list(ref.values()), marker=".", color="0.3", label="training")
    held_out = {x["step"]: x["eval/loss"] for x in RunDir(sweep_dir / rows[0][0]["run_dir"]).read_metrics()
                if x.get("eval/loss") is not None}
    if held_out:  # train.eval_every: the held-out split's loss at its steps
        left.plot(list(held_out), list(held_out.values()), marker="o", color="C3", label="held-out (eval)")
        left.legend(fontsize=7)
    left.set(xlabel="step", ylabel="loss (mean over ranks)", title=f"Loss of {ref_label}")
    for lab, losses in others:
        steps = [s for s in losses if s in ref]
        right.plot(steps, [losses[s] - ref[s] for s in steps], marker=".", label=lab, alpha=0.8)
    right.axhline(0, color="0.3", lw=0.8)
    right.set(xlabel="step", ylabel=f"loss minus {ref_label}'s", title=f"Every other run's difference from {ref_label}")
    if others:
        right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return _save(fig, out_dir / "loss_curves.png")


def sequence_scaling(ok: Labelled, out_dir: Path) -> Optional[Path]:
    """Tokens/s and peak per rank against the sequence, a line per backend and mesh: drawn when the sweep varies
    the sequence (experiments/long_context: the ring against Ulysses)."""
    def seq(r: dict):
        return r["config"].get("parallelism.seq_len")

    ok = [(r, lab) for r, lab in ok if seq(r) is not None]  # a run that died before its config names none
    if len({seq(r) for r, _ in ok}) < 2:
        return None
    lines: Dict[str, list] = {}
    for r, _ in ok:
        method = r.get("mesh") or f"cp {r['config'].get('parallelism.cp', 1)}"  # "dp 2 x cp 2 (ring)"
        lines.setdefault(f"{r.get('backend')}, {method}", []).append(r)
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5))
    for name, rows in sorted(lines.items()):
        rows = sorted(rows, key=seq)
        xs = [seq(r) for r in rows]
        axes[0].plot(xs, [r["figures"]["throughput/tokens_per_s"] for r in rows], marker="o", label=name)
        axes[1].plot(xs, [r["figures"].get("memory/peak_mem_bytes", 0) / MiB for r in rows], marker="o", label=name)
    from matplotlib.ticker import NullLocator

    sequences = sorted({seq(r) for r, _ in ok})
    axes[0].set(ylabel="tokens/s (global)", title="Throughput")
    axes[1].set(ylabel="MiB per rank", title="Peak tensor memory per rank")
    for ax in axes:  # the sequences themselves as ticks, in plain numbers: log-scale labels collide at 2x steps
        ax.set_xscale("log", base=2)
        ax.set_xticks(sequences, [f"{x:,}" for x in sequences])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("sequence (tokens, log)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return _save(fig, out_dir / "sequence_scaling.png")


# what each plot shows, as the report captions it (a caption was the file's name: "tradeoff", "bars")
CAPTIONS = {
    "tradeoff": "Throughput against peak tensor memory per rank: up and to the left is better.",
    "bars": "Throughput (tokens/s over all ranks) and peak tensor memory per rank, per backend.",
    "memory_predicted_vs_measured": "Model states per rank: the ZeRO paper's formula, the memory model's layout "
                                    "and the measured bytes (the largest rank).",
    "peak_by_kind": "The peak of live tensors per rank split by kind, measured beside predicted, one panel per "
                    "run on a shared axis.",
    "time_breakdown": "Where the step time goes: forward, backward compute, the optimizer, exposed communication "
                      "and the rest, measured beside the time model's prediction.",
    "loss_curves": "The reference run's loss per step, and every other run's difference from it (zero is parity).",
    "sequence_scaling": "Tokens/s and peak tensor memory per rank against the sequence length, a line per backend "
                        "and mesh (the ring under FSDP2 and DDP; Ulysses under DeepSpeed, and under FSDP2 and DDP "
                        "with parallelism.cp_method=ulysses).",
}


def caption(stem: str) -> str:
    return CAPTIONS.get(stem, stem.replace("_", " "))


def all_plots(rows: List[dict], labels: List[str], sweep_dir: Path, out_dir: Path) -> Dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    labelled = list(zip(rows, labels))
    ok = [(r, lab) for r, lab in labelled if r.get("status") == "ok" and r["figures"]]
    made = [tradeoff(ok, out_dir), bars(ok, out_dir), memory_predicted_vs_measured(ok, out_dir),
            peak_by_kind(ok, out_dir), time_breakdown(ok, out_dir), sequence_scaling(ok, out_dir)] if ok else []
    # the loss reference: the registry's first family's representative (DDP, the baseline every strategy is
    # held equal to), else the first run
    baseline = families.representatives()[0]
    made.append(loss_curves(sorted(labelled, key=lambda rl: rl[0].get("backend") != baseline), sweep_dir, out_dir))
    return {p.stem: p for p in made if p is not None}

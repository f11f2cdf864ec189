"""The tables, the seeds' comparison and the plot of `make gpu-capacity` (studies/capacity/gpu.py), from its
capacity.json alone: pure, so that a test can read what a user will."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from ...core.rundir import write_text
from ...reporting.plots import pyplot
from ..flags import defaults

GIB = 2**30
OFFLOADING = tuple(defaults("capacity")["offloading"])  # conf/studies.yaml, with the baseline
BASELINE = defaults("capacity")["baseline"]


def billions(params: Optional[float]) -> str:
    """Parameters as a reader counts them: 7.58B, or 1.69M on the CPU's ladder."""
    if params is None:
        return "-"
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.2f}M"


def unit(result: dict) -> tuple[float, str]:
    """GiB for a card, MiB for the CPU's emulated one (tens of MiB)."""
    return (GIB, "GiB") if result["card_bytes"] >= GIB else (2**20, "MiB")


def size(value: Optional[float], divisor: float) -> str:
    return "-" if value is None else f"{value / divisor:,.1f}"


def rung(row: dict, i: Optional[int]) -> Optional[dict]:
    return row["predicted"][i] if i is not None and 0 <= i < len(row["predicted"]) else None


def probe_at(row: dict, i: Optional[int]) -> dict:
    return next((p for p in row.get("probes", []) if p["rung"] == i), {})


def verdict(row: dict) -> str:
    """Theory against the probes: right, missed by how many rungs, or not settled (and why)."""
    if not row.get("resolved"):
        return "not settled: the call's time ran out" if not row.get("finished", True) else "not settled"
    largest, guess = row["largest"], row["guess"]
    if largest == guess:
        return "theory right"
    if largest is None:
        return f"theory missed: predicted {row['predicted'][guess]['name']}, the smallest rung failed"
    if guess < 0:
        return f"theory missed: predicted none, {row['predicted'][largest]['name']} trained"
    return f"theory missed by {largest - guess:+d} rung(s)"


def measured_table(result: dict) -> List[str]:
    div, label = unit(result)
    lines = ["| backend | largest that trained | smallest that did not | theory's boundary (next rung bound by) | "
             f"device peak {label} (predicted) | host peak {label} (host states predicted) | step s | model setup s | "
             "probes | verdict |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for b, row in result["rows"].items():
        top, fail, guess = rung(row, row.get("largest")), rung(row, row.get("smallest_failed")), rung(row, row["guess"])
        at, failed_at = probe_at(row, row.get("largest")), probe_at(row, row.get("smallest_failed"))
        why = f" ({failed_at['status']})" if failed_at else ""
        lines.append(
            f"| {b} | {top['name'] + ': ' + billions(top['params']) if top else 'none'} | "
            f"{fail['name'] + ': ' + billions(fail['params']) + why if fail else '-'} | "
            f"{billions(guess['params']) if guess else 'none'} ({row['bound']}) | "
            f"{size(at.get('device_peak_bytes'), div)} ({size(top['device_bytes'], div) if top else '-'}) | "
            f"{size(at.get('host_peak_bytes'), div)} ({size(top['host_bytes'], div) if top else '-'}) | "
            f"{fmt(at.get('step_s'), '.2f')} | {fmt(at.get('setup_s'), '.1f')} | {len(row.get('probes', []))} | "
            f"{verdict(row)} |")
    return lines


def fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def predicted_table(result: dict) -> List[str]:
    div, label = unit(result)
    lines = [f"| backend | largest predicted to fit | device peak {label} | host states {label} | next rung | bound by |",
             "|---|---:|---:|---:|---|---|"]
    for b, row in result["rows"].items():
        top, nxt = rung(row, row["guess"]), rung(row, row["guess"] + 1)
        lines.append(f"| {b} | {top['name'] + ': ' + billions(top['params']) if top else 'none'} | "
                     f"{size(top['device_bytes'], div) if top else '-'} | {size(top['host_bytes'], div) if top else '-'} | "
                     f"{nxt['name'] + ': ' + billions(nxt['params']) if nxt else '-'} | {row['bound']} |")
    return lines


def largest_params(row: dict, predicted: bool) -> Optional[float]:
    found = rung(row, row["guess"] if predicted else row.get("largest"))
    return found["params"] if found else None


def seeds_comparison(result: dict) -> List[str]:
    """The ZeRO-Offload paper's headline restated for this card: DDP's 16 bytes a parameter against what the
    offload backends keep on the device, and what bounds them here (the card, or the host's RAM)."""
    rows, predicted = result["rows"], result["predict_only"]
    card, host = result["card_bytes"], result["host_bytes"]
    word = "predicted" if predicted else "measured"
    div, label = unit(result)
    out = [f"Under DDP the model states take 16 bytes a parameter (fp32 weights or masters, fp32 gradients, Adam's "
           f"two fp32 moments): {size(card, div)} {label} / 16 B = {billions(card / 16)} parameters before any "
           "activation. The paper's V100 (32 GB) gives 2B by the same count, and DDP stopped at 1.4B there."]
    ddp = rows.get(BASELINE)
    base = largest_params(ddp, predicted) if ddp else None
    if ddp:
        out.append(f"- {BASELINE}: {billions(base)} ({word}).")
    for b in OFFLOADING:
        if b not in rows:
            continue
        row = rows[b]
        top = largest_params(row, predicted)
        ratio = f", {top / base:.1f}x DDP's" if top and base else ""
        guess = rung(row, row["guess"])
        per_param = guess["host_bytes"] / guess["params"] if guess else None
        bound = (f"the host's RAM bounds it: {per_param:.0f} B a parameter of host states against "
                 f"{size(host, GIB)} GiB" if row["bound"] == "host" and per_param else f"bound by the {row['bound']}")
        cost = ""
        if not predicted and base:
            mine, theirs = probe_at(row, row.get("largest")).get("step_s"), probe_at(ddp, ddp.get("largest")).get("step_s")
            if mine and theirs:
                cost = (f"; a step at its boundary takes {mine:.1f} s against DDP's {theirs:.2f} s at DDP's "
                        f"({mine / theirs:.0f}x the time for {top / base:.1f}x the parameters)")
        reach = rung(row, row.get("card_only_guess"))
        if row["bound"] == "host" and reach:
            top_rung = row.get("card_only_guess") == len(row["predicted"]) - 1
            bound += (f"; with RAM to spare the card alone would hold {'at least ' if top_rung else ''}"
                      f"{billions(reach['params'])} (predicted)")
        out.append(f"- {b}: {billions(top)} ({word}{ratio}); {bound}{cost}.")
    if predicted:
        out.append("No step time is predicted here: the time model prices an offloaded AdamW at the device's "
                   "memory bandwidth, not the host's, so it would flatter every offload backend.")
    return out


def write_report(result: dict, folder: Path, name: str) -> None:
    predicted = result["predict_only"]
    head = [f"# Capacity on one card: {result['device']}" + (" (theory only, no probe)" if predicted else ""), "",
            f"Command(s): {'; '.join(f'`{c}`' for c in result.get('commands', [result['command']]))}.", "",
            f"Card {size(result['card_bytes'], unit(result)[0])} {unit(result)[1]}, host RAM "
            f"{size(result['host_bytes'], GIB)} GiB. Shape: {' '.join(result['shape'])}. Ladder: "
            f"{', '.join(n.split('=')[-1] for n in result['ladder'])}. A rung fits in theory when its "
            f"predicted device peak and its host model states, each with {result['margin']:.0%} headroom, fit "
            "the card and the host (studies/capacity/gpu.py).", ""]
    if not predicted:
        head += ["Each probe: 3 steps, 1 of warm-up; the device peak is the allocator's (the emulated budget's "
                 "profiled peak on CPU), the host peak the process's RSS high-water mark, the step the timed "
                 "steps' median, and model setup the seconds to build, initialise and wrap the model.", ""]
    table = predicted_table(result) if predicted else measured_table(result)
    body = [*head, *table, "", "## The seeds' comparison on this card", "", *seeds_comparison(result), "",
            f"![capacity]({name}.png)", ""]
    write_text(folder / f"{name}.md", "\n".join(body))
    plot(result, folder / f"{name}.png")
    print("\n".join(table))


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    rows = list(result["rows"].values())
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = range(len(rows))
    theory = [(largest_params(r, True) or 0) / 1e9 for r in rows]
    if result["predict_only"]:
        ax.bar(list(xs), theory, 0.6, label="theory")
    else:
        ax.bar([x - 0.2 for x in xs], [(largest_params(r, False) or 0) / 1e9 for r in rows], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], theory, 0.4, label="theory")
    ax.set_xticks(list(xs), [r["backend"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="parameters (B)", title=f"Largest trainable Llama: {result['device']}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

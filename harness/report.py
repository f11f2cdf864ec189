"""The offline dashboard of a sweep: report.md, a self-contained report.html, and the plots.

    python -m harness.report <sweep_dir>        (make report SWEEP=<sweep_dir>)

Built from the run dirs alone, so it can be rebuilt at any time, and it tolerates runs that died at any
point: they are rows with their status, and the plots skip what they lack. Plots are matplotlib (Agg).
"""
from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

from . import results, sweep

MiB = 2**20
# (header, value, format, which is best: "max", "min" or None)
TABLE = [
    ("tokens/s", lambda f: f.get("throughput/tokens_per_s"), "{:,.0f}", "max"),
    ("tokens/s/device", lambda f: f.get("throughput/tokens_per_s_per_device"), "{:,.0f}", "max"),
    ("samples/s", lambda f: f.get("throughput/samples_per_s"), "{:,.1f}", "max"),
    ("step p50 ms", lambda f: _scale(f.get("throughput/step_time_p50_s"), 1e3), "{:.1f}", "min"),
    ("step p90 ms", lambda f: _scale(f.get("throughput/step_time_p90_s"), 1e3), "{:.1f}", "min"),
    ("step max ms", lambda f: _scale(f.get("throughput/step_time_max_s"), 1e3), "{:.1f}", "min"),
    ("TFLOP/s/device", lambda f: f.get("flops/achieved_tflops_per_device"), "{:.4f}", "max"),
    ("MFU %", lambda f: f.get("flops/mfu_pct"), "{:.2f}", "max"),
    ("peak mem MiB", lambda f: _scale(f.get("memory/peak_mem_bytes"), 1 / MiB), "{:,.0f}", "min"),
    ("states MiB/rank", lambda f: _scale(f.get("memory/model_states_total_bytes_max"), 1 / MiB), "{:.3f}", "min"),
    ("states predicted", lambda f: _scale(f.get("memory/model_states_predicted_bytes"), 1 / MiB), "{:.3f}", None),
    ("error %", lambda f: f.get("memory/model_states_error_pct"), "{:+.2f}", None),
    ("paper MiB", lambda f: _scale(f.get("memory/model_states_paper_bytes"), 1 / MiB), "{:.3f}", None),
    ("comm MiB/step", lambda f: _scale(f.get("comm/predicted_bytes_per_step"), 1 / MiB), "{:.2f}", "min"),
    ("final loss", lambda f: f.get("loss/final_loss"), "{:.5f}", None),
]

METHODS = """\
- **Timing.** Steps before `train.warmup_steps` are excluded. Each step is timed from the end of the previous
  one, after a device synchronisation (`torch.cuda.synchronize`; CPU kernels are synchronous), so a step is
  everything the loop does. A synchronous step lasts as long as its slowest rank: throughput uses the
  per-step maximum over ranks. p50/p90/max are over the timed steps.
- **FLOPs and MFU.** FLOPs per token are counted once with `torch.utils.flop_counter.FlopCounterMode` on a
  meta-device copy of the model; 6·(N−N_emb) + 12·L·h·s is shown beside it. MFU uses the counted figure and
  the device's dense datasheet peak, or on CPU a peak measured by a matmul calibration (labelled measured).
- **Peak memory.** GPU: the caching allocator's peak allocated and reserved bytes over the timed window
  (`reset_peak_memory_stats` when it opens). CPU: the kernel's RSS high-water mark (`VmHWM`), reset
  when the timed window opens (`5 > /proc/self/clear_refs`). Max over ranks.
- **Model states.** Bytes of the distinct storages each rank holds for parameters, gradients, master
  weights and optimizer states (local shards, DeepSpeed's flat partitions, offloaded copies labelled host),
  counted after the first timed backward. "predicted" is `harness/memory_model.py`'s layout of the
  backend; "paper" the ZeRO paper's formula; "error" is measured (max over ranks) against predicted.
- **Loss.** The mean over all ranks and micro-batches of each step's loss, identical data on every backend.
"""


def _scale(x, k):
    return None if x is None else x * k


def _label(row: dict, varying: List[str]) -> str:
    keys = [k for k in varying if k != "backend.name"]
    extra = ",".join(str(row["config"].get(k)) for k in keys)
    return f"{row.get('backend', '?')}" + (f" [{extra}]" if extra else "")


def _losses(run_dir: Path) -> List[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a run killed mid-write leaves at most one partial line
            pass
    return out


def _group(row: dict, varying: List[str]) -> tuple:
    """Runs that differ only in backend are compared with each other (best is per model, precision, ...)."""
    return tuple(repr(row["config"].get(k)) for k in varying if k != "backend.name")


def best_cells(rows: List[dict], varying: List[str]) -> Dict[tuple, Dict[str, Optional[float]]]:
    best: Dict[tuple, Dict[str, Optional[float]]] = {}
    for group in {_group(r, varying) for r in rows}:
        members = [r for r in rows if _group(r, varying) == group and r.get("status") == "ok"]
        best[group] = {}
        for header, get, _, direction in TABLE:
            values = [get(r["figures"]) for r in members if get(r["figures"]) is not None]
            best[group][header] = (max(values) if direction == "max" else min(values)) if values and direction \
                else None
    return best


def _plots(rows: List[dict], labels: List[str], sweep_dir: Path, out_dir: Path) -> Dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [(r, lab) for r, lab in zip(rows, labels) if r.get("status") == "ok" and r["figures"]]
    made: Dict[str, Path] = {}

    def save(fig, name):
        path = out_dir / f"{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made[name] = path

    if ok:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r, lab in ok:
            x, y = r["figures"]["memory/peak_mem_bytes"] / MiB, r["figures"]["throughput/tokens_per_s"]
            ax.scatter(x, y, s=50)
            ax.annotate(lab, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set(xlabel="peak memory per rank (MiB)", ylabel="tokens/s (global)",
               title="Throughput against peak memory (up and left is better)")
        ax.grid(alpha=0.3)
        save(fig, "tradeoff")

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        names = [lab for _, lab in ok]
        axes[0].barh(names, [r["figures"]["throughput/tokens_per_s"] for r, _ in ok], color="tab:blue")
        axes[0].set(xlabel="tokens/s (global)", title="Throughput")
        axes[1].barh(names, [r["figures"]["memory/peak_mem_bytes"] / MiB for r, _ in ok], color="tab:orange")
        axes[1].set(xlabel="MiB per rank", title="Peak memory")
        axes[1].set_yticklabels([])
        save(fig, "bars")

        fig, ax = plt.subplots(figsize=(11, 4.5))
        width = 0.27
        xs = range(len(ok))
        for i, (key, name) in enumerate((("memory/model_states_paper_bytes", "paper formula"),
                                         ("memory/model_states_predicted_bytes", "predicted (layout)"),
                                         ("memory/model_states_total_bytes_max", "measured (max rank)"))):
            ax.bar([x + (i - 1) * width for x in xs], [r["figures"].get(key, 0) / MiB for r, _ in ok], width,
                   label=name)
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        ax.set(ylabel="MiB per rank", title="Model-state memory: predicted against measured")
        ax.legend()
        save(fig, "memory_predicted_vs_measured")

    curves = [(lab, _losses(sweep_dir / r["run_dir"])) for r, lab in zip(rows, labels)]
    curves = [(lab, [x for x in recs if x.get("loss/loss") is not None and "step" in x]) for lab, recs in curves]
    curves = [(lab, recs) for lab, recs in curves if recs]
    if curves:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for lab, recs in curves:
            ax.plot([x["step"] for x in recs], [x["loss/loss"] for x in recs], marker=".", label=lab, alpha=0.8)
        ax.set(xlabel="step", ylabel="loss (mean over ranks)", title="Loss curves: parity across backends")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        save(fig, "loss_curves")
    return made


def _inline(text: str) -> str:
    """The markdown this report uses (**bold**, `code`) as HTML."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _cell(value, fmt, best) -> tuple[str, bool]:
    if value is None:
        return "", False
    return fmt.format(value), best is not None and value == best


def build(sweep_dir: Path, rows: Optional[List[dict]] = None) -> Path:
    """Write the report; `rows` are sweep.collect(sweep_dir), read again when not given."""
    sweep_dir = Path(sweep_dir)
    rows = sweep.collect(sweep_dir) if rows is None else rows
    varying = sweep.varying_keys(rows)
    labels = [_label(r, varying) for r in rows]
    plots = _plots(rows, labels, sweep_dir, sweep_dir / "plots")
    best = best_cells(rows, varying)
    headers = ["run", "status"] + [h for h, *_ in TABLE]
    body = []
    for r, lab in zip(rows, labels):
        cells = [(lab, False), (r.get("status", "?"), False)]
        cells += [_cell(get(r["figures"]), fmt, best[_group(r, varying)][h]) for h, get, fmt, _ in TABLE]
        body.append(cells)
    failed = [(lab, r) for r, lab in zip(rows, labels) if r.get("status") != "ok"]
    def distinct(key):
        return ", ".join(sorted({str(r.get(key)) for r in rows if r.get(key) is not None})) or "?"

    context = (f"{len(rows)} runs; model {distinct('model')}, world size {distinct('world_size')}, precision "
               f"{distinct('precision')}, device {distinct('device')}. Varying: {', '.join(varying) or 'nothing'}. "
               f"MFU peak: {distinct('peak_source')}.")

    md = [f"# Sweep report: {sweep_dir.name}", "", context, "", "Best in each column in **bold**, among runs that differ only in backend.", "",
          "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(f"**{c}**" if b else c for c, b in cells) + " |" for cells in body]
    if failed:
        md += ["", "## Runs that did not finish", ""] + [f"- {lab}: `{r.get('status')}`: {r.get('reason', '')}"
                                                           for lab, r in failed]
    md += [""] + [f"![{name}](plots/{path.name})" for name, path in plots.items()]
    md += ["", "## How each figure was measured", "", METHODS]
    results.write_text(sweep_dir / "report.md", "\n".join(md) + "\n")

    def img(path: Path) -> str:
        data = base64.b64encode(path.read_bytes()).decode()
        return f'<figure><img alt="{path.stem}" src="data:image/png;base64,{data}"><figcaption>{path.stem}' \
               f'</figcaption></figure>'

    rows_html = "".join("<tr>" + "".join(f'<td class="{"best" if b else ""}">{html.escape(c)}</td>' for c, b in cells)
                        + "</tr>" for cells in body)
    methods_html = "".join(f"<li>{_inline(line.lstrip('- ').strip())}</li>"
                           for line in METHODS.replace("\n  ", " ").splitlines() if line.strip())
    failed_html = "".join(f"<li>{html.escape(lab)}: <b>{html.escape(str(r.get('status')))}</b>: "
                          f"{html.escape(str(r.get('reason', '')))}</li>" for lab, r in failed)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>shardbench: {html.escape(sweep_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 7px;text-align:right}}td:first-child,td:nth-child(2){{text-align:left}}
td.best{{font-weight:bold;background:#d9f2d9}}figure{{display:inline-block;margin:1em}}img{{max-width:680px}}</style>
</head><body><h1>Sweep report: {html.escape(sweep_dir.name)}</h1><p>{html.escape(context)}</p>
<p>Best in each column highlighted, among runs that differ only in backend.</p><table id="summary"><thead><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in headers)}
</tr></thead><tbody>{rows_html}</tbody></table>{f"<h2>Runs that did not finish</h2><ul>{failed_html}</ul>" if failed else ""}
<div id="plots">{"".join(img(p) for p in plots.values())}</div>
<h2>How each figure was measured</h2><ul>{methods_html}</ul>
<script>/* mark each plot the browser really decoded: the report test reads these marks */
window.addEventListener("load", () => document.querySelectorAll("img").forEach(i =>
  i.setAttribute(i.complete && i.naturalWidth > 0 ? "data-rendered" : "data-broken", "yes")));</script>
</body></html>"""
    results.write_text(sweep_dir / "report.html", page)
    return sweep_dir / "report.html"


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))

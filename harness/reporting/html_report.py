"""The offline dashboard of a sweep: report.md and a self-contained report.html, with the plots of plots.py.
`python -m harness report <sweep_dir>` (make report) rebuilds it with the tables (sweep_report.py).

Built from the run dirs alone, so it can be rebuilt at any time, and it tolerates runs that died at any
point: they are rows with their status, and the plots skip what they lack. Plots are matplotlib (Agg).
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Dict, List, Optional

from ..core.rundir import write_text
from .collect import collect, varying_keys
from . import memory_story, settings_table, verdict
from .plots import all_plots, caption
from .time_story import sentences

MiB = 2**20
# The table's columns under their headings: (heading, [(header, value, format, which is best: "max", "min" or
# None)]). Each measured figure is followed by its prediction and how far apart they are.
GROUPS = [
    ("throughput", [
        ("tokens/s", lambda f: f.get("throughput/tokens_per_s"), "{:,.0f}", "max"),
        ("tokens/s/device", lambda f: f.get("throughput/tokens_per_s_per_device"), "{:,.0f}", "max"),
        ("samples/s", lambda f: f.get("throughput/samples_per_s"), "{:,.1f}", "max"),
        ("TFLOP/s/device", lambda f: f.get("flops/achieved_tflops_per_device"), "{:.4f}", "max"),
        ("MFU %", lambda f: f.get("flops/mfu_pct"), "{:.2f}", "max")]),
    ("step time", [
        ("p50 ms", lambda f: _scale(f.get("throughput/step_time_p50_s"), 1e3), "{:.1f}", "min"),
        ("p90 ms", lambda f: _scale(f.get("throughput/step_time_p90_s"), 1e3), "{:.1f}", "min"),
        ("max ms", lambda f: _scale(f.get("throughput/step_time_max_s"), 1e3), "{:.1f}", "min"),
        ("exposed comm %", lambda f: f.get("time/comm_exposed_pct"), "{:.0f}", "min"),
        ("predicted ms", lambda f: _scale(f.get("time/step_predicted_s"), 1e3), "{:.1f}", None)]),
    ("peak of live tensors per rank", [
        ("measured MiB", lambda f: _scale(f.get("memory/peak_mem_bytes"), 1 / MiB), "{:,.2f}", "min"),
        ("predicted MiB", lambda f: _scale(f.get("memory/tensor_peak_predicted_bytes"), 1 / MiB), "{:,.2f}", None),
        ("error %", lambda f: f.get("memory/tensor_peak_error_pct"), "{:+.1f}", None),
        ("unaccounted %", lambda f: f.get("memory/unaccounted_pct"), "{:+.1f}", None),
        ("host RSS MiB", lambda f: _scale(f.get("memory/host_peak_bytes_max"), 1 / MiB), "{:,.0f}", None)]),
    ("model states per rank", [
        ("measured MiB", lambda f: _scale(f.get("memory/model_states_total_bytes_max"), 1 / MiB), "{:.3f}", "min"),
        ("predicted MiB", lambda f: _scale(f.get("memory/model_states_predicted_bytes"), 1 / MiB), "{:.3f}", None),
        ("error %", lambda f: f.get("memory/model_states_error_pct"), "{:+.2f}", None),
        ("ZeRO paper MiB", lambda f: _scale(f.get("memory/model_states_paper_bytes"), 1 / MiB), "{:.3f}", None)]),
    # sent per rank per step: counted on one extra step, by process group, beside theory/communication.py
    ("communication per rank", [
        ("measured MiB/step", lambda f: _scale(f.get("comm/measured_bytes_per_step"), 1 / MiB), "{:.3f}", "min"),
        ("predicted MiB/step", lambda f: _scale(f.get("comm/predicted_bytes_per_step"), 1 / MiB), "{:.3f}", None),
        ("error %", lambda f: f.get("comm/bytes_error_pct"), "{:+.1f}", None),
        ("intra-node MiB/step", lambda f: _scale(f.get("comm/measured_intra_node_bytes_per_step"), 1 / MiB),
         "{:.3f}", None),
        ("inter-node MiB/step", lambda f: _scale(f.get("comm/measured_inter_node_bytes_per_step"), 1 / MiB),
         "{:.3f}", "min")]),
    # the runs that saved or resumed a checkpoint (reporting/checkpoint_figures.py); shown only where one did
    ("checkpoint", [
        ("save blocking s", lambda f: f.get("checkpoint/save_blocking_s"), "{:.3f}", "min"),
        ("save total s", lambda f: f.get("checkpoint/save_total_s"), "{:.3f}", "min"),
        ("MiB on disk", lambda f: _scale(f.get("checkpoint/bytes_on_disk"), 1 / MiB), "{:.2f}", "min"),
        ("predicted MiB", lambda f: _scale(f.get("checkpoint/bytes_on_disk_predicted"), 1 / MiB), "{:.2f}", None),
        ("host added MiB", lambda f: _scale(f.get("checkpoint/save_host_added_bytes"), 1 / MiB), "{:.1f}", "min"),
        ("load s", lambda f: f.get("checkpoint/load_s"), "{:.3f}", "min"),
        ("resumed from step", lambda f: f.get("checkpoint/resumed_from_step"), "{:.0f}", None)]),
    ("loss", [("final", lambda f: f.get("loss/final_loss"), "{:.5f}", None),
              ("held-out", lambda f: f.get("loss/final_eval_loss"), "{:.5f}", None)]),
]
OPTIONAL_GROUPS = ("checkpoint",)
# the report's headline table: these first, every column below it, folded
HEADLINE = ("throughput: tokens/s", "step time: p50 ms", "step time: exposed comm %",
            "peak of live tensors per rank: measured MiB", "peak of live tensors per rank: predicted MiB",
            "model states per rank: measured MiB", "loss: final")  # a sweep whose runs have none of these figures is shown without the group


def _table(groups) -> list:
    """One column each, keyed "<heading>: <header>" (unique, and what the markdown table shows)."""
    return [(f"{group}: {header}", get, fmt, best) for group, columns in groups for header, get, fmt, best in columns]


TABLE = _table(GROUPS)


def groups_for(rows: List[dict]) -> list:
    """GROUPS, less each optional group none of the rows has a figure of."""
    return [(group, columns) for group, columns in GROUPS if group not in OPTIONAL_GROUPS
            or any(get(r.get("figures") or {}) is not None for r in rows for _, get, *_ in columns)]

# the report's "How each figure was measured" section: prose for users, kept as the markdown it is
METHODS = (Path(__file__).parent / "methods.md").read_text()


def _scale(x, k):
    return None if x is None else x * k


def _label(row: dict, varying: List[str]) -> str:
    keys = [k for k in varying if k != "backend.name"]
    extra = ",".join(str(row["config"].get(k)) for k in keys)
    return f"{row.get('backend', '?')}" + (f" [{extra}]" if extra else "")


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


def _inline(text: str) -> str:
    """The markdown this report uses (**bold**, `code`) as HTML."""
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


MISS_PCT = 30  # a prediction further than this from its measurement is shown as a miss, not as a figure
# a prediction's column -> the figure that says how far it is from the measurement, in percent
MISSED_BY = {"step time: predicted ms": "time/step_error_pct",
             "peak of live tensors per rank: predicted MiB": "memory/tensor_peak_error_pct",
             "model states per rank: predicted MiB": "memory/model_states_error_pct",
             "communication per rank: predicted MiB/step": "comm/bytes_error_pct"}
MISS_LEGEND = (f"† a prediction more than {MISS_PCT}% from its measurement: shown, not to be trusted (the notes and "
               "the time story say where it misses)")


def _cell(value, fmt, best, missed_by=None) -> tuple[str, str]:
    """A cell's text and its mark: "best" in its column, "miss" for a prediction off by more than MISS_PCT."""
    if value is None:
        return "", ""
    if missed_by is not None and abs(missed_by) > MISS_PCT:
        return fmt.format(value), "miss"
    return fmt.format(value), "best" if best is not None and value == best else ""


class Table:
    """The report's table, computed once for both renderings: headers, and per row (text, is_best) cells."""

    def __init__(self, rows: List[dict], varying: List[str]):
        self.labels = [_label(r, varying) for r in rows]
        best = best_cells(rows, varying)
        self.groups = groups_for(rows)
        table = _table(self.groups)
        self.headers = ["run", "status"] + [h for h, *_ in table]
        self.body = []
        for r, lab in zip(rows, self.labels):
            f = r["figures"]
            cells = [(lab, ""), (r.get("status", "?"), "")]
            cells += [_cell(get(f), fmt, best[_group(r, varying)][h], f.get(MISSED_BY.get(h, ""))) for h, get, fmt, _
                      in table]
            self.body.append(cells)
        self.missed = any(mark == "miss" for cells in self.body for _, mark in cells)
        self.failed = [(lab, r) for r, lab in zip(rows, self.labels) if r.get("status") != "ok"]
        self.settings = settings_table.rows(rows, self.labels)
        self.errors = [(lab, e) for r, lab in zip(rows, self.labels) for e in r.get("errors") or []]
        self.time_story = sentences(rows, self.labels, lambda r: _group(r, varying))
        self.memory_story = memory_story.sentences(rows, self.labels)
        self.verdict: List[str] = []  # build() reads each run's steps for it
        self.headline = [i for i, h in enumerate(self.headers) if i < 2 or h in HEADLINE]

    def markdown_rows(self, columns: List[int]) -> List[str]:
        marked = [[{"best": f"**{c}**", "miss": f"{c} †"}.get(mark, c) for c, mark in cells] for cells in self.body]
        return ["| " + " | ".join(self.headers[i] for i in columns) + " |", "|" + "---|" * len(columns)] + \
            ["| " + " | ".join(cells[i] for i in columns) + " |" for cells in marked]


def context_line(rows: List[dict], varying: List[str]) -> str:
    def distinct(key):
        return ", ".join(sorted({str(r.get(key)) for r in rows if r.get(key) is not None})) or "?"

    return (f"{len(rows)} runs; model {distinct('model')}, world size {distinct('world_size')}, precision "
            f"{distinct('precision')}, device {distinct('device')}. Varying: {', '.join(varying) or 'nothing'}. "
            f"MFU peak: {distinct('peak_source')}.")


def markdown(name: str, context: str, table: Table, plots: Dict[str, Path]) -> str:
    md = [f"# Sweep report: {name}", "", context, ""]
    md += ["## Verdict", ""] + [f"- {line}" for line in table.verdict] + [""] if table.verdict else []
    md += ["Best in each column in **bold**, among runs that differ only in backend.", ""]
    md += table.markdown_rows(table.headline)
    md += ["", f"<details><summary>Every column ({len(table.headers) - 2}), grouped: "
           f"{', '.join(group for group, _ in table.groups)}</summary>", ""]
    md += table.markdown_rows(list(range(len(table.headers))))
    md += ["", "</details>"]
    md += ["", MISS_LEGEND] if table.missed else []
    if table.time_story:
        md += ["", "## Where the step time goes", ""] + [f"- {line}" for line in table.time_story]
    if table.memory_story:
        md += ["", "## Where the memory goes", ""] + [f"- {line}" for line in table.memory_story]
    if table.failed:
        md += ["", "## Runs that did not finish", ""] + [f"- {lab}: `{r.get('status')}`: {r.get('reason', '')}"
                                                           for lab, r in table.failed]
    if table.errors:
        md += ["", "## Figures withheld", ""] + [f"- {lab}: {e}" for lab, e in table.errors]
    if table.settings:
        md += ["", "## Settings that ran", "", "| " + " | ".join(settings_table.HEADERS) + " |",
               "|" + "---|" * len(settings_table.HEADERS)] + ["| " + " | ".join(r) + " |" for r in table.settings]
    md += [""] + [f"![{stem}](plots/{path.name})\n\n*{caption(stem)}*\n" for stem, path in plots.items()]
    md += ["", "## How each figure was measured", "", METHODS]
    return "\n".join(md) + "\n"


STYLE = """body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}td:first-child,td:nth-child(2){text-align:left}
th[scope=colgroup]{text-align:center;background:#f2f2f2}td.best{font-weight:bold;background:#d9f2d9}td.miss{color:#999;font-style:italic}figure{display:inline-block;margin:1em}img{max-width:680px}"""
# mark each plot the browser really decoded: the report test reads these marks
MARK_RENDERED = """window.addEventListener("load", () => document.querySelectorAll("img").forEach(i =>
  i.setAttribute(i.complete && i.naturalWidth > 0 ? "data-rendered" : "data-broken", "yes")));"""


def _figure(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{path.stem}" src="data:image/png;base64,{data}"><figcaption>' \
           f'{html.escape(caption(path.stem))}</figcaption></figure>'


def page(name: str, context: str, table: Table, plots: Dict[str, Path]) -> str:
    """A self-contained report.html: the plots are inlined, so the file can be mailed or attached."""
    esc = html.escape
    head = '<th rowspan="2">run</th><th rowspan="2">status</th>' + "".join(
        f'<th colspan="{len(columns)}" scope="colgroup">{esc(group)}</th>' for group, columns in table.groups)
    head += "</tr><tr>" + "".join(f'<th scope="col">{esc(header)}</th>' for _, columns in table.groups
                                  for header, *_ in columns)
    miss_title = f' title="off by more than {MISS_PCT}% from the measurement"'
    def body(columns):
        return "".join("<tr>" + "".join(f'<td class="{cells[i][1]}"{miss_title if cells[i][1] == "miss" else ""}>'
                                        f'{esc(cells[i][0])}{" †" if cells[i][1] == "miss" else ""}</td>'
                                        for i in columns) + "</tr>" for cells in table.body)

    rows = body(range(len(table.headers)))
    headline = "<tr>" + "".join(f"<th>{esc(table.headers[i])}</th>" for i in table.headline) + "</tr>"
    headline = f'<table id="headline"><thead>{headline}</thead><tbody>{body(table.headline)}</tbody></table>'
    verdict_list = "".join(f"<li>{esc(line)}</li>" for line in table.verdict)
    verdict_list = f'<h2>Verdict</h2><ul id="verdict">{verdict_list}</ul>' if verdict_list else ""
    methods = "".join(f"<li>{_inline(line.lstrip('- ').strip())}</li>"
                      for line in METHODS.replace("\n  ", " ").splitlines() if line.strip())
    failed = "".join(f"<li>{esc(lab)}: <b>{esc(str(r.get('status')))}</b>: {esc(str(r.get('reason', '')))}</li>"
                     for lab, r in table.failed)
    failed = f"<h2>Runs that did not finish</h2><ul>{failed}</ul>" if failed else ""
    withheld = "".join(f"<li>{esc(lab)}: {esc(e)}</li>" for lab, e in table.errors)
    failed += f"<h2>Figures withheld</h2><ul>{withheld}</ul>" if withheld else ""
    story = "".join(f"<li>{esc(line)}</li>" for line in table.time_story)
    memory = "".join(f"<li>{esc(line)}</li>" for line in table.memory_story)
    failed = (f'<h2>Where the step time goes</h2><ul id="time-story">{story}</ul>' if story else "") + \
        (f'<h2>Where the memory goes</h2><ul id="memory-story">{memory}</ul>' if memory else "") + failed
    settings = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in table.settings)
    settings = (f'<h2>Settings that ran</h2><table id="settings"><thead><tr>'
                f'{"".join(f"<th>{esc(h)}</th>" for h in settings_table.HEADERS)}</tr></thead>'
                f"<tbody>{settings}</tbody></table>") if settings else ""
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>shardbench: {esc(name)}</title>'
            f"<style>{STYLE}</style></head><body><h1>Sweep report: {esc(name)}</h1><p>{esc(context)}</p>"
            f"{verdict_list}<p>Best in each column highlighted, among runs that differ only in backend.</p>"
            f"{headline}<details><summary>Every column, grouped</summary>"
            f'<table id="summary"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></details>'
            f'{f"<p>{esc(MISS_LEGEND)}</p>" if table.missed else ""}{failed}{settings}'
            f'<div id="plots">{"".join(_figure(p) for p in plots.values())}</div>'
            f"<h2>How each figure was measured</h2><ul>{methods}</ul><script>{MARK_RENDERED}</script></body></html>")


def build(sweep_dir: Path, rows: Optional[List[dict]] = None) -> Table:
    """Write report.md, report.html and plots/; `rows` are collect(sweep_dir), read again when not given. Returns
    the table, its verdict among it."""
    sweep_dir = Path(sweep_dir)
    rows = collect(sweep_dir) if rows is None else rows
    varying = varying_keys(rows)
    table = Table(rows, varying)
    table.verdict = verdict.sentences(rows, table.labels, lambda r: _group(r, varying), sweep_dir)
    plots = all_plots(rows, table.labels, sweep_dir, sweep_dir / "plots")
    context = context_line(rows, varying)
    write_text(sweep_dir / "report.md", markdown(sweep_dir.name, context, table, plots))
    write_text(sweep_dir / "report.html", page(sweep_dir.name, context, table, plots))
    return table

"""The side-by-side table of a sweep: summary.csv (every figure of every run), summary.md, and the console
table. Every run dir with a summary.json is a row, whatever its status: a failed run is a row, not a gap."""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import List

from ..config.mesh import DIMENSIONS
from ..core.rundir import write_text
from .collect import varying_keys

def beyond_data_parallel(record) -> bool:
    """Whether a run's mesh record (config/mesh.Mesh.as_record()) has a degree above 1 outside the data-parallel
    dimensions (tp, cp, pp) or experts split over borrowed ranks (ep)."""
    return bool(record) and any(record.get(d, 1) > 1 for d in (*DIMENSIONS, "ep") if not d.startswith("dp"))


# (header, how to get it from a summary, format)
COLUMNS = [
    ("backend", lambda s: s.get("backend", "?"), "{}"),
    # the mesh where a dimension beside the data-parallel ones splits it (its record: config/mesh.py); a
    # data-parallel mesh is the world size's
    ("mesh", lambda s: s.get("mesh") if beyond_data_parallel(s.get("mesh_record")) else None, "{}"),
    # a LoRA run is named as such: the same model, a different workload (and different model states)
    ("model", lambda s: s.get("model", "?") + ("+lora" if s.get("config", {}).get("workload.name") == "lora"
                                               else ""), "{}"),
    ("precision", lambda s: s.get("precision", "?"), "{}"),
    ("status", lambda s: s.get("status", "?"), "{}"),
    ("tokens/s", lambda s: s["figures"].get("throughput/tokens_per_s"), "{:,.0f}"),
    ("step p50 ms", lambda s: _ms(s["figures"].get("throughput/step_time_p50_s")), "{:.1f}"),
    # the share of the (slowest rank's) step spent blocked on communication: runtime/measure/time_profile.py
    ("exposed comm %", lambda s: s["figures"].get("time/comm_exposed_pct"), "{:.0f}"),
    # peak live tensor bytes per rank (the allocator's on CUDA, the profiled step's on CPU), max over ranks
    ("peak MiB/rank", lambda s: _mib(s["figures"].get("memory/peak_mem_bytes")), "{:,.2f}"),
    ("peak predicted", lambda s: _mib(s["figures"].get("memory/tensor_peak_predicted_bytes")), "{:,.2f}"),
    ("states MiB/rank", lambda s: _mib(s["figures"].get("memory/model_states_total_bytes_max")), "{:.3f}"),
    ("states predicted", lambda s: _mib(s["figures"].get("memory/model_states_predicted_bytes")), "{:.3f}"),
    ("states error %", lambda s: s["figures"].get("memory/model_states_error_pct"), "{:+.2f}"),
    ("host RSS MiB", lambda s: _mib(s["figures"].get("memory/host_peak_bytes_max")), "{:,.0f}"),
    # where a run saved a checkpoint: the median save's seconds that blocked training (reporting/checkpoint_figures.py)
    ("save s", lambda s: s["figures"].get("checkpoint/save_blocking_s"), "{:.3f}"),
    # a run that went on from a checkpoint (a re-run with train.resume, a requeued SLURM job): its steps before
    # that are an earlier attempt's
    ("resumed from step", lambda s: s["figures"].get("checkpoint/resumed_from_step"), "{:.0f}"),
    ("final loss", lambda s: s["figures"].get("loss/final_loss"), "{:.5f}"),
    # the held-out split's loss after the last step (train.eval_every)
    ("eval loss", lambda s: s["figures"].get("loss/final_eval_loss"), "{:.5f}"),
]


def _ms(x):
    return None if x is None else 1e3 * x


def _mib(x):
    return None if x is None else x / 2**20


def cells(summary: dict) -> List[str]:
    out = []
    for _, get, fmt in COLUMNS:
        value = get(summary)
        out.append("" if value is None else fmt.format(value))
    return out


def write_tables(sweep_dir: Path, rows: List[dict]) -> str:
    """summary.csv (every figure of every run) and summary.md (the side-by-side table); returns the md."""
    figure_keys = sorted({k for r in rows for k in r["figures"]})
    ident = ["run_dir", "status", "reason", "warnings", "backend", "model", "world_size", "precision", "params",
             "optimizer"]
    varying = [k for k in varying_keys(rows) if k not in ("backend.name", "model.name")]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=ident + varying + figure_keys, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**{k: r.get(k, "") for k in ident}, "warnings": "; ".join(r.get("warnings", [])),
                         **{k: r["config"].get(k, "") for k in varying},
                         **r["figures"]})
    write_text(sweep_dir / "summary.csv", buf.getvalue())
    values = [cells(r) for r in rows]
    shown = [i for i, (h, _, _) in enumerate(COLUMNS) if h not in OPTIONAL_COLUMNS or any(v[i] for v in values)]
    # what the sweep varies beyond the columns (a sequence, a checkpointing policy), after the backend: without
    # it, two runs of one backend are two rows alike
    swept = [k for k in varying if k != "train.precision"]
    head = [COLUMNS[shown[0]][0], *(k.rsplit(".", 1)[-1] for k in swept), *(COLUMNS[i][0] for i in shown[1:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([v[shown[0]], *(str(r["config"].get(k, "")) for k in swept),
                                 *(v[i] for i in shown[1:])]) + " |" for r, v in zip(rows, values)]
    failed = [f"- {r.get('backend')}: {r.get('status')}: {r.get('reason')}" for r in rows if r.get("status") != "ok"]
    warned = [f"- {r.get('backend')} ({r['run_dir']}): {w}" for r in rows for w in r.get("warnings", [])]
    md = "\n".join(lines) + ("\n\nNot ok:\n" + "\n".join(failed) if failed else "")
    md += ("\n\nWarnings:\n" + "\n".join(warned) if warned else "") + "\n"
    write_text(sweep_dir / "summary.md", md)
    return md


TEXT_COLUMNS = ("backend", "model", "precision", "status")
OPTIONAL_COLUMNS = ("mesh", "save s", "resumed from step", "eval loss")  # shown only where a run has the figure
# headers on two lines, each word short, so that the table fits 100 columns without cutting a value
CONSOLE_HEADERS = {"step p50 ms": "step p50\nms", "exposed comm %": "exposed\ncomm %", "peak MiB/rank": "peak\nMiB/rank",
                   "peak predicted": "peak\npredicted", "states MiB/rank": "states\nMiB/rank",
                   "states predicted": "states\npredicted", "states error %": "states\nerror %",
                   "host RSS MiB": "host RSS\nMiB", "final loss": "final\nloss",
                   "resumed from step": "resumed\nfrom step", "eval loss": "eval\nloss"}
PIPE_WIDTH = 200  # where stdout is no terminal (a log, CI): wide enough for every column on one line


# what a narrow terminal leaves out first: the columns that explain the others before the ones that compare runs
DROP_ORDER = ("save s", "resumed from step", "eval loss", "host RSS MiB", "states error %", "states predicted", "states MiB/rank",
              "exposed comm %", "step p50 ms", "peak predicted")


def console_table(rows: List[dict], width: int):
    """The console table for `width` columns: constant columns in the title; when the rest is wider, the
    columns of DROP_ORDER left out, first to last, until it fits, and named in the caption."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    values = [cells(r) for r in rows]
    constant = [i for i, (header, _, _) in enumerate(COLUMNS)
                if header in TEXT_COLUMNS[1:] and rows and len({v[i] for v in values}) == 1]
    said = [values[0][i] if COLUMNS[i][0] != "status" else f"all {len(rows)} {values[0][i]}" for i in constant]
    title = "shardbench: " + ", ".join([*said, "timed window, warm-up excluded"])
    shown = [i for i in range(len(COLUMNS)) if i not in constant and not (
        COLUMNS[i][0] in OPTIONAL_COLUMNS and not any(v[i] for v in values))]
    dropped: List[str] = []
    while True:
        caption = (f"left out at {width} columns: {', '.join(dropped)} (summary.md has every column)"
                   if dropped else None)
        table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        for i in shown:
            header = COLUMNS[i][0]
            table.add_column(CONSOLE_HEADERS.get(header, header), no_wrap=True,
                             justify="left" if header in TEXT_COLUMNS else "right")
        for v in values:
            table.add_row(*(v[i] for i in shown))
        fits = Console(width=10_000).measure(table).maximum <= width  # its natural width, unbounded
        left = [h for h in DROP_ORDER if h in (COLUMNS[i][0] for i in shown)]
        if fits or not left:
            return table
        shown = [i for i in shown if COLUMNS[i][0] != left[0]]
        dropped.append(left[0])


def print_table(rows: List[dict], width: int | None = None) -> None:
    """The console table at the terminal's width (rich's own), `width` if given, or PIPE_WIDTH into a pipe;
    backend names and figures are never cut."""
    from rich.console import Console

    console = Console(file=sys.stdout, width=width or (None if sys.stdout.isatty() else PIPE_WIDTH))
    console.print(console_table(rows, console.width))

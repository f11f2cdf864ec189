"""A sweep's W&B dashboard, built by the harness: a W&B Report and a saved workspace, with wandb-workspaces.

Both show what report.md shows, from the runs' summaries (which hold summary.json's figures: a test reads them
back): bar charts of tokens/s, MFU, the peak per rank beside its prediction and the bytes a step on each link
(one bar a run, named backend-model-ranks-axes-precision, so meshes that differ show apart); the loss and the
per-step rate overlaid; the settings that differ (W&B's run comparer, differences only); the report's verdict.

`build()` of the sweep report writes `dashboard.json` beside report.md: the harness's spec of both views
(what `spec()` returns, plain data). Online, the sweep's end saves them at once. Offline, `shardbench dashboard
<sweep dir>` saves them after `wandb sync`. `views()` turns the spec into the library's own objects; its
pydantic models validate every panel and filter, offline, and `workspace_view()` is the internal view W&B
stores (tests/test_report.py builds both on a real sweep).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

SPEC_FILE = "dashboard.json"

# (title, summary keys): one bar chart each, drawn when some run of the sweep has one of its keys
BARS = [
    ("tokens/s, timed window (warm-up excluded)", ["throughput/tokens_per_s"]),
    ("MFU %", ["flops/mfu_pct"]),
    ("peak bytes per rank: measured, and the theory's prediction",
     ["memory/device_peak_bytes_max", "memory/device_peak_predicted_bytes"]),
    ("bytes a step on each link: measured", ["comm/measured_intra_node_bytes_per_step",
                                             "comm/measured_inter_node_bytes_per_step"]),
    ("bytes a step on each link: predicted", ["comm/predicted_intra_node_bytes_per_step",
                                              "comm/predicted_inter_node_bytes_per_step"]),
]
# (title, history key): the curves of every run overlaid, against the step
LINES = [("loss per step", "loss/loss"), ("tokens/s per step (warm-up included)", "step/tokens_per_s")]
# the runs table's pinned columns, beside the run's name
COLUMNS = ["config:backend.name", "summary:throughput/tokens_per_s", "summary:flops/mfu_pct",
           "summary:memory/device_peak_bytes_max", "summary:memory/device_peak_predicted_bytes",
           "summary:loss/final_loss", "summary:status"]


def spec(sweep_dir: Path, rows: List[dict], verdict: List[str]) -> dict:
    """The dashboard of a sweep, as plain data: where its runs are in W&B, and what to draw."""
    config = _run_config(sweep_dir)
    logger, sweep = config.get("logger", {}), config.get("sweep", {})
    present = {k for r in rows for k in r.get("figures", {})}
    return {
        "entity": logger.get("entity"), "project": logger.get("project", "shardbench"),
        "group": logger.get("group") or sweep.get("name") or Path(sweep_dir).name,
        "title": f"shardbench: {Path(sweep_dir).name}"[:128],
        "description": f"{len(rows)} runs of {Path(sweep_dir).name}, as report.md shows them: "
                       "figures from each run's summary, its timed window only",
        "bars": [{"title": t, "metrics": [k for k in keys if k in present]}
                 for t, keys in BARS if any(k in present for k in keys)],
        "lines": [{"title": t, "metric": k} for t, k in LINES],
        "columns": COLUMNS,
        "verdict": list(verdict) or ["no verdict: fewer than two comparable runs succeeded"],
    }


def write(sweep_dir: Path, rows: List[dict], verdict: List[str]) -> Path:
    from ..core.rundir import write_text

    path = Path(sweep_dir) / SPEC_FILE
    write_text(path, json.dumps(spec(sweep_dir, rows, verdict), indent=1) + "\n")
    return path


def run_filter(the_spec: dict) -> str:
    # the sweep's runs, not its summary run (job type sweep-summary) nor anything else in the project
    return f"Metric('Group') == '{the_spec['group']}' and Metric('JobType') == 'train'"


def views(the_spec: dict, entity: str):
    """The W&B Report and workspace of the spec, as wandb-workspaces objects (validated as they are built)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def bars():
        return [wr.BarPlot(title=b["title"], metrics=b["metrics"], orientation="h") for b in the_spec["bars"]]

    def lines():
        return [wr.LinePlot(title=line["title"], x="Step", y=[line["metric"]]) for line in the_spec["lines"]]

    verdict_md = "\n".join(f"- {line}" for line in the_spec["verdict"])
    report = wr.Report(
        project=the_spec["project"], entity=entity, title=the_spec["title"], description=the_spec["description"],
        width="fluid",
        blocks=[wr.H2("Verdict"), wr.UnorderedList(items=list(the_spec["verdict"])),
                wr.PanelGrid(runsets=[wr.Runset(entity=entity, project=the_spec["project"],
                                                name=the_spec["group"], filters=run_filter(the_spec))],
                             panels=[*bars(), *lines(), wr.RunComparer(diff_only="split")])])
    workspace = ws.Workspace(
        entity=entity, project=the_spec["project"], name=the_spec["title"],
        sections=[ws.Section(name="Verdict", panels=[wr.MarkdownPanel(markdown=verdict_md)]),
                  ws.Section(name="Side by side", panels=bars()),
                  ws.Section(name="Curves", panels=lines()),
                  ws.Section(name="Settings that differ", panels=[wr.RunComparer(diff_only="split")])],
        runset_settings=ws.RunsetSettings(filters=run_filter(the_spec), pinned_columns=list(the_spec["columns"])))
    return report, workspace


def workspace_view(workspace) -> dict:
    """The workspace as W&B stores it (the library's internal View model, dumped as the server takes it)."""
    return workspace._to_model().model_dump(by_alias=True, exclude_none=True)  # noqa: SLF001 - its own spec


def save(the_spec: dict) -> tuple[str, str]:
    """Create the Report and the workspace in W&B (needs a login); their URLs."""
    import wandb

    entity = the_spec["entity"] or wandb.Api().default_entity
    report, workspace = views(the_spec, entity)
    report.save()
    workspace.save()
    return report.url, workspace.url


def save_quietly(sweep_dir: Path) -> None:
    """At a sweep's end, online: create its dashboard; W&B trouble is a warning, the spec stays on disk."""
    try:
        report_url, workspace_url = save(json.loads((Path(sweep_dir) / SPEC_FILE).read_text()))
        print(f"shardbench: W&B report {report_url}, workspace {workspace_url}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the sweep's results are on disk whatever W&B does
        print(f"warning: W&B dashboard not created ({type(exc).__name__}: {exc}); `shardbench dashboard "
              f"{sweep_dir}` creates it later", file=sys.stderr)


def _run_config(sweep_dir: Path) -> dict:
    import yaml

    for path in sorted(Path(sweep_dir).glob("*/config.yaml")):
        return yaml.safe_load(path.read_text()) or {}
    return {}


def main(argv: List[str] | None = None) -> int:
    from ..config.command_line import parse

    parser = argparse.ArgumentParser(
        description="Create a sweep's W&B Report and workspace from its dashboard.json (written with its report). "
                    "Offline sweeps: `wandb sync` their runs first (the sweep's end prints the command).")
    parser.add_argument("sweep_dir", help="the sweep's dir, e.g. results/sweeps/compare_all")
    sweep_dir = Path(parse("dashboard", parser, argv, takes_overrides=False)[0].sweep_dir)
    path = sweep_dir / SPEC_FILE
    if not path.is_file():
        print(f"shardbench: no {path}: `shardbench report {sweep_dir}` writes it", file=sys.stderr)
        return 2
    report_url, workspace_url = save(json.loads(path.read_text()))
    print(f"W&B report: {report_url}\nW&B workspace: {workspace_url}")
    return 0

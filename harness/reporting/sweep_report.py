"""A sweep's whole report, rebuilt from its run dirs at any time: summary.csv and summary.md, the console table,
report.md / report.html with plots, and (at the end of a sweep) a W&B summary run.

    python -m harness report <sweep_dir>        (make report SWEEP=<sweep_dir>)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ..config.command_line import parse
from ..config.derive import wandb_mode
from . import dashboard, html_report
from .collect import collect
from .tables import print_table, write_tables


def build(sweep_dir: Path) -> List[dict]:
    """Rebuild everything of a sweep from its run dirs: tables, console table, report and plots."""
    rows = collect(sweep_dir)
    write_tables(Path(sweep_dir), rows)
    print_table(rows)
    table = html_report.build(Path(sweep_dir), rows)
    dashboard.write(Path(sweep_dir), rows, table.verdict)
    print("\n".join(table.verdict))
    print(f"wrote {sweep_dir}/summary.csv, summary.md, report.md, report.html, plots/ and {dashboard.SPEC_FILE} "
          "(its W&B Report and workspace: shardbench dashboard)")
    return rows


def log_to_wandb(config, sweep_dir: Path, rows: List[dict]) -> None:
    """The side-by-side table as a wandb.Table in a summary run of the sweep's group, with the report's plots.

    Offline, it is written locally like every other run (`wandb sync` uploads it later). Never fails a sweep.
    """
    keys = ["backend", "status", "model", "world_size", "precision"]
    figure_keys = sorted({k for r in rows for k in r["figures"]})
    log_summary_run(config, sweep_dir, f"{config.sweep.name}-summary", "sweep-summary", "sweep/summary",
                    keys + figure_keys, [[r.get(k) for k in keys] + [r["figures"].get(k) for k in figure_keys]
                                         for r in rows],
                    images={f"plots/{p.stem}": p for p in sorted((sweep_dir / "plots").glob("*.png"))},
                    group=config.logger.group or config.sweep.name)


def log_summary_run(config, where: Path, name: str, job_type: str, table_key: str, columns: List[str],
                    data: List[list], images: Dict[str, Path], summary: Optional[dict] = None,
                    group: Optional[str] = None) -> None:
    """One W&B run holding a table, images and summary values (a sweep's side-by-side table, the advisor's
    answer), written under `where`, unless the logger is disabled. Offline, it is written locally like every
    other run (`wandb sync` uploads it later). W&B trouble never fails the caller, whose results are on disk."""
    mode = wandb_mode(config.logger.mode)
    if mode == "disabled":
        return
    try:
        import wandb

        run = wandb.init(project=config.logger.project, entity=config.logger.entity, group=group, name=name,
                         job_type=job_type, dir=str(where), mode=mode,
                         settings=wandb.Settings(silent=True, console="off",
                                                 init_timeout=config.logger.init_timeout_s))
        run.log({table_key: wandb.Table(columns=columns, data=data),
                 **{key: wandb.Image(str(path)) for key, path in images.items()}})
        run.summary.update(summary or {})
        run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B trouble never loses the local results
        print(f"warning: W&B {job_type} run not logged ({mode}): {type(exc).__name__}: {exc}", file=sys.stderr)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild a finished sweep's summary.csv, summary.md, report.md, "
                                                 "report.html and plots from its run dirs.")
    parser.add_argument("sweep_dir", help="the sweep's dir, e.g. results/sweeps/compare_all")
    sweep_dir = Path(parse("report", parser, argv, takes_overrides=False)[0].sweep_dir)
    if not sweep_dir.is_dir():
        print(f"shardbench: no sweep dir {sweep_dir} (nothing there to report; sweeps are under results/sweeps/)",
              file=sys.stderr)
        return 2
    if not any(sweep_dir.glob("*/summary.json")):
        print(f"shardbench: {sweep_dir} holds no run (no */summary.json); give a sweep's dir, e.g. "
              "results/sweeps/compare_all", file=sys.stderr)
        return 2
    build(sweep_dir)
    return 0

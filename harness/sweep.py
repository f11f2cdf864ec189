"""The side-by-side table of a sweep. A Hydra callback builds it when a multirun ends; `python -m
harness.sweep <sweep_dir>` rebuilds it from the run dirs at any time.

Every run dir with a summary.json is a row, whatever its status: a failed run is a row, not a gap. The
callback also writes the report (harness/report.py).
"""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Dict, List

from hydra.experimental.callback import Callback

from . import results

# (header, how to get it from a summary, format)
COLUMNS = [
    ("backend", lambda s: s.get("backend", "?"), "{}"),
    ("model", lambda s: s.get("model", "?"), "{}"),
    ("precision", lambda s: s.get("precision", "?"), "{}"),
    ("status", lambda s: s.get("status", "?"), "{}"),
    ("tokens/s", lambda s: s["figures"].get("throughput/tokens_per_s"), "{:,.0f}"),
    ("step p50 ms", lambda s: _ms(s["figures"].get("throughput/step_time_p50_s")), "{:.1f}"),
    ("peak mem MiB", lambda s: _mib(s["figures"].get("memory/peak_mem_bytes")), "{:,.0f}"),
    ("model states MiB/rank", lambda s: _mib(s["figures"].get("memory/model_states_total_bytes_max")), "{:.3f}"),
    ("predicted", lambda s: _mib(s["figures"].get("memory/model_states_predicted_bytes")), "{:.3f}"),
    ("error %", lambda s: s["figures"].get("memory/model_states_error_pct"), "{:+.2f}"),
    ("final loss", lambda s: s["figures"].get("loss/final_loss"), "{:.5f}"),
    ("optimizer", lambda s: s.get("optimizer", ""), "{}"),
]


def _ms(x):
    return None if x is None else 1e3 * x


def _mib(x):
    return None if x is None else x / 2**20


def flat_config(run_dir: Path) -> Dict[str, object]:
    """The run's resolved config as dotted keys (empty when the run died before writing it)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    try:
        import yaml

        tree = yaml.safe_load(path.read_text()) or {}
    except Exception:  # noqa: BLE001 - a damaged config must not break the table
        return {}
    out: Dict[str, object] = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(tree, "")
    return out


def collect(sweep_dir: Path) -> List[dict]:
    rows = []
    for path in sorted(Path(sweep_dir).glob("*/summary.json")):
        summary = results.read_json(path)
        if summary is None:  # unreadable: still a row
            summary = {"status": "failed", "reason": "summary.json unreadable"}
        summary.setdefault("figures", {})
        summary["run_dir"] = path.parent.name
        summary["config"] = flat_config(path.parent)
        rows.append(summary)
    order = {"ok": 0}
    return sorted(rows, key=lambda r: (order.get(r.get("status"), 1), str(r.get("model")), str(r.get("precision")),
                                      r.get("backend") or "", r["run_dir"]))


def varying_keys(rows: List[dict]) -> List[str]:
    """Config keys whose value differs between runs (what the sweep varies), run dirs and names aside."""
    keys = sorted({k for r in rows for k in r["config"]})
    skip = ("paths.", "hydra.", "backend.", "model.")  # a backend or model is varied as a whole: its name says it
    varying = [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1
               and (not k.startswith(skip) or k in ("backend.name", "model.name"))]
    return varying


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
    results.write_text(sweep_dir / "summary.csv", buf.getvalue())
    lines = ["| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    failed = [f"- {r.get('backend')}: {r.get('status')}: {r.get('reason')}" for r in rows if r.get("status") != "ok"]
    warned = [f"- {r.get('backend')} ({r['run_dir']}): {w}" for r in rows for w in r.get("warnings", [])]
    md = "\n".join(lines) + ("\n\nNot ok:\n" + "\n".join(failed) if failed else "")
    md += ("\n\nWarnings:\n" + "\n".join(warned) if warned else "") + "\n"
    results.write_text(sweep_dir / "summary.md", md)
    return md


def print_table(rows: List[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="shardbench: side by side (timed window, warm-up excluded)")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="left" if header in ("backend", "model", "precision", "status", "optimizer") else "right")
    for r in rows:
        table.add_row(*cells(r))
    Console(file=sys.stdout, width=160).print(table)


def build(sweep_dir: Path) -> List[dict]:
    from . import report

    rows = collect(sweep_dir)
    write_tables(Path(sweep_dir), rows)
    print_table(rows)
    report.build(Path(sweep_dir), rows)
    print(f"wrote {sweep_dir}/summary.csv, summary.md, report.md, report.html and plots/")
    return rows


def job_count(config) -> int:
    """How many runs the sweep will launch: the product of every swept override's values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    overrides += list(config.hydra.overrides.task)  # the command line wins over the experiment's params
    by_key = {o.key_or_group: o for o in OverridesParser.create().parse_overrides(overrides)}
    count = 1
    for override in by_key.values():
        if override.is_sweep_override():
            count *= len(list(override.sweep_string_iterator()))
    return count


def refuse_bad_output(paths, out_dir: str) -> None:
    from .validate import output_problems

    problems = output_problems(paths, out_dir)
    if problems:
        print(f"shardbench: invalid config: {problems[0]}", file=sys.stderr)
        sys.exit(2)


class SweepTable(Callback):
    """The harness's Hydra callback: checks the output dir before Hydra creates it; tables and report at the end."""

    def on_run_start(self, config, **kwargs) -> None:
        refuse_bad_output(config.paths, config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        refuse_bad_output(config.paths, config.hydra.sweep.dir)
        try:
            results.write_text(Path(config.hydra.sweep.dir) / ".jobs", str(job_count(config)))
        except Exception as exc:  # noqa: BLE001 - a progress count must never stop a sweep
            print(f"warning: could not count the sweep's runs: {exc}", file=sys.stderr)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        log_to_wandb(config, sweep_dir, build(sweep_dir))


def log_to_wandb(config, sweep_dir: Path, rows: List[dict]) -> None:
    """The side-by-side table as a wandb.Table in a summary run of the sweep's group, with the report's plots.

    Offline, it is written locally like every other run (`wandb sync` uploads it later). Never fails a sweep.
    """
    from .logging_sink import wandb_mode

    mode = wandb_mode(config.logger.mode)
    if mode == "disabled":
        return
    try:
        import wandb

        keys = ["backend", "status", "model", "world_size", "precision"]
        figure_keys = sorted({k for r in rows for k in r["figures"]})
        table = wandb.Table(columns=keys + figure_keys,
                            data=[[r.get(k) for k in keys] + [r["figures"].get(k) for k in figure_keys] for r in rows])
        run = wandb.init(project=config.logger.project, entity=config.logger.entity,
                         group=config.logger.group or config.sweep.name, name=f"{config.sweep.name}-summary",
                         job_type="sweep-summary", dir=str(sweep_dir), mode=mode,
                         settings=wandb.Settings(silent=True, console="off", init_timeout=60))
        images = {f"plots/{p.stem}": wandb.Image(str(p)) for p in sorted((sweep_dir / "plots").glob("*.png"))}
        run.log({"sweep/summary": table, **images})
        run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B trouble never loses the local results
        print(f"warning: W&B summary run not logged ({mode}): {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    build(Path(sys.argv[1]))

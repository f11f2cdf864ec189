"""The session's launches as the tests run them (imported by conftest.py): every backend on some shapes as the cells
of one launch (`sweeps`), each cell that fails remembered, and named in the last lines of make test's output
(every test that reads a failed cell fails: the cause is this line), and each cell run a second time after a
native crash (launcher/cells.py), so that a crash that did not come back is still seen."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.config.compose import flat_backends
from harness.core.paths import extensions_dir

BACKENDS = flat_backends("cpu")  # every file in conf/backend/ but the hybrid ones (tested across nodes) and
# those that cannot run on this machine (FSDP1's CPUOffload needs an accelerator)
FAST = ["logger=none", "train.steps=5", "train.warmup_steps=2"]

# the cells of the session's launches that did not end ok, or never ran because the checkpoint they resume was not
# saved: every test that reads one fails, so the last lines of make test's output name the cause
# (pytest_terminal_summary below); and the cells run again after a native crash, with the first attempt's reason
FAILED_CELLS: list[str] = []
RERUN_CELLS: list[str] = []


def launched(launch_dir: Path, cells: list, common: list) -> dict:
    """run_cells (harness/launcher/cells.py) without the report, each failed cell remembered in FAILED_CELLS with
    its reason and the last line of its first rank's traceback."""
    from harness.launcher.cells import run_cells

    summaries = run_cells(launch_dir, cells, common, report=False)
    for cell, summary in summaries.items():
        for attempt in summary.get("earlier_attempts", []):
            RERUN_CELLS.append(f"{launch_dir.parent.name}/{cell}: {attempt['dir']}: {attempt['reason']}")
        if summary["status"] != "ok":
            tracebacks = sorted((launch_dir / cell / "ranks").glob("rank*.traceback.txt"))
            last = tracebacks[0].read_text().strip().splitlines()[-1:] if tracebacks else []
            FAILED_CELLS.append(f"{launch_dir.parent.name}/{cell}: {summary['status']}: {summary.get('reason') or ''}"
                                + "".join(f" [{line[:300]}]" for line in last))
    return summaries


def resumable(launch_dir: Path, cell: tuple) -> bool:
    """Whether a cell that resumes a checkpoint of another launch finds it complete: if that launch's cell failed,
    this one is left out (and named in FAILED_CELLS) rather than refused with the whole launch."""
    from harness.core.checkpoint_dirs import MARKER

    name, overrides = cell
    paths = [o.split("=", 1)[1].strip("'\"") for o in overrides if o.startswith("train.resume=")]
    missing = [p for p in paths if Path(p).is_absolute() and launch_dir not in Path(p).parents
               and not (Path(p) / MARKER).exists()]
    if missing:
        FAILED_CELLS.append(f"{launch_dir.parent.name}/{name}: not run: no complete checkpoint at {missing[0]}")
    return not missing


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    # the outermost wrapper: after pytest's short summary (which may be 80 lines of errors), before its last line
    result = yield
    if FAILED_CELLS:
        terminalreporter.section("cells of the session's launches that failed (the tests that read them fail)")
        for line in FAILED_CELLS:
            terminalreporter.line(line)
    if RERUN_CELLS:
        terminalreporter.section("cells run a second time after a native crash in their first attempt")
        for line in RERUN_CELLS:
            terminalreporter.line(line)
    return result


def sweeps(root: Path, named: dict, report: tuple = ()) -> dict:
    """Every backend on each of the `named` shapes ({sweep name: overrides, or a function backend -> overrides,
    whose `backends` attribute, if any, names the backends it runs}, one world size), all as the cells of
    one launch (harness/launcher/cells.py: each a whole run in its own run dir, <root>/sweeps/<name>/backend=<b>,
    written by a run's own code; the ranks start once, not once a backend or a sweep), and for the sweeps `report`
    names, their tables and report (a few seconds of plots, for the tests that read them); return {sweep name:
    {backend: (summary, per-step records, run dir)}}."""
    from harness.reporting import sweep_report

    named = {name: o if callable(o) else (lambda b, o=o: o) for name, o in named.items()}
    launch_dir = root / "sweeps"
    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    cells = [(f"{name}/backend={b}", [f"sweep.name={name}", *overrides(b), f"backend={b}"])
             for name, overrides in named.items() for b in (getattr(overrides, "backends", None) or BACKENDS)]
    cells = [cell for cell in cells if resumable(launch_dir, cell)]
    summaries = launched(launch_dir, cells, [f"paths.root={root}", *FAST])
    out = {name: {} for name in named}
    for cell, summary in summaries.items():
        run_dir = launch_dir / cell
        metrics_path = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
        out[cell.split("/")[0]][summary["backend"]] = (summary, records, run_dir)
    for name in report:
        sweep_report.build(launch_dir / name)
    return out


def held_to_theory(summary: dict, bytes_pct: float, states: bool = True) -> dict:
    """A cell's run ended ok, its model states within 1% of the theory (`states`), its peak within 10% and its
    bytes within `bytes_pct`; its figures, for what a test asserts beyond."""
    assert summary["status"] == "ok", summary.get("reason")
    f = summary["figures"]
    if states:
        assert abs(f["memory/model_states_error_pct"]) <= 1, f["memory/model_states_error_pct"]
    assert abs(f["memory/tensor_peak_error_pct"]) <= 10, f["memory/tensor_peak_error_pct"]
    assert abs(f["comm/bytes_error_pct"]) <= bytes_pct, f["comm/bytes_error_pct"]
    return f

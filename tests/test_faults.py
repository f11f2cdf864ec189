"""Faults become recorded outcomes and the sweep goes on: an exception, a NaN loss, a hung rank and a killed
rank, injected into real 2-rank runs (harness/faults.py). No rank outlives its run, and completed steps stay
on disk. (Emulated OOM: tests/test_sweeps.py.)"""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import cli

pytestmark = pytest.mark.slow
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    proc = cli("-m", "fault.kind=none,raise,nan,hang,kill", "fault.rank=1", "fault.step=3",
               f"dist.timeout_s={TIMEOUT_S}", "train.steps=6", "train.warmup_steps=1", "logger=none",
               "train.measure_flops=false", f"paths.root={root}", "sweep.name=faults")
    assert proc.returncode == 0, proc.stderr[-3000:]  # the sweep itself never crashes
    runs = {}
    for path in (root / "sweeps" / "faults").glob("*/summary.json"):
        run_dir = path.parent
        kind = next(p.split("=")[1] for p in run_dir.name.split(",") if p.startswith("fault.kind="))
        fault = run_dir / "ranks" / "fault.json"
        detected_s = path.stat().st_mtime - json.loads(fault.read_text())["time"] if fault.exists() else None
        runs[kind] = (json.loads(path.read_text()), run_dir, detected_s)
    return runs


def test_every_fault_is_a_row_with_the_right_status(fault_sweep):
    status = {kind: s["status"] for kind, (s, _, _) in fault_sweep.items()}
    assert status == {"none": "ok", "raise": "failed", "nan": "failed", "hang": "timeout", "kill": "failed"}


def test_the_reason_names_the_rank_that_caused_it(fault_sweep):
    raised, run_dir, _ = fault_sweep["raise"]
    assert raised["reason"].startswith("rank 1 failed: InjectedFault injected exception on rank 1 at step 3")
    assert "InjectedFault" in (run_dir / raised["traceback"]).read_text()  # the traceback is kept and named
    assert fault_sweep["kill"][0]["reason"].startswith("rank 1 killed: exited without a report (signal SIGKILL)")
    assert "non-finite loss at step 3" in fault_sweep["nan"][0]["reason"]
    assert "Timed out" in fault_sweep["hang"][0]["reason"]


def test_faults_are_detected_promptly(fault_sweep):
    for kind in ("raise", "nan", "kill"):
        assert fault_sweep[kind][2] < 5, (kind, fault_sweep[kind][2])
    assert TIMEOUT_S - 1 < fault_sweep["hang"][2] < TIMEOUT_S + 15  # about dist.timeout_s


def test_completed_steps_are_kept_and_no_rank_is_left(fault_sweep):
    for kind in ("raise", "kill", "hang"):
        _, run_dir, _ = fault_sweep[kind]
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1, 2], (kind, steps)  # everything before the fault at step 3, nothing torn
    for _, run_dir, _ in fault_sweep.values():
        left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
        assert left == [], f"processes of {run_dir.name} still running: {left}"

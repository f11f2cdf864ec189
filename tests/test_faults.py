"""Faults become recorded outcomes and the sweep goes on. One real 2-rank sweep mixes a good run with an
injected OOM, exception, NaN loss, SIGKILLed rank and hung rank (harness/faults.py). Then the same command
runs again: it skips the good run, re-runs every failed one, and is stopped with Ctrl-C while the hung run
waits, as a user would. No rank outlives its run, and completed steps and results stay on disk."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, cli
from harness.warm_ops import extensions_dir

pytestmark = pytest.mark.slow
TIMEOUT_S = 10
KINDS = ["none", "oom", "raise", "nan", "kill", "hang"]  # hang last: the re-run is interrupted while it waits


def sweep_args(root) -> list:
    return ["-m", f"fault.kind={','.join(KINDS)}", "fault.rank=1", "fault.step=3", f"dist.timeout_s={TIMEOUT_S}",
            "train.steps=6", "train.warmup_steps=1", "logger=none", "train.measure_flops=false",
            f"paths.root={root}", "sweep.name=faults"]


def read_runs(root) -> dict:
    runs = {}
    for path in (root / "sweeps" / "faults").glob("*/summary.json"):
        run_dir = path.parent
        kind = next(p.split("=")[1] for p in run_dir.name.split(",") if p.startswith("fault.kind="))
        fault = json.loads((run_dir / "ranks" / "fault.json").read_text()) if kind != "none" else None
        detected_s = path.stat().st_mtime - fault["time"] if fault else None
        runs[kind] = {"summary": json.loads(path.read_text()), "dir": run_dir, "detected_s": detected_s,
                      "fault_time": fault["time"] if fault else None, "mtime_ns": path.stat().st_mtime_ns}
    return runs


def steps(run_dir) -> list:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def left_running(run_dir) -> list:
    return subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    proc = cli(*sweep_args(root))
    assert proc.returncode == 0, proc.stderr[-3000:]  # the sweep itself never crashes
    return root, read_runs(root)


def test_every_fault_is_a_row_with_the_right_status(fault_sweep):
    root, runs = fault_sweep
    status = {kind: run["summary"]["status"] for kind, run in runs.items()}
    assert status == {"none": "ok", "oom": "oom", "raise": "failed", "nan": "failed", "kill": "failed",
                      "hang": "timeout"}
    table = (root / "sweeps" / "faults" / "summary.md").read_text()  # the sweep's table has every run
    assert all(f"- ddp: {s}:" in table for s in ("oom", "failed", "timeout"))


def test_the_reason_names_the_rank_that_caused_it(fault_sweep):
    _, runs = fault_sweep
    raised = runs["raise"]["summary"]
    assert raised["reason"].startswith("rank 1 failed: InjectedFault injected exception on rank 1 at step 3")
    assert "InjectedFault" in (runs["raise"]["dir"] / raised["traceback"]).read_text()  # kept and named
    assert runs["oom"]["summary"]["reason"].startswith("rank 1 oom: MemoryBudgetExceeded out of memory (injected)")
    assert runs["kill"]["summary"]["reason"].startswith("rank 1 killed: exited without a report (signal SIGKILL)")
    assert "non-finite loss at step 3" in runs["nan"]["summary"]["reason"]
    assert "Timed out" in runs["hang"]["summary"]["reason"]
    assert all(run["summary"]["params"] == 125_248 for run in runs.values())  # failed rows still say the size


def test_faults_are_detected_promptly(fault_sweep):
    _, runs = fault_sweep
    for kind in ("oom", "raise", "nan", "kill"):
        assert runs[kind]["detected_s"] < 5, (kind, runs[kind]["detected_s"])
    assert TIMEOUT_S - 1 < runs["hang"]["detected_s"] < TIMEOUT_S + 15  # about dist.timeout_s


def test_completed_steps_are_kept_and_no_rank_is_left(fault_sweep):
    _, runs = fault_sweep
    assert steps(runs["none"]["dir"]) == [0, 1, 2, 3, 4, 5]
    for kind in ("oom", "raise", "kill", "hang"):
        assert steps(runs[kind]["dir"]) == [0, 1, 2], kind  # everything before the fault at step 3, nothing torn
    for kind, run in runs.items():
        assert left_running(run["dir"]) == [], f"processes of the {kind} run still running"


def test_rerun_skips_the_good_run_reruns_the_failed_and_ctrl_c_stops_it(fault_sweep):
    root, before = fault_sweep
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": extensions_dir()}
    # a terminal's Ctrl-C: SIGINT to the sweep's process, with SIGINT's default disposition (as in a shell)
    proc = subprocess.Popen([sys.executable, "-m", "harness.train", *sweep_args(root)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    hang_fault = before["hang"]["dir"] / "ranks" / "fault.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:  # wait for the re-run's hang to happen
        fault = json.loads(hang_fault.read_text()) if hang_fault.exists() else None
        if fault and fault["time"] > before["hang"]["fault_time"]:
            break
        time.sleep(0.2)
    time.sleep(1)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    stopped_s = time.time() - sent

    assert proc.returncode == 130, err[-3000:]
    assert stopped_s < 10, stopped_s
    assert "interrupted" in err and "Traceback" not in err
    after = read_runs(root)
    # the good run was skipped and its result is untouched
    assert out.count("[skip]") == 1 and after["none"]["mtime_ns"] == before["none"]["mtime_ns"]
    # every failed run ran again, with the same outcome; its earlier attempt is kept beside it
    for kind in ("oom", "raise", "nan", "kill"):
        assert after[kind]["fault_time"] > before[kind]["fault_time"], kind
        assert after[kind]["summary"]["status"] == before[kind]["summary"]["status"], kind
        assert json.loads((after[kind]["dir"] / "attempts" / "1" / "summary.json").read_text()) == \
            before[kind]["summary"]
    # the interrupted run is recorded as such, with the steps it completed, and none of its ranks is left
    hang = after["hang"]
    assert hang["summary"]["status"] == "failed" and "interrupted" in hang["summary"]["reason"]
    assert steps(hang["dir"]) == [0, 1, 2]
    for kind, run in after.items():
        assert left_running(run["dir"]) == [], f"processes of the {kind} run still running"

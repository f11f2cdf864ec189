"""Faults become recorded outcomes and the sweep goes on. One real 2-rank sweep mixes a good run with an
injected OOM, exception, NaN loss, SIGKILLed rank, segfaulting rank and hung rank (harness/runtime/faults.py). Then the same command
runs again: it skips the good run, re-runs every failed one, and is stopped with Ctrl-C while the hung run
waits, as a user would. No rank outlives its run, and completed steps and results stay on disk."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO
from harness.studies.faults.drill import interrupt_rerun, left_running, read_runs, sweep_command

# a launcher drill: run by `make test-drills` (and CI), not by `make test`
pytestmark = [pytest.mark.slow, pytest.mark.drill]
TIMEOUT_S = 10


def steps(run_dir) -> list:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory):
    """The drill's sweep (harness/studies/faults/drill.py, `make faults`), run here as the CLI would run it."""
    root = tmp_path_factory.mktemp("faults")
    proc = subprocess.run(sweep_command(root, TIMEOUT_S, []), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the sweep itself never crashes
    return root, read_runs(root)


def test_every_fault_is_a_row_with_the_right_status(fault_sweep):
    root, runs = fault_sweep
    status = {kind: run["summary"]["status"] for kind, run in runs.items()}
    assert status == {"none": "ok", "oom": "oom", "raise": "failed", "nan": "failed", "kill": "failed",
                      "segfault": "failed", "hang": "timeout"}
    table = (root / "sweeps" / "faults" / "summary.md").read_text()  # the sweep's table has every run
    assert all(f"- ddp: {s}:" in table for s in ("oom", "failed", "timeout"))


def test_the_reason_names_the_rank_that_caused_it(fault_sweep):
    _, runs = fault_sweep
    raised = runs["raise"]["summary"]
    assert raised["reason"].startswith("rank 1 failed: InjectedFault injected exception on rank 1 at step 3")
    assert "InjectedFault" in (runs["raise"]["dir"] / raised["traceback"]).read_text()  # kept and named
    assert runs["oom"]["summary"]["reason"].startswith("rank 1 oom: MemoryBudgetExceeded out of memory (injected)")
    assert runs["kill"]["summary"]["reason"].startswith("rank 1 killed: exited without a report (signal SIGKILL)")
    # a crash in native code: the frame it hit, from the rank's faulthandler dump, whose callers name the fault
    crashed = runs["segfault"]
    assert crashed["summary"]["reason"].startswith("rank 1 killed: exited without a report (signal SIGSEGV): "
                                                   "Segmentation fault in ctypes/__init__.py:"), crashed["summary"]
    assert "in _segfault" in (crashed["dir"] / "ranks" / "rank1.fatal.txt").read_text()
    assert not (crashed["dir"] / "ranks" / "rank0.fatal.txt").exists()  # rank 0 was stopped, not crashed
    # every rank sees the all-reduced NaN; the reason names the rank whose own loss was non-finite
    assert runs["nan"]["summary"]["reason"].startswith("rank 1 failed: NonFiniteLoss non-finite loss at step 3")
    assert "Timed out" in runs["hang"]["summary"]["reason"]
    assert all(run["summary"]["params"] == 125_248 for run in runs.values())  # failed rows still say the size


def test_faults_are_detected_promptly(fault_sweep):
    _, runs = fault_sweep
    for kind in ("oom", "raise", "nan", "kill", "segfault"):
        assert runs[kind]["detected_s"] < 5, (kind, runs[kind]["detected_s"])
    assert TIMEOUT_S - 1 < runs["hang"]["detected_s"] < TIMEOUT_S + 15  # about dist.timeout_s


def test_completed_steps_are_kept_and_no_rank_is_left(fault_sweep):
    _, runs = fault_sweep
    assert steps(runs["none"]["dir"]) == [0, 1, 2, 3, 4, 5]
    for kind in ("oom", "raise", "kill", "segfault", "hang"):
        assert steps(runs[kind]["dir"]) == [0, 1, 2], kind  # everything before the fault at step 3, nothing torn
        assert runs[kind]["summary"]["figures"]["train/steps_completed"] == 3, kind  # and the row says so
    for kind, run in runs.items():
        assert left_running(run["dir"]) == [], f"processes of the {kind} run still running"


def test_rerun_skips_the_good_run_reruns_the_failed_and_ctrl_c_stops_it(fault_sweep):
    root, before = fault_sweep
    again = interrupt_rerun(root, TIMEOUT_S, [], before)  # SIGINT once the re-run's hung rank has hung
    out, err, stopped_s = again["stdout"], again["stderr"], again["stopped_s"]
    print(f"sweep stopped {stopped_s:.2f} s after SIGINT")

    assert again["returncode"] == 130, err[-3000:]
    assert stopped_s < 10, stopped_s
    assert "interrupted" in err and "Traceback" not in err
    assert f"make report SWEEP={root / 'sweeps' / 'faults'}" in err  # how to refresh the table it did not write
    after = read_runs(root)
    # the good run was skipped and its result is untouched
    assert out.count("[skip]") == 1 and after["none"]["mtime_ns"] == before["none"]["mtime_ns"]
    # every failed run ran again, with the same outcome; its earlier attempt is kept beside it
    for kind in ("oom", "raise", "nan", "kill", "segfault"):
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

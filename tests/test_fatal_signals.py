"""A rank that dies of a fatal signal writes no outcome; its faulthandler dump (core/fatal_dump.py) names where.
Real processes that really crash (SIGSEGV from reading address 0), with a second thread running as a rank's
parent watch does; no torch, so each takes a tenth of a second. The same path under torchrun is the fault
drill's `fault.kind=segfault` row (tests/test_faults.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from conftest import REPO
from harness.core.fatal_dump import read_dump
from harness.core.records import RankOutcome, Status

CHILD = """
import ctypes, os, signal, sys, threading, time
from pathlib import Path
from harness.core.fatal_dump import dumped_on_fatal_signal, exit_now

dump = Path(sys.argv[1])
# as runtime/worker.py does: torchrun stops a surviving rank with SIGTERM, and its handler leaves by os._exit
signal.signal(signal.SIGTERM, lambda signum, frame: exit_now(143, dump))

def watch():
    while True:
        time.sleep(0.01)

def crash_in_native_code():
    ctypes.string_at(0)

with dumped_on_fatal_signal(dump):
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if sys.argv[2] == "crash":
        crash_in_native_code()
    if sys.argv[2] in ("stopped", "killed"):
        os.kill(os.getpid(), signal.SIGTERM if sys.argv[2] == "stopped" else signal.SIGKILL)
        time.sleep(30)
"""


def run_child(tmp_path, what: str):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(CHILD))
    dump = tmp_path / "ranks" / "rank1.fatal.txt"
    proc = subprocess.run([sys.executable, str(script), str(dump), what], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO)})
    return proc, dump


def test_a_segfault_is_named_by_the_frame_it_hit(tmp_path):
    proc, dump = run_child(tmp_path, "crash")
    assert proc.returncode == -signal.SIGSEGV, proc.stderr
    text = dump.read_text()
    assert "Thread " in text and "in watch" in text  # every thread's stack is kept, not only the crashing one's
    outcome = RankOutcome.killed(1, proc.returncode, None, text)
    assert outcome.status == Status.KILLED
    # the innermost Python frame of the crashing thread: ctypes.string_at, the call into native code
    assert outcome.reason.startswith("exited without a report (signal SIGSEGV): Segmentation fault in "
                                     "ctypes/__init__.py:"), outcome.reason
    assert outcome.reason.endswith(" string_at (every thread's stack: ranks/rank1.fatal.txt)"), outcome.reason
    assert "rank.py" in text and "crash_in_native_code" in text  # its callers are in the dump


def test_a_rank_that_ends_normally_leaves_no_dump(tmp_path):
    proc, dump = run_child(tmp_path, "end")
    assert proc.returncode == 0, proc.stderr
    assert not dump.exists() and dump.parent.is_dir()


def test_a_rank_stopped_by_the_launcher_leaves_no_dump(tmp_path):
    """A surviving rank stopped by SIGTERM leaves through os._exit, past the context's own cleanup: an empty
    dump left behind would read as a crash of a rank that was only stopped (CI saw it under load)."""
    proc, dump = run_child(tmp_path, "stopped")
    assert proc.returncode == 143, proc.stderr
    assert not dump.exists() and dump.parent.is_dir()


def test_the_launcher_removes_a_sigkilled_ranks_empty_dump(tmp_path):
    proc, dump = run_child(tmp_path, "killed")
    assert proc.returncode == -signal.SIGKILL and dump.exists() and dump.stat().st_size == 0
    assert read_dump(dump) == "" and not dump.exists()  # as launcher/outcome.rank_outcomes reads it


def test_without_a_dump_the_reason_is_the_signal_alone():
    assert RankOutcome.killed(0, -9, None, "").reason == "exited without a report (signal SIGKILL)"
    assert RankOutcome.killed(0, None, None, "").reason == "exited without a report (killed by a signal?)"
    # no exit code (a cells launch's rank) but a dump: the dump names the signal, no question left
    assert RankOutcome.killed(3, None, None, "Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n"
                              ).reason == ("exited without a report (a fatal signal): Aborted (every thread's stack: "
                                           "ranks/rank3.fatal.txt)")
    # the crashed rank is named before one torchrun killed after it (test_cells' drill: rank 0 SIGTERMed mid-write
    # of its outcome, rank 1 the SIGSEGV), whatever their order
    crashed = RankOutcome.killed(1, None, None, "Fatal Python error: Segmentation fault\n")
    assert min([RankOutcome.killed(0, None), crashed], key=RankOutcome.sort_key) is crashed
    segfault = RankOutcome.killed(1, -11, None, "Fatal Python error: Segmentation fault\n")
    assert min([RankOutcome.killed(0, -15), segfault], key=RankOutcome.sort_key) is segfault

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
from harness.core.records import RankOutcome, Status

CHILD = """
import ctypes, sys, threading, time
from pathlib import Path
from harness.core.fatal_dump import dumped_on_fatal_signal

def watch():
    while True:
        time.sleep(0.01)

def crash_in_native_code():
    ctypes.string_at(0)

with dumped_on_fatal_signal(Path(sys.argv[1])):
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    if sys.argv[2] == "crash":
        crash_in_native_code()
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


def test_without_a_dump_the_reason_is_the_signal_alone():
    assert RankOutcome.killed(0, -9, None, "").reason == "exited without a report (signal SIGKILL)"
    assert RankOutcome.killed(0, None, None, "").reason == "exited without a report (killed by a signal?)"

"""A rank that dies of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) writes no outcome and no
traceback; Python's faulthandler still can. The rank turns it on into ranks/rank<R>.fatal.txt for as long as
it trains, and the launcher quotes the frame the signal hit in the row's reason (RankOutcome.killed), so that
a crash in a library (a profiler, a collective, a JIT-built op) is named by the row rather than only by a
signal number. Stdlib only: the launcher reads the dump without torch."""
from __future__ import annotations

import faulthandler
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def dumped_on_fatal_signal(path: Path) -> Iterator[None]:
    """faulthandler on, every thread's stack to `path`; the file is removed if nothing went into it. A disk that
    cannot take the file (full, read-only) leaves the rank without the dump, never without its run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        dump = open(path, "w")
    except OSError:
        yield
        return
    with dump:
        faulthandler.enable(file=dump, all_threads=True)
        try:
            yield
        finally:
            faulthandler.disable()
    drop_if_empty(path)


def drop_if_empty(path: Path) -> None:
    """Remove a dump nothing was written into: the rank ended without a fatal signal. A rank that leaves through
    os._exit (stopped by torchrun's SIGTERM, its launcher lost) or is SIGKILLed never reaches the context's exit,
    and its empty file would read as a crash."""
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass


def read_dump(path: Path) -> str:
    """The launcher's read of a rank's dump, "" if none; an empty one (a SIGKILLed rank's) is removed."""
    drop_if_empty(path)
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def exit_now(code: int, dump: Path) -> None:
    """os._exit from a signal handler, without leaving an empty dump behind (see drop_if_empty)."""
    faulthandler.disable()
    drop_if_empty(dump)
    os._exit(code)


def fatal_frame(dump: str) -> str:
    """`Segmentation fault in profiler/profiler.py:123 stop` from a faulthandler dump: its error and the innermost frame
    of the thread the signal hit ("Current thread ... (most recent call first)"); "" when there is no dump."""
    error = re.search(r"^Fatal Python error: (.+)$", dump, re.M)
    if not error:
        return ""
    current = dump.find("Current thread")
    frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', dump[current:]) if current >= 0 else None
    if not frame:
        return error.group(1).strip()
    path, line, function = frame.groups()
    short = "/".join(Path(path).parts[-2:])  # torch's profiler/profiler.py, ctypes/__init__.py
    return f"{error.group(1).strip()} in {short}:{line} {function}"

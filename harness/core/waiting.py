"""Waits that say what they wait for: no wait in a run is silent for long, and none is endless.

A wait that lasts past ANNOUNCE_AFTER_S prints one line naming what it waits for, since when and the bound
that ends it, and repeats it every REPEAT_EVERY_S; past its bound it raises WaitTimedOut, whose message names
what was waited for and the setting that bounds it, so the run ends with that reason.

A rank's output goes to launcher.log, which nobody watches: a rank announces a wait by writing
`ranks/rank<R>.wait.json` while it lasts (`announced`), and the parent prints it (launcher/progress.py).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

ANNOUNCE_AFTER_S = 30.0
REPEAT_EVERY_S = 60.0

T = TypeVar("T")


class WaitTimedOut(TimeoutError):
    """A bounded wait ran out; str() is the one-line reason (what, how long, which setting bounds it)."""


def clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Announcer:
    """Decides when a wait that started at `since` is announced: first after `after_s`, then every `every_s`."""

    def __init__(self, since: Optional[float] = None, after_s: float = ANNOUNCE_AFTER_S,
                 every_s: float = REPEAT_EVERY_S):
        self.since = time.time() if since is None else since
        self.after_s, self.every_s = after_s, every_s
        self.last: Optional[float] = None

    def due(self, now: Optional[float] = None) -> bool:
        now = time.time() if now is None else now
        if now - self.since < self.after_s:
            return False
        if self.last is not None and now - self.last < self.every_s:
            return False
        self.last = now
        return True

    def line(self, what: str, bound: str = "", since: Optional[float] = None) -> str:
        """`since`: when the awaited thing began (another process's build), if not when this wait began."""
        waited = time.time() - self.since
        tail = f"; gives up after {bound}" if bound else ""
        return (f"shardbench: waiting for {what} since {clock(self.since if since is None else since)} "
                f"(waited {waited:.0f} s{tail})")


def wait_for(ready: Callable[[], Optional[T]], what: Callable[[], str] | str, bound_s: float, bound_name: str,
             say: Callable[[str], None] = stderr_line, poll_s: float = 0.5,
             since_of: Optional[Callable[[], Optional[float]]] = None, after_s: float = ANNOUNCE_AFTER_S,
             started: Optional[float] = None) -> T:
    """Poll `ready()` until it returns something other than None, and return that. `what` (a text, or a callable
    for a description that changes, such as who holds a lock) is announced as above, with the start that
    `since_of()` gives, if any; after `bound_s` seconds WaitTimedOut names it and `bound_name` (the setting a
    user changes to wait longer), counted from `started` (a wait continued from an earlier one) or now."""
    announce = Announcer(since=started, after_s=after_s)
    bound = f"{bound_name}={bound_s:.3g} s"
    while True:
        found = ready()
        if found is not None:
            return found
        described = what() if callable(what) else what
        if time.time() - announce.since > bound_s:
            raise WaitTimedOut(f"gave up waiting for {described} after {time.time() - announce.since:.0f} s "
                               f"({bound})")
        if announce.due():
            say(announce.line(described, bound, since_of() if since_of else None))
        time.sleep(poll_s)


@contextmanager
def announced(path: Path, what: str, bound: str) -> Iterator[None]:
    """While the block runs, `path` says what this process waits for, since when and what bounds the wait."""
    from .rundir import write_json

    try:
        write_json(path, {"what": what, "since": time.time(), "bound": bound})
    except OSError:  # a full disk: the wait goes unannounced, the run itself is unaffected
        pass
    try:
        yield
    finally:
        path.unlink(missing_ok=True)

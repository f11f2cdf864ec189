"""A run dir belongs to one launch at a time: the parent holds an exclusive `flock` on `<run_dir>/.lock` for
the run's life, and writes who holds it (pid, host, start time, command) into the file.

The kernel drops a flock when its holder dies, however it dies (SIGKILL and the OOM killer included), so a
dead holder's lock is simply taken by the next launch; the dead attempt's files are then archived as any
earlier attempt's are. A second launch while the holder lives gets `RunDirBusy` and changes nothing.
flock is per host: on a shared filesystem across nodes, NFS (v4) and Lustre honour it only when mounted
with locking support (`local_lock=none` / `flock`).
"""
from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional

LOCK_NAME = ".lock"


class RunDirBusy(RuntimeError):
    """Another live launch holds the run dir."""

    def __init__(self, run_dir: Path, holder: dict):
        self.run_dir, self.holder = Path(run_dir), holder
        super().__init__(f"{run_dir} is in use by {describe(holder)}")


def describe(holder: dict) -> str:
    started = holder.get("started")
    since = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started)) if started else ""
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{since}"


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


class RunLock:
    """`with RunLock(run_dir):` holds the run dir, or raises RunDirBusy without touching anything in it."""

    def __init__(self, run_dir: Path, name: str = LOCK_NAME, info: Optional[dict] = None):
        """`name`: another lock file in the dir (a multi-node run's followers each hold their node's); `info`:
        more to say about the holder (the run's rendezvous id and node, launcher/nodes.py)."""
        self.path = Path(run_dir) / name
        self.info = info or {}
        self.fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise RunDirBusy(self.path.parent, holder) from None
        me = {"pid": os.getpid(), "host": platform.node(), "started": time.time(), "argv": sys.argv[1:],
              **self.info}
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, json.dumps(me).encode(), 0)
        except OSError:  # a full disk: the lock holds all the same, only its holder goes unnamed
            pass
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # nobody holds it now
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder(run_dir: Path, name: str = LOCK_NAME) -> Optional[dict]:
    """Who holds the run dir (or its lock `name`) now: a live launch in another process, or None."""
    path = Path(run_dir) / name
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        return _read(fd) or {"pid": "?", "host": "?"}
    finally:
        os.close(fd)

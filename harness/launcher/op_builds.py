"""DeepSpeed's JIT ops in TORCH_EXTENSIONS_DIR: built, being built, or left behind by a build that died.

torch builds an op in `<extensions>/<op>/` under a `lock` file (torch.utils.file_baton.FileBaton), which the
building process creates, keeps open for the whole build and removes at its end. A process killed mid-build
(SIGKILL, a closed terminal, a scheduler's time limit) leaves the file behind, and every later build of that
op waits for it forever, printing nothing. So here a lock is live only while some process holds it open. A
lock nobody holds is stale: its build is dead, and what it left (the lock, half-written objects, and the
compilers it started, still running in the op's dir) is removed before the op is built again.

A finished build is marked by shardbench itself: `shardbench-built.json` in the op's dir, written by
`shardbench warm-ops` once the op has loaded, with the torch and DeepSpeed versions it was built against. An op
without it counts as not built, whatever files are there, so a partial build is never taken for a finished one.

shardbench's own builds of an op queue on a flock (`<extensions>/.<op>.build.lock`, core/runlock.py) that names
the builder and its start, which a waiting process prints. Nothing here imports torch; psutil finds the
processes that hold a lock or still work in an op's dir.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, List, Optional

from ..config import families
from ..core.paths import extensions_dir
from ..core.runlock import RunDirBusy, RunLock, holder
from ..core.waiting import clock, stderr_line, wait_for

MARKER = "shardbench-built.json"
TORCH_LOCK = "lock"
BOUND_NAME = "ops.build_timeout_s"


def op_dir(op: str) -> Path:
    return Path(extensions_dir()) / op


def lease_name(op: str) -> str:
    return f".{op}.build.lock"


def versions() -> dict:
    """What a build depends on besides its sources: a new torch, or a new version of a family's package
    (DeepSpeed), builds the op again."""
    out = {}
    for package in ("torch", *families.packages()):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def read_marker(op: str) -> Optional[dict]:
    try:
        return json.loads((op_dir(op) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def write_marker(op: str, loaded: bool, seconds: float) -> None:
    """`loaded` False: this accelerator has no such op (e.g. shm comm off the CPU), and nothing is to build."""
    path = op_dir(op) / MARKER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**versions(), "loaded": loaded, "build_s": round(seconds, 1),
                               "finished": time.time()}))
    os.replace(tmp, path)


def is_built(op: str) -> bool:
    marker = read_marker(op)
    if not marker or {k: marker.get(k) for k in versions()} != versions():
        return False
    if (op_dir(op) / TORCH_LOCK).exists():
        return False
    return not marker.get("loaded") or any(op_dir(op).glob("*.so"))


def _processes():
    import psutil

    for proc in psutil.process_iter():
        if proc.pid != os.getpid():
            yield proc


def lock_holders(lock: Path) -> List[int]:
    """Pids of the processes that hold `lock` open: torch's FileBaton keeps it open while it builds."""
    import psutil

    target = os.path.realpath(lock)
    found = []
    for proc in _processes():
        try:
            if any(f.path == target for f in proc.open_files()):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def leftovers(directory: Path):
    """Processes still working in `directory` (ninja and the compilers of a build whose Python died)."""
    import psutil

    root = os.path.realpath(directory)
    found = []
    for proc in _processes():
        try:
            cwd = proc.cwd()
        except (psutil.Error, OSError):
            continue
        if cwd == root or cwd.startswith(root + os.sep):
            found.append(proc)
    return found


def stop(procs, grace_s: float = 3.0) -> None:
    import psutil

    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def remove_build(op: str) -> None:
    shutil.rmtree(op_dir(op), ignore_errors=True)


def clear_stale(op: str, say: Callable[[str], None] = stderr_line) -> bool:
    """When the op's torch lock is held by no process, remove it with the build it belonged to (stopping the
    compilers that build left running) and say so in one line. True when there was a stale lock."""
    lock = op_dir(op) / TORCH_LOCK
    if not lock.exists() or lock_holders(lock):
        return False
    try:
        started = f", started {clock(lock.stat().st_mtime)}"
    except OSError:  # removed meanwhile by a build that just ended
        return False
    left = leftovers(op_dir(op))
    stop(left)
    remove_build(op)
    killed = f"; stopped {len(left)} compiler process(es) it left running" if left else ""
    say(f"shardbench: removed a stale build lock of {families.op_label(op)} in {op_dir(op)}: the build that took it"
        f"{started}, is no longer running{killed}; the op will be built again")
    return True


def take_turn(op: str, bound_s: float, say: Callable[[str], None] = stderr_line) -> RunLock:
    """Hold this op's build lease, waiting visibly for another shardbench build of it, then for a live build
    by anything else (a process holding torch's lock). A stale torch lock is cleared. Raises WaitTimedOut
    after `bound_s`."""
    ext = Path(extensions_dir())

    def lease() -> Optional[RunLock]:
        try:
            return RunLock(ext, name=lease_name(op), info={"op": op}).acquire()
        except RunDirBusy:
            return None

    def other_shardbench() -> str:
        return f"another process (pid {(holder(ext, lease_name(op)) or {}).get('pid', '?')}) building {op}"

    def lease_start():
        return (holder(ext, lease_name(op)) or {}).get("started")

    started = time.time()
    ours = wait_for(lease, other_shardbench, bound_s, BOUND_NAME, say, since_of=lease_start, after_s=0.0)
    try:
        lock = op_dir(op) / TORCH_LOCK

        def torch_lock_gone() -> Optional[bool]:
            if not lock.exists() or clear_stale(op, say):
                return True
            return None

        def other_build() -> str:
            return f"another process (pid {', '.join(map(str, lock_holders(lock))) or '?'}) building {op}"

        def lock_start():
            try:
                return lock.stat().st_mtime
            except OSError:
                return None

        wait_for(torch_lock_gone, other_build, bound_s, BOUND_NAME, say, since_of=lock_start, after_s=0.0,
                 started=started)
    except BaseException:
        ours.release()
        raise
    return ours

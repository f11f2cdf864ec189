"""What a compiled graph keeps, kept on disk between processes (runtime/compiled/compiled_activations.py): a trace takes
seconds (an 8B block's four compiles about 15 s here, a whole tiny module's four 6-12 s), and every rank of a run,
the memory check's parent, the estimator and the advisor ask for the same ones."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Optional

from ...core.paths import traces_dir


def on_disk(*code_files: str):
    """Decorate a trace of JSON-able arguments: its result is read from the clone's cache (core/paths.traces_dir)
    when the same code (the `code_files`' bytes: a change to the tracing traces again), torch and transformers
    traced the same arguments before. The file is written whole, then renamed, so a reader never sees half of it.
    A trace that found nothing (None) is not written: the next process tries again. The versions are read from
    the installed packages' metadata: a hit imports neither (transformers alone takes seconds).

    A trace is counted once at a time: the process that starts it leaves a mark with its pid beside the file, and
    another asking for it meanwhile waits for the file rather than tracing it too (the advisor's search asks for
    the model's counts that its replays' process started counting as it began, runtime/simulate/early.py); a mark
    whose process has ended without writing is passed over."""
    def decorate(trace):
        @lru_cache(maxsize=64)
        @functools.wraps(trace)
        def cached(*args):
            from importlib.metadata import version

            code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in code_files)).hexdigest()
            key = json.dumps([code, version("torch"), version("transformers"), trace.__name__, *args])
            path = traces_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
            if path.is_file() or _waited_for(path):
                return json.loads(path.read_text())
            path.parent.mkdir(parents=True, exist_ok=True)
            mark = _marked(path)
            try:
                out = trace(*args)
                if out is not None:
                    partial_path = path.with_suffix(f".{os.getpid()}.tmp")
                    partial_path.write_text(json.dumps(out))
                    partial_path.replace(path)
            finally:
                if mark is not None:
                    mark.unlink(missing_ok=True)
            return out
        return cached
    return decorate


# the longest a process waits for another's trace before tracing it too: never forever, should two processes ever
# each wait on a trace the other's trace asks for (a 70B block's compiles take about 15 s here)
WAIT_S = 600


def _mark_of(path: Path) -> Path:
    return path.with_suffix(".tracing")


def _marked(path: Path) -> Optional[Path]:
    """The mark that this process is tracing `path`'s arguments, or None where another process's mark is there."""
    mark = _mark_of(path)
    try:
        fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return mark


def _waited_for(path: Path) -> bool:
    """Wait while another live process's mark says it is tracing `path`'s arguments: True once the file is there,
    False at once where no live process is (no mark, or a mark left by a process that ended or long ago)."""
    mark, since = _mark_of(path), time.monotonic()
    while time.monotonic() - since < WAIT_S:
        try:
            pid, age = int(mark.read_text() or 0), time.time() - mark.stat().st_mtime
        except (FileNotFoundError, ValueError):
            return path.is_file()
        if path.is_file():
            return True
        if not _alive(pid) or age > WAIT_S:  # ended, or a mark older than any trace (its pid taken by another)
            mark.unlink(missing_ok=True)
            return path.is_file()
        time.sleep(0.02)
    return False


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

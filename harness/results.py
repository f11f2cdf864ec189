"""Result files, written atomically (temp file in the same dir, then rename): a crash never leaves a
half-written summary."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def json_safe(obj: Any) -> Any:
    # JSON has no NaN/inf: write them as null so every reader can parse the file
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_MODE = 0o666 & ~_umask()  # what open() would give: mkstemp's private 0600 would hide results from others


def write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


ATTEMPT_FILES = ("summary.json", "metrics.jsonl", "launcher.log", "ranks", "config.yaml", "env.json", "wandb")


def archive_attempt(run_dir: Path) -> Path | None:
    """Move an earlier attempt's outputs into <run_dir>/attempts/<n>/ before the run starts again.

    A re-run must not mix with what the last attempt left: metrics.jsonl is appended to, and a stale
    ranks/rank<R>.json would be read as this attempt's outcome. Nothing is deleted: a failed attempt's
    steps, tracebacks and summary stay readable there."""
    run_dir = Path(run_dir)
    present = [name for name in ATTEMPT_FILES if (run_dir / name).exists()]
    if "summary.json" not in present and "metrics.jsonl" not in present and "ranks" not in present:
        return None
    attempts = run_dir / "attempts"
    number = 1 + max((int(p.name) for p in attempts.glob("*") if p.name.isdigit()), default=0)
    target = attempts / str(number)
    target.mkdir(parents=True)
    for name in present:
        os.replace(run_dir / name, target / name)
    return target

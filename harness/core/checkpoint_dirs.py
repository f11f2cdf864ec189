"""Where a run's checkpoints live, which of them are complete and which are intact, without torch (the parent
checks a resume before any rank starts; runtime/train_state.py writes them).

    <run_dir>/checkpoints/step_<k>/complete.json   written last, by rank 0, once every rank has written: the
                                                  state after k optimizer steps is whole. Without it the
                                                  directory is a save that never finished, and is ignored.
                                                  It lists every file of the save with its size and a
                                                  BLAKE2b digest (`files`): a file truncated, altered or
                                                  missing since is named before anything loads it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

MARKER = "complete.json"
CHUNK = 1 << 22


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def step_of(path: Path) -> int:
    """The steps a checkpoint dir holds (step_<k>)."""
    return int(Path(path).name.split("_")[1])


def saves(root: Path) -> List[Path]:
    """Every save dir under `root`, complete or not, newest first."""
    return sorted((p for p in Path(root).glob("step_*") if p.is_dir()), key=step_of, reverse=True)


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def latest(root: Path) -> Optional[Path]:
    """The complete checkpoint with the most steps under `root`, or None."""
    return next((p for p in saves(root) if is_complete(p)), None)


def read_marker(path: Path) -> dict:
    return json.loads((Path(path) / MARKER).read_text())


def digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def manifest(path: Path) -> dict:
    """{file relative to the checkpoint: [bytes, digest]} of every file of a save but its marker."""
    return {f.relative_to(path).as_posix(): [f.stat().st_size, digest(f)]
            for f in sorted(Path(path).rglob("*")) if f.is_file() and f.name != MARKER}


def damage(path: Path) -> Optional[str]:
    """What is wrong with a complete checkpoint's files against its marker's list, as one line; None when every
    file is there as written (or the marker predates the list)."""
    path = Path(path)
    for name, (size, written) in (read_marker(path).get("files") or {}).items():
        f = path / name
        if not f.is_file():
            return f"{f}: missing (written at save, {size:,} bytes)"
        if f.stat().st_size != size:
            return f"{f}: {f.stat().st_size:,} bytes where {size:,} were written (truncated or overwritten)"
        if digest(f) != written:
            return f"{f}: altered since it was written (its BLAKE2b digest differs)"
    return None


def latest_intact(root: Path) -> Tuple[Optional[Path], List[Tuple[Path, str]]]:
    """The newest complete checkpoint whose files are intact, and the newer ones passed over, with why."""
    skipped = []
    for path in (p for p in saves(root) if is_complete(p)):
        problem = damage(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def prune(root: Path, keep: int) -> List[Path]:
    """Delete the complete checkpoints under `root` older than its newest `keep` (0: none), and any unfinished
    save older than the oldest one kept; the deleted dirs. A complete one loses its marker first, so that a
    deletion cut short leaves an incomplete save, which no resume takes."""
    if keep <= 0:
        return []
    complete = [p for p in saves(root) if is_complete(p)]
    if not complete:
        return []
    oldest_kept = step_of(complete[min(keep, len(complete)) - 1])
    doomed = complete[keep:] + [p for p in saves(root) if not is_complete(p) and step_of(p) < oldest_kept]
    for path in doomed:
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def bytes_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


RESOLVED = "resume.json"  # <run_dir>/resume.json: the checkpoint the parent chose for train.resume=auto


def to_resume(resume: str, checkpoints: Path) -> Optional[Path]:
    """Which checkpoint `train.resume` names: never, fresh -> None; auto -> the one the run's parent chose (the
    latest intact one, in <run_dir>/resume.json), else the latest complete one under the run's checkpoints, or
    None; a path -> that checkpoint."""
    if resume in ("never", "fresh"):
        return None
    if resume == "auto":
        chosen = Path(checkpoints).parent / RESOLVED
        if chosen.is_file():
            path = json.loads(chosen.read_text()).get("path")
            return Path(path) if path else None
        return latest(checkpoints)
    return Path(resume)

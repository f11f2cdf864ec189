"""Where a run's checkpoints live and which of them are complete, without torch (the parent checks a resume
before any rank starts; runtime/train_state.py writes them).

    <run_dir>/checkpoints/step_<k>/complete.json   written last, by rank 0, once every rank has written: the
                                                  state after k optimizer steps is whole. Without it the
                                                  directory is a save that never finished, and is ignored.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

MARKER = "complete.json"


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:07d}"


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def latest(root: Path) -> Optional[Path]:
    """The complete checkpoint with the most steps under `root`, or None."""
    done = [p for p in Path(root).glob("step_*") if p.is_dir() and is_complete(p)]
    return max(done, key=lambda p: int(p.name.split("_")[1]), default=None)


def read_marker(path: Path) -> dict:
    return json.loads((Path(path) / MARKER).read_text())


def bytes_on_disk(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def to_resume(resume: str, checkpoints: Path) -> Optional[Path]:
    """Which checkpoint `train.resume` names: never, fresh -> None; auto -> the latest complete one under the
    run's checkpoints, or None; a path -> that checkpoint."""
    if resume in ("never", "fresh"):
        return None
    if resume == "auto":
        return latest(checkpoints)
    return Path(resume)

"""A run that fills the disk: room reserved for its summary, and the reason it names (launcher/torchrun.py)."""
from __future__ import annotations

import shutil
from pathlib import Path
from ..core.checkpoint_dirs import is_complete, latest, saves, step_of
from ..core.rundir import RunDir


RESERVE_BYTES = 256 * 1024  # room kept back for the summary of a run that fills the disk


def _reserve(run_dir: RunDir) -> Path:
    """Hold back RESERVE_BYTES on the results filesystem (real bytes: tmpfs and quotas count pages, not sizes),
    so that a run which fills the disk can still record why it failed."""
    path = run_dir.root / ".reserve"
    with open(path, "wb") as f:
        f.write(b"\0" * RESERVE_BYTES)
    return path


def disk_full_reason(run_dir: RunDir, min_free_mib: int) -> str:
    """A reason prefix when the results filesystem is (nearly) full, measured before the reserve is freed."""
    free = shutil.disk_usage(run_dir.root).free
    if free >= max(min_free_mib * 2**20, RESERVE_BYTES):
        return ""
    where = (f"{free // 1024} KiB free on the filesystem of {run_dir.root} when the ranks ended "
             f"(paths.min_free_mib={min_free_mib})")
    # a save the disk cut short: newer than the latest complete checkpoint, and never marked complete
    kept, newest = latest(run_dir.checkpoints), next(iter(saves(run_dir.checkpoints)), None)
    if newest is not None and not is_complete(newest):  # a save the disk cut short, never marked complete
        after = f"{kept.name} is intact and train.resume=auto goes on from it" if kept else "no earlier checkpoint"
        return f"disk full while saving step {step_of(newest)}: {where}; {after}; "
    return f"disk full: {where}; "

"""Studies start runs the way a user does: the real CLI, `python -m harness.train`, in a subprocess."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional


def train_command(*overrides: str, run_dir: Optional[Path] = None) -> List[str]:
    """The CLI with `overrides`; with `run_dir`, a single run in exactly that dir (its parent as paths.root)."""
    where = [f"paths.root={run_dir.parent}", f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    return [sys.executable, "-m", "harness.train", *overrides, *where]

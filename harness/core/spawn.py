"""The command line of a process the harness starts itself: a command of the table (harness/commands.py), run as
the user would run it. tests/test_layers.py reads every `command_argv("<name>", ...)` call and holds the command's
module to the same layering as an import."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional


def command_argv(name: str, *args: str) -> List[str]:
    """`python -m harness <name> <args>` with this interpreter."""
    return [sys.executable, "-m", "harness", name, *args]


def train_command(*overrides: str, run_dir: Optional[Path] = None) -> List[str]:
    """`shardbench train` with `overrides`, as a user starts a run (studies start theirs so); with `run_dir`, a
    single run in exactly that dir (its parent as paths.root)."""
    where = [f"paths.root={run_dir.parent}", f"hydra.run.dir={run_dir}"] if run_dir is not None else []
    return command_argv("train", *overrides, *where)

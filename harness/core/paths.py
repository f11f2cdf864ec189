"""Where the repository, its Hydra config root and DeepSpeed's built ops are."""
from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"


SNAPSHOT = "SHARDBENCH_SNAPSHOT"  # set (shardbench <command> --snapshot, make <target> SNAPSHOT=1): write committed


def snapshot() -> bool:
    return os.environ.get(SNAPSHOT, "") not in ("", "0")


def results_dir(*parts: str) -> Path:
    """Where a study writes when not told (--out): results/local/<parts>, which git ignores, so that no command
    rewrites a committed result by surprise; with --snapshot (make ... SNAPSHOT=1) the committed results/<parts>,
    a change to commit on purpose, as `make demo-snapshot` is (issue 74)."""
    return REPO / "results" / Path(*parts) if snapshot() else REPO / "results" / "local" / Path(*parts)


def extensions_dir() -> str:
    """Where DeepSpeed's JIT ops live: TORCH_EXTENSIONS_DIR, else `.cache/torch_extensions` in the clone.

    Not shared between clones: torch's JIT hashes the build flags, which include the venv's include paths,
    so another clone's venv rebuilds anyway (measured: 112 s in a fresh clone with a warm shared cache)."""
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(REPO / ".cache" / "torch_extensions")


def traces_dir() -> Path:
    """Where what compiled blocks and whole modules keep is kept between processes
    (runtime/compiled/compiled_activations.py): in the clone, as its torch and transformers decide it."""
    return REPO / ".cache" / "compiled_kept"

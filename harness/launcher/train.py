"""`shardbench train [overrides]` (add `-m` for a Hydra multirun): one run, or a sweep of runs.

config/overrides.py checks the command line's keys, options and types before Hydra; Hydra composes the config;
launcher/run.py validates it, prepares the run dir and starts the ranks.
"""
from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from ..config import schema
from .run import command, run_one

schema.register()
# an absolute path: Hydra reads a relative one as a module path when the entry is `python -m harness`
CONF = str(Path(__file__).resolve().parents[2] / "conf")


@hydra.main(version_base="1.3", config_path=CONF, config_name="config")
def hydra_main(cfg: DictConfig) -> dict:
    return run_one(cfg)


def main() -> int:
    command(hydra_main)
    return 0

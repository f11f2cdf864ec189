"""`python -m harness.train [overrides]` (add `-m` for a Hydra multirun): one run, or a sweep of runs.

harness/config/overrides.py checks the command line's keys, options and types; Hydra composes the config;
harness/launcher/run.py validates it, prepares the run dir and starts the ranks.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from harness.config import schema
from harness.launcher.run import command, run_one

schema.register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    return run_one(cfg)


if __name__ == "__main__":
    command(main)

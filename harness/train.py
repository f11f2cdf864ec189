"""`python -m harness.train [overrides]` (add `-m` for a Hydra multirun): one run, or a sweep of runs.

harness/config/overrides.py checks the command line's keys, options and types; Hydra composes the config;
harness/launcher/run.py validates it, prepares the run dir and starts the ranks.
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from harness.config import overrides, schema
from harness.launcher.run import run_one

schema.register()


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    return run_one(cfg)


if __name__ == "__main__":
    mistake = overrides.problem(sys.argv[1:])  # before Hydra, whose own errors run to 7-15 lines
    if mistake:
        print(f"shardbench: invalid config: {mistake}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except KeyboardInterrupt:
        # the launcher has already stopped the ranks and marked the running run as interrupted
        print("shardbench: interrupted; finished runs are kept, and re-running the same command resumes the "
              "sweep (runs that finished ok are skipped)", file=sys.stderr)
        sys.exit(130)

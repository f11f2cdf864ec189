"""Many runs of one world size in one launch: each cell a whole run in its own run dir, trained one after another
by the same ranks (runtime/cells_worker.py).

A short run costs mostly its imports and its process group: about 8 s a run here, against 2 to 5 s of training.
The tests' fixture sweeps (every backend on one shape) run as cells, as `make memory-check` does its matrix, and
keep what a sweep of single runs gives them: per cell config.yaml, env.json, settings.json and metrics.jsonl
written by the same code (runtime/worker.run), summary.json by the launcher's (launcher/outcome.summarise),
then the sweep's tables and report. Only the process is shared: each cell builds its model, strategy and data from its own config and seed.
A cell that fails ends the launch (its peers would wait in a collective); it gets the failure summary a run
would, from the rank outcome files, and each cell after it reads "not run: cell <name> failed first".
On CUDA a cell leaves device memory behind for the next, so allocator peaks there are a run's own only in the
first cell (results/gpu/nvidia-h100-80gb-hbm3/cells_vs_runs.md); `make gpu-check` runs each backend alone.
"""
from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from omegaconf import OmegaConf

from ..config import derive, resume_check, rules
from ..config.compose import compose
from ..core.errors import ConfigError
from ..core.paths import REPO
from ..core.rundir import RunDir, write_json, write_text
from ..reporting import sweep_report
from .environment import environment
from .ops import ensure_ops
from .outcome import summarise
from .torchrun import die_with_parent, launch_config, rank_env, torchrun_cmd

WORKER = "harness.runtime.cells_worker"


def prepare(cfg, run_dir: RunDir) -> None:
    """What a run's parent writes before its ranks start (launcher/run.py): the resolved config and env.json."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    write_text(run_dir.config, OmegaConf.to_yaml(cfg, resolve=True))
    write_json(run_dir.env, environment(cfg))


def from_earlier_cell(cfg, earlier: Sequence[RunDir]) -> bool:
    """Whether the cell resumes a checkpoint under one of the earlier cells' run dirs (their checkpoints/)."""
    resume = cfg.train.resume
    if resume in resume_check.RESUME_WORDS:
        return False
    return any(Path(resume).resolve().is_relative_to(d.checkpoints.resolve()) for d in earlier)


def with_resume(cfg, resume: str):
    """A copy of `cfg` with another train.resume."""
    other = copy.deepcopy(cfg)
    other.train.resume = resume
    return other


def run_cells(sweep_dir: Path, cells: Sequence[Tuple[str, List[str]]], common: Sequence[str] = (),
              report: bool = True) -> Dict[str, dict]:
    """Run every cell (a name, which is its run dir under `sweep_dir`, and its overrides after `common`) in one
    launch; return each cell's summary by name, and write the sweep's tables and report (unless `report` is
    off: `make report SWEEP=<sweep_dir>` writes them later). Every cell must have the first one's ranks per node
    and nodes; a config the rules refuse raises ConfigError before any launch. A cell may resume a checkpoint an
    earlier cell saves (`train.resume=<earlier cell's run dir>/checkpoints/step_<k>`): it is checked as a run's
    parent checks it, at the cell's start, and refused there as that cell's failure."""
    sweep_dir = Path(sweep_dir)
    configs = [(RunDir(sweep_dir / name), compose([*common, *overrides])) for name, overrides in cells]
    shape = {(c.parallelism.nproc_per_node, c.parallelism.nnodes) for _, c in configs}
    if len(shape) != 1:
        raise ConfigError(f"cells of one launch share ranks per node and nodes; these ask {sorted(shape)}")
    for index, (run_dir, cfg) in enumerate(configs):
        # a cell may resume a checkpoint an earlier cell of this launch saves: not there yet, so its checks wait for
        # the cell's start (runtime/cells_worker.py), and every other rule is checked now
        later = from_earlier_cell(cfg, [d for d, _ in configs[:index]])
        rules.check(with_resume(cfg, "fresh") if later else cfg)
    first = configs[0][1]
    for run_dir, cfg in configs:
        prepare(cfg, run_dir)
        blocked = ensure_ops(cfg, run_dir, rank_env(cfg))
        if blocked is not None:
            raise RuntimeError(blocked.reason)
    cells_file = sweep_dir / "cells.json"
    write_json(cells_file, [str(run_dir.root) for run_dir, _ in configs])
    with open(sweep_dir / "launcher.log", "w") as log:
        proc = subprocess.run(torchrun_cmd(first, sweep_dir, module=(WORKER, str(cells_file))), cwd=REPO,
                              env=rank_env(launch_config([cfg for _, cfg in configs])), stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
    # each cell's summary as a run's launcher writes it, with the notes a run would carry; a cell the launch
    # never reached says which cell ended it, not only what its missing rank files would suggest (a kill)
    out, ended_by = {}, None
    for (name, _), (run_dir, cfg) in zip(cells, configs):
        reached = any(run_dir.rank_outcome(rank).exists() for rank in range(derive.world_size(cfg)))
        prefix = f"not run: cell {ended_by} failed first, which ends the launch; " if ended_by and not reached else ""
        out[name] = summarise(cfg, run_dir, proc.returncode, rules.notes(cfg), reason_prefix=prefix)
        if out[name]["status"] != "ok" and ended_by is None:
            ended_by = name
    if report:
        sweep_report.build(sweep_dir)
    return out

"""Many runs of one world size in one launch: each cell a whole run in its own run dir, trained one after another
by the same ranks (runtime/cells_worker.py).

A short run costs mostly its imports and its process group: about 8 s a run here, against 2 to 5 s of training.
The tests' fixture sweeps (every backend on one shape) run as cells, as `make memory-check` does its matrix, and
keep what a sweep of single runs gives them: per cell config.yaml, env.json, settings.json and metrics.jsonl
written by the same code (runtime/worker.run), summary.json by the launcher's (launcher/outcome.summarise),
then the sweep's tables and report. Only the process is shared: each cell builds its model, strategy and data from its own config and seed.
A cell that fails ends its launch (its peers would wait in a collective); it gets the failure summary a run
would, from the rank outcome files, and the cells after it go on in a new launch (sweep_dir/launcher.<n>.log),
so that one failed row costs a start-up, never the rest of the sweep. A cell whose rank died of a native crash (a
fatal signal, its stack in ranks/rank<R>.fatal.txt: a heap corruption inside a library, a segfault) is run once
more in that new launch, from scratch: its first attempt moves to <cell>/attempts/<n>/ and the summary says so
(`earlier_attempts`, a note, `launch/cell_reruns`), so that a crash that does not come back is a recorded
event, not a lost row; one that comes back is the row's failure.
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
from ..core.fatal_dump import read_dump
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
    launch (more after a failed cell: the module's docstring); return each cell's summary by name, and write the
    sweep's tables and report (unless `report` is off: `make report SWEEP=<sweep_dir>` writes them later). Every
    cell must have the first one's ranks per node and nodes; a config the rules refuse raises ConfigError before
    any launch. A cell may resume a checkpoint an earlier cell saves (`train.resume=<earlier cell's run
    dir>/checkpoints/step_<k>`): it is checked as a run's parent checks it, at the cell's start, and refused
    there as that cell's failure."""
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
    for run_dir, cfg in configs:
        prepare(cfg, run_dir)
        blocked = ensure_ops(cfg, run_dir, rank_env(cfg))
        if blocked is not None:
            raise RuntimeError(blocked.reason)
    out: Dict[str, dict] = {}
    earlier: Dict[str, List[dict]] = {}  # a rerun cell's earlier attempts
    pending, launch = list(range(len(configs))), 0
    while pending:
        launch += 1
        returncode = _launch(sweep_dir, [configs[i] for i in pending], launch)
        done, rerun = 0, False
        for i in pending:
            (name, _), (run_dir, cfg) = cells[i], configs[i]
            if not _reached(run_dir, cfg):
                break  # the launch ended at an earlier cell (or never started one)
            out[name] = _summary(cfg, run_dir, returncode, earlier.get(name, []))
            done += 1
            if out[name]["status"] == "ok":
                continue
            if _crashed(run_dir, cfg) and name not in earlier:  # once more, from scratch, in the next launch
                moved = run_dir.archive_attempt(with_checkpoints=True)
                earlier[name] = [{"reason": out.pop(name)["reason"], "dir": str(moved.relative_to(run_dir.root))}]
                prepare(cfg, run_dir)
                done, rerun = done - 1, True
            break  # the cells after it go on in the next launch
        if not done and not rerun:  # the launch started no cell: another would not either
            for position, i in enumerate(pending):
                (name, _), (run_dir, cfg) = cells[i], configs[i]
                prefix = f"not run: its launch ended before it started a cell ({_log_name(launch)}); "
                out[name] = _summary(cfg, run_dir, returncode, earlier.get(name, []), prefix if position else "")
            break
        pending = pending[done:]
    if report:
        sweep_report.build(sweep_dir)
    return out


def _log_name(launch: int) -> str:
    return "launcher.log" if launch == 1 else f"launcher.{launch}.log"


def _launch(sweep_dir: Path, configs: Sequence[Tuple[RunDir, object]], launch: int) -> int:
    """One torchrun of the cells worker over these cells, in order; its exit code."""
    cells_file = sweep_dir / ("cells.json" if launch == 1 else f"cells.{launch}.json")
    write_json(cells_file, [str(run_dir.root) for run_dir, _ in configs])
    first = configs[0][1]
    with open(sweep_dir / _log_name(launch), "w") as log:
        proc = subprocess.run(torchrun_cmd(first, sweep_dir, module=(WORKER, str(cells_file))), cwd=REPO,
                              env=rank_env(launch_config([cfg for _, cfg in configs])), stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
    return proc.returncode


def _reached(run_dir: RunDir, cfg) -> bool:
    """Whether any rank started the cell: left its outcome, or the dump file a rank opens at a cell's start and
    writes on a fatal signal (in CI's crash every rank of the cell left no outcome, the crashed one its dump)."""
    return any(run_dir.rank_outcome(rank).exists() or run_dir.rank_fatal(rank).exists()
               for rank in range(derive.world_size(cfg)))


def _crashed(run_dir: RunDir, cfg) -> bool:
    """Whether a rank of the cell died of a fatal signal (its faulthandler dump: core/fatal_dump.py)."""
    return any(read_dump(run_dir.rank_fatal(rank)) for rank in range(derive.world_size(cfg)))


def _summary(cfg, run_dir: RunDir, returncode: int, earlier: List[dict], reason_prefix: str = "") -> dict:
    """The cell's summary as a run's launcher writes it, with the notes a run would carry, and a rerun cell's
    earlier attempt."""
    notes = rules.notes(cfg) + [f"run a second time after a native crash in its first attempt ({e['dir']}/): "
                                f"{e['reason']}" for e in earlier]
    summary = summarise(cfg, run_dir, returncode, notes, reason_prefix=reason_prefix)
    if earlier:
        summary["earlier_attempts"] = earlier
        summary.setdefault("figures", {})["launch/cell_reruns"] = len(earlier)
        if summary["status"] != "ok":
            summary["reason"] += f" (and in its first attempt, {earlier[0]['dir']}/: {earlier[0]['reason']})"
        write_json(run_dir.summary, summary)
    return summary

"""One rank of many runs in one launch (launcher/cells.py): `python -m harness.runtime.cells_worker <cells.json>`.

Each cell is a run dir the parent prepared; this rank trains them one after another through worker.run, the
code of a single run, in one process group, leaving each cell's rank outcome as a run's rank does. Between
cells, what a framework changed globally is put back: DeepSpeed's ZeRO-3 engine replaces
torch.nn.functional.linear for every module built after it ("This will persist unless manually reset", its own
log line), which would change what a later cell keeps under autocast. A failed cell ends the launch: its peers
would otherwise wait for it in a collective. A cell that resumes a named checkpoint checks it first, as a run's
parent does: it may be one an earlier cell of the launch saved, which did not exist when the launch began.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import resume_check
from ..core.errors import ConfigError
from ..core.fatal_dump import dumped_on_fatal_signal
from ..core.records import RankOutcome, Status
from ..core.rundir import RunDir, write_json, write_text
from . import preflight
from .compiled.compiled_activations import counts_for
from .rank_life import best_effort, classify, end_cell, exit_without_teardown, reached
from .worker import load_config, run, start


def train_cell(run_dir: RunDir, rank: int, world: int, device: torch.device) -> int:
    started = time.time()
    cfg = load_config(run_dir)
    counts = counts_for(cfg)
    params = counts["total"]  # a failed row still says the size
    try:
        preflight.refuse_what_cannot_fit(cfg, counts)  # as a single run's ranks do (worker.main)
        if cfg.train.resume not in resume_check.RESUME_WORDS:  # maybe an earlier cell's save: checked only now
            # complete and compatible; the files' digests are the parent's check (an earlier cell's save is this
            # launch's own), not every rank's again
            found = resume_check.resume_problems(cfg, Path(cfg.train.resume), check_files=False)
            if found:
                raise ConfigError(found[0])
        run(cfg, run_dir, rank, world, device)
    except BaseException as exc:  # noqa: BLE001 - recorded as a run's rank records it, then the launch ends
        best_effort(write_text, run_dir.rank_traceback(rank), traceback.format_exc())
        status, peer = classify(exc)
        best_effort(write_json, run_dir.rank_outcome(rank), RankOutcome(
            rank, status, error=type(exc).__name__, peer=peer, params=params, reason=str(exc).strip().splitlines()[0][:500]
            if str(exc).strip() else "", elapsed_s=time.time() - started, reached=reached(exc, device)).to_dict())
        traceback.print_exc()
        return 1
    best_effort(write_json, run_dir.rank_outcome(rank),
                RankOutcome(rank, Status.OK, params=params, elapsed_s=time.time() - started).to_dict())
    return 0


def main(cells_file: Path) -> int:
    run_dirs = [RunDir(Path(p)) for p in json.loads(cells_file.read_text())]
    rank, world, device = start(load_config(run_dirs[0]), run_dirs[0])
    linear = torch.nn.functional.linear
    for run_dir in run_dirs:
        torch.nn.functional.linear = linear
        with dumped_on_fatal_signal(run_dir.rank_fatal(rank)):  # a crash is named in this cell's row
            if train_cell(run_dir, rank, world, device):
                return 1
        end_cell()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main(Path(sys.argv[1])))

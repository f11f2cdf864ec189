"""One rank of `make bench`'s paired launch: `python -m harness.studies.bench.worker <plan.json>`.

Each pair of the plan is a harness run and the independent loop on the same shape, trained one after the other
by the same ranks, in the order the plan gives (it alternates):
- the harness run is a cell (runtime/cells_worker.train_cell): the code a run's rank executes, in the run dir
  the parent prepared, writing its metrics.jsonl as a run does;
- the independent loop is studies/independent_loop.train, which imports nothing from the harness; rank 0 writes
  its step times to the pair's `out`.

Why one launch and not a launch a run: separate launches differ by more than their loops do. On this 2-core
machine the same config's forward took 50.1 to 58.5 ms from one launch to the next (results/bench/README.md),
which left an interval of about +-8% at 8 pairs. In one launch both loops share the process, its imports and
heap, the cores its ranks settled on, and the minute they run in; what differs is the code of the step. Between
two trainings, what a framework changed globally is put back, as between the cells of a launch.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ...core.rundir import RunDir, write_json
from ...runtime.cells_worker import train_cell
from ...runtime.rank_life import end_cell, exit_without_teardown
from ...runtime.worker import load_config, start
from . import independent_loop


def main(plan_file: Path) -> int:
    pairs = json.loads(plan_file.read_text())["pairs"]
    first = RunDir(Path(pairs[0]["run_dir"]))
    rank, world, device = start(load_config(first), first)
    linear = torch.nn.functional.linear  # DeepSpeed's ZeRO-3 replaces it for every module built after it
    for pair in pairs:
        for side in pair["order"]:
            torch.nn.functional.linear = linear
            if side == "harness":
                if train_cell(RunDir(Path(pair["run_dir"])), rank, world, device):
                    return 1
            else:
                result = independent_loop.train(pair["spec"], device)
                if rank == 0:
                    write_json(Path(pair["out"]), result)
            end_cell()
            dist.barrier()  # neither side starts while a rank is still finishing the other
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main(Path(sys.argv[1])))

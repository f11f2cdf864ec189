"""One rank of `make memory-check`, started by torchrun: `python -m harness.studies.memory.worker <dir>`.

Runs every cell of `<dir>/cells.json` (a resolved run config each) in this one process group, one after the
other, through the same construction (runtime/worker.prepare) and the same train loop as a run: a few steps,
then the loop's profiled memory steps. Rank 0 appends one line per cell to `<dir>/cells.jsonl`: each rank's
lowest and highest profiled peak of live tensors and its closure check. Starting the ranks once for a whole
matrix is what makes it cheap: a run's cost is mostly imports.

Between cells, what a framework changed globally is put back: DeepSpeed's ZeRO-3 engine replaces
torch.nn.functional.linear with its own for every module built after it ("This will persist unless manually
reset", DeepSpeed's own log line), which would change what a later DDP cell keeps under autocast.
"""
from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main(out: Path) -> int:
    import torch
    import torch.distributed as dist
    from omegaconf import OmegaConf

    from ...config import schema
    from ...runtime import loop
    from ...runtime.sink import NullSink
    from ...runtime.rank_life import end_cell, freeze_imports
    from ...runtime.worker import prepare

    cells = json.loads((out / "cells.json").read_text())
    first = cells[0]["config"]
    cuda = first["parallelism"]["device"] == "cuda"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=first["dist"]["timeout_s"]))
    freeze_imports()  # so that the collection after each cell walks only the cell's objects
    linear = torch.nn.functional.linear
    for cell in cells:
        torch.nn.functional.linear = linear
        cfg = OmegaConf.merge(OmegaConf.structured(schema.RunConfig), cell["config"])
        ready = prepare(cfg, rank, world, device)
        result = loop.train(ready.model, ready.strategy, ready.batches, cfg, device, NullSink())
        mine = {"rank": rank, **{k: result.memory_profile.get(k) for k in
                                 ("peak", "peak_highest", "method", "at_marker", "unaccounted", "steps")},
                "model_states": result.model_states}
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            with open(out / "cells.jsonl", "a") as f:
                f.write(json.dumps({"name": cell["name"], "ranks": gathered}) + "\n")
        del ready, result
        end_cell()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from ...runtime.worker import exit_without_teardown  # as main() does: torch is imported only to run

    exit_without_teardown(main(Path(sys.argv[1])))

"""One rank of a run at any world size (rank 0 unless SHARDBENCH_REPLAY_RANK says), replayed in one process over the mirror process group
(runtime/mirror_group.py) on real tensors: the work its step asks of the host and the device, counted as a real
rank counts it (runtime/work_count.py), without starting the run. The time model prices that work
(theory/op_costs.py): a prediction for a world, a model or a backend not yet run.

    python -m harness.runtime.replay <dir>     # every <dir>/<name>.yaml (a resolved run config) -> <dir>/<name>.json

Ranks can differ in their work (ZeRO-1/2's partitions hold different parameters, the last one the padding), so
a prediction replays the first and the last rank and takes the slower (studies/time_extrapolation.py). The
rank is built as a run builds it (runtime/worker.prepare), trains `train.steps` steps through the loop's
own step (so that what a framework settles in its first steps, DDP's bucket order or ZeRO-3's prefetch trace,
is settled), then runs the two counted steps. It needs the model to fit this host: the work of a model too large
for it is not counted (the time model then falls back on its roofline lower bound, theory/time.py).
"""
from __future__ import annotations

import functools
import gc
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from ..config import schema
from . import mirror_group, schedule, work_count
from .loop import TrainStep


def start(world: int, rank: int = 0) -> None:
    """The mirror process group of `world` ranks, this process its rank `rank` (once a process: the configs it
    replays share it, as the cells of a launch share theirs, so that a framework's cached groups stay valid)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    dist.init_process_group(mirror_group.NAME, store=FakeStore(), rank=rank, world_size=world)


def replay(cfg) -> dict:
    """The counted work of this process's rank of `cfg`'s world (Work.to_dict()), over the group `start` made."""
    from .worker import prepare

    device = torch.device("cpu")
    ready = prepare(cfg, dist.get_rank(), dist.get_world_size(), device)
    step = TrainStep(ready.model, ready.strategy, ready.batches, cfg.parallelism.grad_accum, device,
                     functools.partial(schedule.learning_rate, cfg.optim, cfg.train.steps))
    for i in range(max(cfg.train.steps, 2)):
        step(i)
    counted = iter(range(cfg.train.steps, cfg.train.steps + 2))
    return work_count.count(lambda: step(next(counted)), mirror_group.CallLog()).to_dict()


def main(directory: Path) -> int:
    """Replay every config in `directory`, which must share one world size (launcher/replays.py groups them)."""
    from ..config.derive import world_size

    torch.set_num_threads(1)  # as torchrun runs each rank here
    linear = torch.nn.functional.linear
    failed = 0
    paths = sorted(directory.glob("*.yaml"))
    configs = [OmegaConf.merge(OmegaConf.structured(schema.RunConfig), OmegaConf.load(p)) for p in paths]
    worlds = {world_size(cfg) for cfg in configs}
    if len(worlds) != 1:
        raise SystemExit(f"replay: the configs in {directory} ask {sorted(worlds)} ranks; one world a process")
    start(worlds.pop(), int(os.environ.get("SHARDBENCH_REPLAY_RANK", "0")))
    for path, cfg in zip(paths, configs):
        torch.nn.functional.linear = linear  # ZeRO-3 replaces it for modules built after it (cells_worker.py)
        try:
            out = {"ok": True, "work": replay(cfg)}
        except Exception as exc:  # noqa: BLE001 - a config that cannot be replayed is a result, with its cause
            out = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}",
                   "traceback": traceback.format_exc()}
            failed += 1
        path.with_suffix(".json").write_text(json.dumps(out))
        gc.collect()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

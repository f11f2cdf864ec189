"""One rank of a run at any world size (rank 0 unless SHARDBENCH_REPLAY_RANK says), replayed in one process over the mirror process group
(runtime/simulate/mirror_group.py) on real tensors: the work its step asks of the host and the device, counted as a real
rank counts it (runtime/measure/work_count.py), without starting the run. The time model prices that work
(theory/op_costs.py): a prediction for a world, a model or a backend not yet run.

    # every <dir>/<name>.yaml (a resolved run config) -> <dir>/<name>.json; --fake: on fake tensors (fake_replay.py)
    python -m harness.runtime.simulate.replay <dir> [--fake]
    # import (and the named families' preloads), then fork a replay of each batch named on stdin (wait())
    python -m harness.runtime.simulate.early [--preload deepspeed,fsdp]

Ranks can differ in their work (ZeRO-1/2's partitions hold different parameters, the last one the padding), so
a prediction replays the first and the last rank and takes the slower (studies/timing/extrapolation.py). The
rank is built as a run builds it (runtime/worker.prepare), trains `train.steps` steps through the loop's
own step (so that what a framework settles in its first steps, DDP's bucket order or ZeRO-3's prefetch trace,
is settled), then runs the two counted steps. On real tensors it needs the model to fit this host; a model too
large for it is replayed on fake tensors instead (`--fake`, runtime/simulate/fake_replay.py: shapes without values).
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

from ...config import schema
from . import mirror_group
from .. import schedule
from ..measure import work_count
from ..loop import TrainStep


def start(world: int, rank: int = 0) -> None:
    """The mirror process group of `world` ranks, this process its rank `rank` (once a world: the configs it
    replays share it, as the cells of a launch share theirs, so that a framework's cached groups stay valid)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29511"))
    dist.init_process_group(mirror_group.NAME, store=FakeStore(), rank=rank, world_size=world)


def settled_step(cfg, first_steps: int = 2):
    """This process's rank of `cfg`'s world, built as a run builds it and trained through its first steps (at
    least `first_steps`): a callable that runs its next step."""
    from ..worker import prepare

    device = torch.device("cpu")
    ready = prepare(cfg, dist.get_rank(), dist.get_world_size(), device)
    step = TrainStep(ready.model, ready.strategy, ready.batches, cfg.parallelism.grad_accum, device,
                     functools.partial(schedule.learning_rate, cfg.optim, cfg.train.steps))
    for i in range(max(cfg.train.steps, first_steps)):
        step(i)
    counted = iter(range(cfg.train.steps, cfg.train.steps + 2))
    return lambda: step(next(counted))


def replay(cfg) -> dict:
    """The counted work of this process's rank of `cfg`'s world (Work.to_dict()), over the group `start` made."""
    return work_count.count(settled_step(cfg), mirror_group.CallLog()).to_dict()


def taken(directory: Path):
    """The configs of `directory` this process takes, one at a time, in the batch's order (launcher/replays.ORDER,
    the costliest first): each is taken by the first process to create its `.taken` mark, so that the batch's
    processes share it as they go and end together, whatever the parent guessed of the configs' costs."""
    order = directory / "order.txt"
    names = order.read_text().split() if order.exists() else sorted(p.stem for p in directory.glob("*.yaml"))
    for name in names:
        try:
            os.close(os.open(directory / f"{name}.taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        yield directory / f"{name}.yaml"


def main(directory: Path, fake: bool = False) -> int:
    """Replay the configs of `directory` this process takes (`taken`), which must share one world size unless
    `fake` (launcher/replays.py groups them); with `fake`, on fake tensors."""
    from ...config.derive import world_size
    from .fake_replay import replay_fake

    torch.set_num_threads(1)  # as torchrun runs each rank here
    linear = torch.nn.functional.linear
    failed, world = 0, None
    schema_defaults = OmegaConf.structured(schema.RunConfig)  # made once (20 ms): merge copies it for each config
    # what is alive now (the imports, ~1M objects) outlives every config: kept out of the collections between
    # configs, which otherwise walked it each time (0.28 s a config here, a third of a small replay)
    gc.freeze()
    for path in taken(directory):
        cfg = OmegaConf.merge(schema_defaults, OmegaConf.load(path))
        if world_size(cfg) != world:  # the first config, or (a fake batch) the next world
            # DeepSpeed keeps its groups for the process: a real replay is one world a process. A fake one is
            # FSDP2's (studies/predict/counted_shapes.py), whose mesh is made anew by each config: the group is made
            # again for each world (the batch's order takes them world by world)
            if world is not None and not fake:
                raise SystemExit(f"replay: the configs in {directory} ask {world} and {world_size(cfg)} ranks; "
                                 "one world a process")
            if world is not None:
                dist.destroy_process_group()
            world = world_size(cfg)
            start(world, int(os.environ.get("SHARDBENCH_REPLAY_RANK", "0")))
        torch.nn.functional.linear = linear  # ZeRO-3 replaces it for modules built after it (cells_worker.py)
        try:
            out = {"ok": True, "work": replay_fake(cfg, settled_step) if fake else replay(cfg)}
        except Exception as exc:  # noqa: BLE001 - a config that cannot be replayed is a result, with its cause
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            out = {"ok": False, "error": f"{type(exc).__name__}: {first}", "traceback": traceback.format_exc()}
            failed += 1
        path.with_suffix(".json").write_text(json.dumps(out))
        # the config's garbage collected, and what outlives it (modules its framework imported, its caches)
        # frozen too: each collection then walks one config's objects, not every earlier one's (tiny_llama's
        # 24 replays a process collected in 1.9 s, 0.07 s so; the default dry run 3.5 s faster)
        gc.collect()
        gc.freeze()
    if world is not None:
        dist.destroy_process_group()
    return 1 if failed else 0


def wait(finishing=()) -> int:
    """Import first, and finish the strategy families' preloads (`finishing`: what Family.preload_replays returned,
    runtime/simulate/early.py), then fork a child to replay each batch the parent names on stdin, and say on stdout
    when each ended (launcher/started_early.py has the protocol); end once stdin closes and every child has."""
    import select

    from . import fake_replay  # noqa: F401 - paid while the parent still searches

    if finishing:  # their messages away from stdout, the parent's pipe (DeepSpeed's logger writes to stdout)
        sys.stdout.flush()
        kept, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        try:
            for finish in finishing:
                finish()
        finally:
            sys.stdout.flush()
            os.dup2(kept, 1)
            os.close(kept)
    gc.freeze()  # the imports, out of every collection: the children fork without copying their pages to walk them

    children: dict = {}  # pid -> batch index
    handed, open_input, pending = 0, True, b""
    while open_input or children or b"\n" in pending:
        if open_input and b"\n" not in pending and select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 65536)  # the descriptor, not sys.stdin: a buffered line would hide from select
            open_input, pending = bool(chunk), pending + chunk
        if b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            asked = json.loads(line)
            pid = os.fork()
            if pid == 0:  # the child: its own output away from the parent's pipe, and no interpreter teardown
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                status = 1
                try:
                    os.environ.update(asked["env"])
                    status = main(Path(asked["argv"][0]), fake="--fake" in asked["argv"][1:])
                finally:
                    os._exit(status)
            children[pid], handed = handed, handed + 1
        for pid in list(children):
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                print(f"ended {children.pop(pid)} {os.waitstatus_to_exitcode(code)}", flush=True)
        if not open_input and children:
            done, code = os.waitpid(-1, 0)
            print(f"ended {children.pop(done)} {os.waitstatus_to_exitcode(code)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), fake="--fake" in sys.argv[2:]))

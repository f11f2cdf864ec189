"""Fault injection, so that every failure path can be tested on CPU with real ranks (`fault.kind=...`).

    python -m harness train fault.kind=kill fault.rank=1 fault.step=3     # SIGKILL rank 1 at step 3
    fault.kind: none | raise (an exception) | nan (a non-finite loss) | hang (stop in place, as a rank
                stuck outside a collective does) | kill (SIGKILL itself) | segfault (SIGSEGV in native code:
                the row's reason names the Python frame it hit) | oom (ask for more memory than
                the device has: a real CUDA OOM from the allocator on GPU; on CPU, where asking would
                only swap, the request is refused against train.memory_budget_bytes or the host's RAM)
                | kill_in_save (SIGKILL itself in the middle of the save of the checkpoint of
                fault.step steps, after writing its files and before the save is marked complete)
                | slow (a straggler: from fault.step on, fault.slow_s seconds of extra work on the host in
                every step, which every collective then waits for: reporting/run_summary.py names it)

The worker builds one injector per rank (`injector`) and hands it to the loop, which calls it once per step,
on the step's first micro-batch loss. The faulting rank writes ranks/fault.json (what, when) first, so the
time from fault to detection can be measured against the run's end. The kinds are `config.schema.FAULT_KINDS`.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable

import torch

from ..config.schema import FAULT_KINDS
from ..core.rundir import RunDir, write_json
from .errors import InjectedFault, MemoryBudgetExceeded
from .elastic import restart_count

Injector = Callable[[int, torch.Tensor], torch.Tensor]


def _raise(cfg, rank, step, loss):
    raise InjectedFault(f"injected exception on rank {rank} at step {step}")


def _nan(cfg, rank, step, loss):
    return loss * float("nan")


def _hang(cfg, rank, step, loss):
    while True:  # the other ranks wait in the next collective until dist.timeout_s
        time.sleep(1)


def _kill(cfg, rank, step, loss):
    os.kill(os.getpid(), signal.SIGKILL)


def _segfault(cfg, rank, step, loss):
    """A crash in native code, as a C extension's bug makes one: SIGSEGV from reading address 0. The rank can
    write no outcome; its faulthandler dump (core/fatal_dump.py) names the frame in the row's reason."""
    import ctypes

    ctypes.string_at(0)


def _slow(cfg, rank, step, loss):
    """Work, not sleep: a slow rank computes longer (a throttled GPU, a busy host). Sleeping would read as
    waiting in the thread clocks that split the step (runtime/measure/time_profile.py)."""
    end = time.perf_counter() + cfg.fault.slow_s
    while time.perf_counter() < end:
        pass
    return loss


def _oom(cfg, rank, step, loss):
    """Request twice what the device can give, through the same path a real OOM takes."""
    if loss.device.type == "cuda":
        total = torch.cuda.get_device_properties(loss.device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=loss.device)  # raises torch.OutOfMemoryError
    import psutil

    limit = cfg.train.memory_budget_bytes or psutil.virtual_memory().total
    raise MemoryBudgetExceeded(f"out of memory (injected): rank {rank} asked for {2 * limit:,} B at step {step}, "
                               f"over the {limit:,} B the device can give")


ACTIONS = {"raise": _raise, "nan": _nan, "hang": _hang, "kill": _kill, "segfault": _segfault, "oom": _oom,
           "slow": _slow}
EVERY_STEP = {"slow"}  # kinds that act in every step from fault.step on, not once
# kinds that act inside a checkpoint save (runtime/train_state.py), after the framework wrote this rank's files
# and before the marker: SIGKILL there leaves a save that never completes
SAVE_ACTIONS = {"kill_in_save": _kill}
assert set(ACTIONS) | set(SAVE_ACTIONS) == set(FAULT_KINDS) - {"none"}, "every fault kind needs an action here"


def no_fault(step: int, loss: torch.Tensor) -> torch.Tensor:
    return loss


def injector(cfg, rank: int, run_dir: RunDir | None) -> Injector:
    """`fn(step, loss) -> loss`: the identity, except on the configured rank and step."""
    f = cfg.fault
    if f.kind not in ACTIONS or rank != f.rank or restart_count():  # once: a restarted group goes on
        return no_fault
    action = ACTIONS[f.kind]

    def inject(step: int, loss: torch.Tensor) -> torch.Tensor:
        if step != f.step:
            return action(cfg, rank, step, loss) if f.kind in EVERY_STEP and step > f.step else loss
        if run_dir is not None:
            write_json(run_dir.fault, {"kind": f.kind, "rank": rank, "step": step, "time": time.time()})
        return action(cfg, rank, step, loss)

    return inject


def in_save(cfg, rank: int, run_dir: RunDir | None) -> Callable[[int], None]:
    """`fn(step)`, called inside the save of the checkpoint after `step` steps: nothing, except on the configured
    rank, for the save of the checkpoint holding fault.step steps."""
    f = cfg.fault
    if f.kind not in SAVE_ACTIONS or rank != f.rank:
        return lambda step: None

    def inject(step: int) -> None:
        if step == f.step:
            if run_dir is not None:
                write_json(run_dir.fault, {"kind": f.kind, "rank": rank, "step": step, "time": time.time()})
            SAVE_ACTIONS[f.kind](cfg, rank, step, None)

    return inject

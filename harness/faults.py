"""Fault injection, so that every failure path can be tested on CPU with real ranks (`fault.kind=...`).

    python -m harness.train fault.kind=kill fault.rank=1 fault.step=3     # SIGKILL rank 1 at step 3
    fault.kind: none | raise (an exception) | nan (a non-finite loss) | hang (stop in place, as a rank
                stuck outside a collective does) | kill (SIGKILL itself) | oom (ask for more memory than
                the device has: a real CUDA OOM from the allocator on GPU; on CPU, where asking would
                only swap, the request is refused against train.memory_budget_bytes or the host's RAM)

The faulting rank writes ranks/fault.json (what, when) first, so the time from fault to detection can be
measured against the run's end. The train loop calls `inject` once per step; it does nothing by default.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import torch

class InjectedFault(RuntimeError):
    pass


def inject(cfg, step: int, rank: int, loss: torch.Tensor, run_dir: Path | None) -> torch.Tensor:
    """Return the loss, possibly poisoned; or raise, hang or die, on the configured rank and step."""
    f = cfg.fault
    if f.kind == "none" or step != f.step or rank != f.rank:
        return loss
    if run_dir is not None:
        from . import results

        results.write_json(Path(run_dir) / "ranks" / "fault.json",
                           {"kind": f.kind, "rank": rank, "step": step, "time": time.time()})
    if f.kind == "raise":
        raise InjectedFault(f"injected exception on rank {rank} at step {step}")
    if f.kind == "nan":
        return loss * float("nan")
    if f.kind == "hang":
        while True:  # the other ranks wait in the next collective until dist.timeout_s
            time.sleep(1)
    if f.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if f.kind == "oom":
        allocate_too_much(cfg, loss.device, step, rank)
    return loss


def allocate_too_much(cfg, device: torch.device, step: int, rank: int) -> None:
    """Request twice what the device can give, through the same path a real OOM takes."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=device)  # raises torch.OutOfMemoryError
    import psutil

    from .loop import MemoryBudgetExceeded

    limit = cfg.train.memory_budget_bytes or psutil.virtual_memory().total
    raise MemoryBudgetExceeded(f"out of memory (injected): rank {rank} asked for {2 * limit:,} B at step {step}, "
                               f"over the {limit:,} B the device can give")

"""A rank process's life around its training (runtime/worker.py, runtime/cells_worker.py): how a failure is
classified and what the rank had reached, the garbage collector's view after the imports and between cells,
writes that must not hide the failure, the watch on the parent, and the exit without teardown."""
from __future__ import annotations

import gc
import os
import sys
import threading
import time
from pathlib import Path
import torch
from ..core.records import Status
from .measure import probes
from .errors import Preempted


# Phrases of the errors torch, gloo and NCCL raise on a rank whose peer went away: this rank is a symptom.
PEER_GONE = ("closed by peer", "reset by peer", "remote worker", "broken pipe")


def classify(exc: BaseException) -> tuple[str, bool]:
    """The status a failure becomes (oom, timeout or failed), and whether it is a peer's symptom."""
    text = f"{type(exc).__name__}: {exc}".lower()
    peer = bool(getattr(exc, "peer", False)) or any(p in text for p in PEER_GONE)
    if isinstance(exc, Preempted):
        return Status.PREEMPTED, False
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text:
        return Status.OOM, peer
    if "timed out" in text or "timeout" in type(exc).__name__.lower():
        return Status.TIMEOUT, peer
    return Status.FAILED, peer


def reached(exc: BaseException, device: torch.device) -> dict:
    """What this rank had reached when it failed: its memory high-water marks (and, for an emulated OOM,
    the model-state bytes that broke the budget), so an `oom` row says how far over it was."""
    try:
        return {"memory/host_peak_bytes": probes.host_peak_bytes(), **probes.device_memory(device),
                **getattr(exc, "figures", {})}
    except Exception:  # noqa: BLE001 - a broken device must not hide the failure itself
        return {}


def freeze_imports() -> None:
    """Move what the imports made (torch, transformers, DeepSpeed: about a million objects) out of the
    garbage collector's sight: a full collection then walks only what training made. Measured, it took
    0.18 s; after this, under 0.01 s, whether it falls inside a timed step or between the cells of a launch.
    Called again after each cell of a launch: what the cells imported lazily (DeepSpeed's engine,
    the memory profiler, dynamo) had put the 0.18 s back into every later cell's collection (the memory
    check's 53 cells: 0.18 s a cell and rank, 0.06 s once refrozen, sampled with py-spy)."""
    gc.collect()
    gc.freeze()


def end_cell() -> None:
    """Between two cells of one launch (runtime/cells_worker.py, studies/memory/worker.py): the next cell
    compiles as a run of its own would, and collects only its own garbage. Without the reset, a later cell with
    the same blocks reused the earlier cell's compiled code (its time/compile_s read 0.02 s, where its own
    re-trace takes 0.22 s), and a launch of many compiled cells would reach dynamo's recompile limit."""
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()
    freeze_imports()


def best_effort(write, path: Path, content) -> None:
    """Write a failure record if the disk lets us; on a full disk the parent reports the run from what it sees."""
    try:
        write(path, content)
    except OSError as err:
        print(f"shardbench: could not write {path}: {err}", file=sys.stderr)


def watch_parent(on_lost, interval_s: float = 0.5) -> None:
    """End this rank when its parent (torchrun's agent) is gone: the rank is then reparented, so getppid()
    changes. Polling rather than PR_SET_PDEATHSIG: the kernel sends that signal when the *thread* that forked
    the child exits, and a rank cannot know which of the agent's threads started it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        on_lost(parent)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def exit_without_teardown(code: int) -> None:
    """End a rank once every result is on disk (atomic writes) and W&B is finished, skipping interpreter
    teardown: DeepSpeed's native threads (CPU Adam, shm comm) can abort there ("terminate called without an
    active exception"), which would turn a finished run into a failed one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

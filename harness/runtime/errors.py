"""Exceptions a rank raises on purpose. The worker turns each into a RankOutcome (core/records.py)."""
from __future__ import annotations

from typing import Dict, Optional

import torch


class NonFiniteLoss(RuntimeError):
    """A NaN/inf global loss under train.on_nonfinite=stop. Every rank sees the all-reduced NaN; `peer` is
    True on a rank whose own loss was finite (the cause is another rank's)."""

    def __init__(self, step: int, peer: bool):
        super().__init__(f"non-finite loss at step {step}" + (" (from another rank's loss)" if peer else ""))
        self.peer = peer


class MemoryBudgetExceeded(torch.OutOfMemoryError):
    """A rank's device model states exceed train.memory_budget_bytes (a smaller card, emulated), or an injected
    OOM on CPU; recorded as `oom`. `figures` holds what the rank had reached (copied into its outcome)."""

    def __init__(self, message: str, figures: Optional[Dict[str, int]] = None):
        super().__init__(message)
        self.figures = dict(figures or {})


class DiskFullWhileSaving(OSError):
    """A checkpoint's save failed with the results filesystem (nearly) full: the save is left without its
    marker, so the previous complete checkpoint is the one train.resume=auto takes."""


class InjectedFault(RuntimeError):
    """fault.kind=raise."""


class Preempted(RuntimeError):
    """The ranks got train.preempt_signal, saved a checkpoint at a step boundary and stopped
    (runtime/train_state.py): the run is not finished, and train.resume=auto goes on from `path`."""

    def __init__(self, signal_name: str, step: int, path: str):
        super().__init__(f"{signal_name} arrived, so the ranks saved the state after step {step} to "
                         f"{path} and stopped; train.resume=auto goes on from it")
        self.step = step

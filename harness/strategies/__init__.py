"""One module per strategy family; `make_strategy` picks it from `backend.family`."""
from __future__ import annotations

from .base import Strategy

FAMILIES = ("ddp", "fsdp", "deepspeed")


def make_strategy(cfg, device, world_size: int) -> Strategy:
    family = cfg.backend.family
    if family == "ddp":
        from .ddp import DDPStrategy as cls
    elif family == "fsdp":
        from .fsdp import FSDPStrategy as cls
    elif family == "deepspeed":
        from .deepspeed import DeepSpeedStrategy as cls
    else:
        raise ValueError(f"backend.family={family!r}: expected one of {FAMILIES}")
    return cls(cfg, device, world_size)

"""One module per strategy family; `make_strategy` picks it from `backend.family`.

Nothing here imports torch at package import, so that the parent can use `ds_json` (config only) cheaply.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Strategy

FAMILIES = ("ddp", "fsdp", "deepspeed")


def make_strategy(cfg, device, world_size: int) -> "Strategy":
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

"""One module per strategy family behind the small interface in base.py. Which class implements a
`backend.family` is the registry `config.schema.STRATEGIES`, which validation reads too."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ...config.schema import STRATEGIES

if TYPE_CHECKING:
    from .base import Strategy


def strategy_class(family: str) -> type:
    module, name = STRATEGIES[family]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def make_strategy(cfg, device, world_size: int, params: int) -> "Strategy":
    """The strategy of `backend.family`; `params` is the model's parameter count (sizes default buckets)."""
    return strategy_class(cfg.backend.family)(cfg, device, world_size, params)

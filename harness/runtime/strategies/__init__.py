"""The runtime side of the strategy families: the small interface in base.py, which the train loop sees, and
the factory below. Each family's implementation is its package's strategy.py (harness/backends/<family>/),
found through the registry in config/families.py."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import families

if TYPE_CHECKING:
    from .base import Strategy


def make_strategy(cfg, device, world_size: int, params: int) -> "Strategy":
    """The strategy of `backend.family`; `params` is the model's parameter count (sizes default buckets)."""
    return families.of(cfg.backend).strategy_class()(cfg, device, world_size, params)

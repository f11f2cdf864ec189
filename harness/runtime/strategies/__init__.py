"""The runtime side of the strategy families: the small interface in base.py, which the train loop sees, and
the factory below. Each family's implementation is its package's strategy.py (harness/backends/<family>/),
found through the registry in config/families.py."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...config import families

if TYPE_CHECKING:
    from .base import Strategy


def make_strategy(cfg, device, world_size: int, counts: dict) -> "Strategy":
    """The strategy of `backend.family`, given the model's parameter counts (runtime.models.param_count): it
    holds a rank's part of them, its tensor-parallel shard, which sizes the default buckets (as the theory's
    do: theory/shape.py)."""
    from ...config import axes
    from ...config.mesh import mesh_of

    family, mesh = families.of(cfg.backend), mesh_of(cfg, world_size)
    for axis in axes.active(mesh):
        counts = axis.local_counts(counts, axes.implementation(family, axis.name, cfg), mesh.degree(axis.name), mesh)
    params = counts["total"]
    return family.strategy_class()(cfg, device, world_size, params)

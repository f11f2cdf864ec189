"""One rank's parameter counts under expert parallelism: each 3-D expert weight (tag `expert`, theory/
param_counts.py) cut to the rank's E/ep experts, the rest whole (the data-parallel family shards it as before)."""
from __future__ import annotations

from ...core.identity_cache import IdentityCache
from ...theory.param_counts import aggregate

_LOCAL = IdentityCache()


def local_counts(counts: dict, ep: int) -> dict:
    """Rank 0's counts (every rank holds as many experts); counts without tensor records (a hypothetical model)
    lose the (ep - 1)/ep of their `experts` elements from the totals only."""
    if ep <= 1 or not counts.get("experts"):
        return counts
    if not counts.get("tensors"):
        gone = counts["experts"] - counts["experts"] // ep
        return {**counts, "total": counts["total"] - gone, "experts": counts["experts"] // ep}
    return {**counts, **_LOCAL.get(counts["tensors"], ep, lambda: _cut(counts["tensors"], ep))}


def _cut(tensors: list, ep: int) -> dict:
    local = [[name, [shape[0] // ep, *shape[1:]] if "expert" in tags else list(shape), trains, tags]
             for name, shape, trains, tags in tensors]
    return {**aggregate(local), "tensors": local}

"""Answers kept by the identity of the object they were computed from, for the advisor's hot loop: it predicts
hundreds of candidates from one backend config and one model's parameter records, which nothing mutates, so
what is derived from them (DDP's replicate settings, a tensor-parallel rank's shards) is derived once."""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Tuple


class IdentityCache:
    """Up to `size` answers keyed by (the object's id, `extra`). Each entry holds its object, so that an id is not
    reused by a new object while its answer is kept; the oldest entry goes first."""

    def __init__(self, size: int = 64):
        self.size = size
        self.held: Dict[Tuple[int, Hashable], Tuple[Any, Any]] = {}

    def get(self, obj: Any, extra: Hashable, compute: Callable[[], Any]) -> Any:
        key = (id(obj), extra)
        held = self.held.get(key)
        if held is None or held[0] is not obj:
            held = self.held[key] = (obj, compute())
            while len(self.held) > self.size:
                self.held.pop(next(iter(self.held)))
        return held[1]

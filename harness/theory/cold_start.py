"""The host's cold start: what the once-a-step host work costs when it runs right after a phase streamed more
bytes than the caches hold.

The host's costs per op and per Python line (op_costs.HostCosts) are calibrated on 2-rank tiny_llama runs,
whose whole step fits this host's caches: they are warm prices. On a larger model the optimizer streams every
parameter, gradient and moment it updates from memory, and the work that follows finds the caches holding
those, not the interpreter's and torch's own code and objects. `other` (the next batch, the loss all-reduce,
the phases' boundaries) runs each of its lines and ops once a step, so every one of them pays the misses.
Measured on this 2-core host (2026-11-28): streaming a 64 MiB buffer after tiny_llama's optimizer, inside its
DDP step, took `other` from about 0.6 to 0.95 ms, what small_llama's `other` measures without it.

The phases before `other` run their code once per block and per parameter: only their first pass is cold, a
bounded cost this does not price.

Priced on CPU only, where the host is the device: on CUDA the optimizer's bytes stream through the GPU's
caches, not the host's. The costs come from `make device-costs` (studies/timing/cold_start.py): the same distinct
ops and lines timed warm and right after a flush, on every core at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

PHASE = "other"  # the part whose host work runs once a step
AFTER = "optimizer"  # the phase that runs before it and streams the model states


@dataclass(frozen=True)
class ColdStart:
    """Seconds a counted op and a Python line cost the host beyond their warm price, right after a flush."""

    op: float
    line: float
    source: str = ""

    @classmethod
    def from_record(cls, record: dict) -> "ColdStart":
        return cls(op=record["op_s"], line=record["line_s"], source=record.get("source", ""))


def flushed(streamed_bytes: float, cache_bytes: int) -> bool:
    """Whether a phase that brought `streamed_bytes` in from memory (its bytes last touched further back than
    the caches reach) left nothing of what ran before it in the caches. Without a measured cache size, no."""
    return cache_bytes > 0 and streamed_bytes > cache_bytes


def cold_start_seconds(cold: ColdStart, ops: int, lines: int) -> float:
    """The extra host time of a part whose `ops` and `lines` all run cold (a collective call is one op: its
    dispatch, as cold as any other's)."""
    return ops * cold.op + lines * cold.line


def ops_in(rows: Iterable, phase: str) -> int:
    return sum(r.count for r in rows if r.phase == phase)

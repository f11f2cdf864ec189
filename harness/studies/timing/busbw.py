"""Collective sizes and bus bandwidth as nccl-tests defines it (busbw = algbw x the op's factor at n ranks): shared by
the collectives command and its ranks."""
from __future__ import annotations


OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce_scatter+all_gather")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for `op` on `n` ranks."""
    if op in ("all_reduce", "reduce_scatter+all_gather"):
        return 2 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def bandwidths(op: str, size_bytes: int, seconds: float, n: int) -> dict:
    algbw = size_bytes / seconds
    return {"algbw_gbps": algbw / 1e9, "busbw_gbps": algbw * bus_factor(op, n) / 1e9}


def sizes(max_mib: float) -> list[int]:
    """1 KiB, 4 KiB, ... up to max_mib MiB: powers of four."""
    out, size = [], 1024
    while size <= max_mib * 2**20:
        out.append(size)
        size *= 4
    return out

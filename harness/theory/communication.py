"""Theory of communication: every collective a rank issues per optimizer step, and the bytes it sends."""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

from ..config import families
from .shape import Shape


class Collective(NamedTuple):
    op: str  # all_reduce | reduce_scatter | all_gather (nccl-tests' names, as `make collectives` times them)
    size_bytes: float  # the whole buffer, as nccl-tests counts it
    count: float  # how many per optimizer step
    hidden_by: Optional[str]  # the compute it may overlap: "backward", "forward+backward", or None


def bucketed(op: str, elements: int, bucket: int, nbytes: int, repeats: int, hidden: Optional[str]) -> List[Collective]:
    """`elements` sent in buckets of `bucket` elements: the full buckets, and the remainder as one more."""
    bucket = max(min(bucket, elements), 1)  # a bucket larger than the model holds the model
    full, rest = divmod(elements, bucket)
    out = [Collective(op, bucket * nbytes, full * repeats, hidden)] if full else []
    return out + ([Collective(op, rest * nbytes, repeats, hidden)] if rest else [])


def collectives(backend, s: Shape) -> List[Collective]:
    """Every collective a step issues, per rank, in the backend's native or parity settings (`s`): its family's
    list (harness/backends/<family>/), none on one rank. Gradients exist, and are reduced, only for the T
    parameters that train (LoRA: the adapters); parameters are gathered whole, frozen or not."""
    if s.world == 1:
        return []
    return families.of(backend).collectives(backend, s)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor: the share of the buffer each rank sends with ring collectives."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def comm_per_step(backend, s: Shape) -> Dict[str, float]:
    """Data each rank sends per optimizer step, with ring collectives.

    `paper_elements` is the ZeRO paper's volume (2Ψ for DDP and ZeRO-1/2, 3Ψ for ZeRO-3/FSDP; with LoRA's T
    trainable parameters 2T, and 2Ψ + T: the gathers stay whole). `bytes` sums
    every collective of `collectives` (their real dtypes, repeated per micro-batch where the backend repeats
    them), each weighted as nccl-tests does: all-reduce moves 2(N-1)/N of its buffer per rank, reduce-scatter
    and all-gather (N-1)/N.
    """
    sent = sum(c.count * c.size_bytes * bus_factor(c.op, s.world) for c in collectives(backend, s))
    return {"paper_elements": families.of(backend).paper_comm_elements(backend, s), "bytes": sent}

"""One collective of a step, as the theory lists them (theory/communication.py, parallel/tp/comm.py and each
family's `collectives`), and a gradient reduction cut into buckets."""
from __future__ import annotations

from typing import List, NamedTuple, Optional


class Collective(NamedTuple):
    op: str  # all_reduce, reduce_scatter, all_gather, all_to_all (nccl-tests' names)
    size_bytes: float  # the whole buffer, as nccl-tests counts it
    count: float  # how many per optimizer step
    hidden_by: Optional[str]  # the compute it may overlap: "backward", "forward+backward", or None
    # the mesh group it runs over (config/mesh.Mesh.group): None = every data-parallel rank
    group: Optional[str] = None


def bucketed(op: str, elements: int, bucket: int, nbytes: int, repeats: int, hidden: Optional[str]) -> List[Collective]:
    """`elements` sent in buckets of `bucket` elements: the full buckets, and the remainder as one more."""
    bucket = max(min(bucket, elements), 1)  # a bucket larger than the model holds the model
    full, rest = divmod(elements, bucket)
    out = [Collective(op, bucket * nbytes, full * repeats, hidden)] if full else []
    return out + ([Collective(op, rest * nbytes, repeats, hidden)] if rest else [])

"""Theory of communication: every collective a rank issues per optimizer step, the group it runs over, and the
bytes it sends, split by the link they cross.

Which link: ranks are numbered node by node (torchrun's order), `ranks_per_node` to a node. A collective whose
group holds ranks of more than one node runs over the inter-node network; one inside a node over the intra-node
link (NVLink; loopback on CPU). With ring collectives, as NCCL runs all-gather and reduce-scatter, every rank
sends its whole share around the ring and the ring moves at its slowest link, so a group that crosses nodes
counts all its bytes as inter-node, and the time model prices them at the inter-node link (theory/time.py).
NCCL's tree all-reduce, which keeps part of the traffic inside the node, is not modelled.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from ..config import families
from .shape import Shape


class Collective(NamedTuple):
    op: str  # all_reduce, reduce_scatter, all_gather, all_to_all (nccl-tests' names)
    size_bytes: float  # the whole buffer, as nccl-tests counts it
    count: float  # how many per optimizer step
    hidden_by: Optional[str]  # the compute it may overlap: "backward", "forward+backward", or None
    # the group it runs over, as (ranks, stride between them) for rank 0: HSDP's shard group (d, 1) and replica
    # group (N/d, d); None = every rank
    group: Optional[Tuple[int, int]] = None


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
    return [c for c in families.of(backend).collectives(backend, s) if group_of(c, s)[0] > 1]


def group_of(c: Collective, s: Shape) -> Tuple[int, bool]:
    """(ranks in the collective's group, whether that group holds ranks of more than one node)."""
    ranks, stride = c.group or (s.world, 1)
    per_node = s.ranks_per_node or s.world
    return ranks, len({(j * stride) // per_node for j in range(ranks)}) > 1


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor: the share of the buffer each rank sends with ring collectives."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sent_bytes(c: Collective, s: Shape) -> float:
    """What one rank sends for `c` per optimizer step, with ring collectives over its group."""
    return c.count * c.size_bytes * bus_factor(c.op, group_of(c, s)[0])


def comm_per_step(backend, s: Shape) -> Dict[str, float]:
    """Data each rank sends per optimizer step, with ring collectives, and its split by link.

    `paper_elements` is the ZeRO paper's volume (2Ψ for DDP and ZeRO-1/2, 3Ψ for ZeRO-3/FSDP; with LoRA's T
    trainable parameters 2T, and 2Ψ + T: the gathers stay whole). `bytes` sums
    every collective of `collectives` (their real dtypes, repeated per micro-batch where the backend repeats
    them), each weighted as nccl-tests does over its own group: all-reduce moves 2(n-1)/n of its buffer per
    rank, reduce-scatter and all-gather (n-1)/n. `intra_node_bytes` and `inter_node_bytes` split them by the
    link their group crosses (the module's docstring).
    """
    intra = inter = 0.0
    for c in collectives(backend, s):
        if group_of(c, s)[1]:
            inter += sent_bytes(c, s)
        else:
            intra += sent_bytes(c, s)
    return {"paper_elements": families.of(backend).paper_comm_elements(backend, s), "bytes": intra + inter,
            "intra_node_bytes": intra, "inter_node_bytes": inter}


def counted_by_link(rows: List[dict], ranks_per_node: int) -> Dict[str, float]:
    """What the rank that counted `rows` (runtime/collective_count.py: op, size_bytes, group, ranks, count)
    sent, with ring collectives over each group, split into groups inside one node and groups that cross
    nodes: the measured side of `comm_per_step`."""
    out = {"intra_node": 0.0, "inter_node": 0.0}
    for r in rows:
        n = r["group"]
        if n < 2:
            continue
        nodes = {rank // ranks_per_node for rank in (r.get("ranks") or range(n))}
        out["inter_node" if len(nodes) > 1 else "intra_node"] += r["count"] * r["size_bytes"] * bus_factor(r["op"], n)
    return out

"""Theory of communication: every collective a rank issues per optimizer step, the group it runs over, and the
bytes it sends, split by the link they cross.

Which group and which link: a collective names a group of the run's mesh (config/mesh.py: `dp` by default, the
data-parallel ranks; `dp_shard`, `dp_replicate`, `post_forward`, `tp`, `world`...), and the mesh says how many
ranks it holds and whether they sit on more than one node. A group inside a node runs over the intra-node link
(NVLink; loopback on CPU), one across nodes over the network. With ring collectives, as NCCL runs all-gather and
reduce-scatter, every rank sends its whole share around the ring and the ring moves at its slowest link, so a
group that crosses nodes counts all its bytes as inter-node, and the time model prices them at the inter-node
link (theory/time.py). NCCL's tree all-reduce, which keeps part of the traffic inside the node, is not modelled.
Each parallel axis adds its own (config/axes.py; tensor parallelism's parallel/tp/comm.py run over the `tp` group,
inside a node by construction).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..config import axes, families
from .collective import Collective, bucketed  # noqa: F401 - the families import them from here
from .shape import Shape


def collectives(backend, s: Shape) -> List[Collective]:
    """Every collective a step issues, per rank, in the backend's native or parity settings (`s`): its family's
    list (harness/backends/<family>/) over the data-parallel ranks, and each active axis's (parallel/<axis>/comm.py),
    none over a group of one rank. Gradients exist, and are reduced, only for the T parameters that train (LoRA:
    the adapters); parameters are gathered whole, frozen or not."""
    data_parallel = families.of(backend).collectives(backend, s) if s.dp > 1 else []
    if s.mesh.cp > 1:  # the family's groups take in the context-parallel ranks (config/mesh.Mesh.with_cp)
        data_parallel = [c._replace(group=s.mesh.with_cp(c.group)) for c in data_parallel]
    axis_collectives = [c for axis in axes.active(s.mesh) for c in axis.collectives(backend, s)]
    return [c for c in data_parallel + axis_collectives if group_of(c, s)[0] > 1]


def group_of(c: Collective, s: Shape) -> Tuple[int, bool]:
    """(ranks in the collective's group, whether that group holds ranks of more than one node)."""
    return s.mesh.size_and_span(c.group)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor: the share of the buffer each rank sends with ring collectives; a `permute` (a ring's
    step: each rank sends its whole buffer to one peer, parallel/cp/comm.py) sends all of it."""
    if op == "permute":
        return 1.0 if n > 1 else 0.0
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


def counted_by_link(rows: List[dict], mesh) -> Dict[str, float]:
    """What the rank that counted `rows` (runtime/measure/collective_count.py: op, size_bytes, group, ranks, count)
    sent, with ring collectives over each group, split into groups inside one node and groups that cross
    nodes (the run's mesh, config/mesh.py, says which): the measured side of `comm_per_step`."""
    out = {"intra_node": 0.0, "inter_node": 0.0}
    for r in rows:
        n = r["group"]
        if n < 2:
            continue
        out[mesh.link_of(r.get("ranks") or range(n))] += r["count"] * r["size_bytes"] * bus_factor(r["op"], n)
    return out

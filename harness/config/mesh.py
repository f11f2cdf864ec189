"""The mesh: the one owner of how a run's ranks are split, grouped and placed on nodes (no torch here).

Every rank has coordinates on three dimensions, torchtitan's order, tensor parallelism innermost:

    dp_replicate x dp_shard x tp        (world = dp_replicate * dp_shard * tp, dp = dp_replicate * dp_shard)

Ranks are numbered node by node (torchrun's order), so the `tp` ranks of one data-parallel rank are consecutive
and sit inside one node (`parallelism.tp` must divide the ranks of a node). A family may shard over part of the
data-parallel ranks (HSDP's shard group: `dp_shard` < dp, replicated `dp_replicate` times) and keep a block over
a smaller group between its forward and backward (FSDP2's reshard_after_forward=<int>, ZeRO++'s hpZ group:
`post_forward`). The family says what it asks (`Family.mesh_request`); the mesh resolves "0 = the data-parallel
ranks of one node" and owns every group that follows, as (ranks, stride) from rank 0, and which link it crosses.

Everything that needs a world size, a data-parallel degree, a group or a link class reads it here: the
strategies (through runtime/device_mesh.py, which builds torch's DeviceMesh from this record), the theory (its
Collectives name a group of this mesh), the studies and the reports.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

INTRA, INTER = "intra_node", "inter_node"


class DPRequest(NamedTuple):
    """What a backend asks of the data-parallel ranks (Family.mesh_request): the ranks a parameter is sharded
    over (None = every data-parallel rank, 0 = the data-parallel ranks of one node, n = n) and the smaller group
    a block stays sharded over from forward to backward (None = none, 0 = a node's, n = n)."""
    shard: Optional[int] = None
    post_forward: Optional[int] = None


@dataclass(frozen=True)
class Mesh:
    per_node: int  # ranks on a node
    nodes: int = 1
    tp: int = 1  # tensor-parallel degree, inside a node
    shard: int = 0  # data-parallel ranks a parameter is sharded over: 0 = all of them
    post_forward: int = 0  # data-parallel ranks a block stays sharded over after forward: 0 = as `shard`
    sequence_parallel: bool = False  # tp > 1: activations between blocks sharded on the sequence
    loss_parallel: bool = False  # tp > 1: the logits stay sharded on the vocabulary into the loss

    # --- degrees ---
    @property
    def world(self) -> int:
        return self.per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own micro-batches; the `tp` ranks of one see the same ones."""
        return self.world // self.tp

    @property
    def dp_shard(self) -> int:
        return self.shard or self.dp

    @property
    def dp_replicate(self) -> int:
        return self.dp // self.dp_shard

    @property
    def dp_per_node(self) -> int:
        return max(self.per_node // self.tp, 1)

    @property
    def post_forward_group(self) -> int:
        """The post-forward group's ranks, or 0 where blocks go back to their ordinary shard."""
        return self.post_forward if 0 < self.post_forward < self.dp_shard else 0

    def degrees(self) -> Dict[str, int]:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}

    # --- groups: (ranks in it, stride between consecutive ones), rank 0's ---
    # group() and link() are cached a mesh (a frozen value): the theory asks them for every collective of every
    # block of every candidate the advisor weighs (138,000 calls for one llama_70b plan: 2.4 s -> 1.6 s)
    @functools.lru_cache(maxsize=4096)
    def group(self, name: Optional[str]) -> Tuple[int, int]:
        """`world`, `dp` (None: every data-parallel rank), `dp_shard`, `dp_replicate`, `tp`, `post_forward`,
        `dp_node` (the data-parallel ranks of one node) or `dp_nodes` (one data-parallel rank a node)."""
        tp = self.tp
        groups = {"world": (self.world, 1), "dp": (self.dp, tp), None: (self.dp, tp),
                  "dp_shard": (self.dp_shard, tp), "dp_replicate": (self.dp_replicate, self.dp_shard * tp),
                  "tp": (tp, 1), "post_forward": (self.post_forward_group or self.dp_shard, tp),
                  "dp_node": (min(self.dp_per_node, self.dp), tp), "dp_nodes": (self.nodes, self.per_node)}
        if name not in groups:
            raise KeyError(f"no group {name!r} in the mesh; known: {', '.join(str(g) for g in groups if g)}")
        return groups[name]

    def size(self, name: Optional[str]) -> int:
        return self.group(name)[0]

    def ranks(self, name: Optional[str], rank: int = 0) -> List[int]:
        """The ranks of `rank`'s group `name`."""
        size, stride = self.group(name)
        span = size * stride
        base = (rank // span) * span + rank % stride  # the group's first rank
        return [base + j * stride for j in range(size)]

    def groups(self, name: Optional[str]) -> List[List[int]]:
        """Every group of kind `name`, each a list of ranks (every rank in exactly one): what torch's new_group
        must be called with, on every rank, in this order."""
        seen, out = set(), []
        for rank in range(self.world):
            ranks = self.ranks(name, rank)
            if ranks[0] not in seen:
                seen.add(ranks[0])
                out.append(ranks)
        return out

    # --- links ---
    def node_of(self, rank: int) -> int:
        return rank // self.per_node

    def crosses_nodes(self, ranks: Sequence[int]) -> bool:
        return len({self.node_of(r) for r in ranks}) > 1

    @functools.lru_cache(maxsize=4096)
    def link(self, name: Optional[str]) -> str:
        """Which link group `name` crosses: `intra_node` (NVLink; loopback on CPU) or `inter_node` (the
        network). A ring over ranks of several nodes moves at its slowest link, so such a group is inter-node."""
        return INTER if self.crosses_nodes(self.ranks(name)) else INTRA

    def link_of(self, ranks: Sequence[int]) -> str:
        """The link a counted collective's group (its ranks) crosses."""
        return INTER if self.crosses_nodes(ranks) else INTRA

    def name_of(self, ranks: Sequence[int]) -> Optional[str]:
        """Which of this mesh's groups `ranks` are (a counted collective's), the tensor-parallel group first;
        None when no group matches."""
        ranks = sorted(ranks)
        for name in ("tp", "dp", "dp_shard", "dp_replicate", "post_forward", "world"):
            if self.size(name) == len(ranks) and self.ranks(name, ranks[0]) == ranks:
                return name
        return None

    # --- coordinates ---
    def coordinates(self, rank: int) -> Dict[str, int]:
        """Where `rank` sits: its node and local rank, its data-parallel rank (which batches it reads) and its
        place on each dimension."""
        dp_rank, tp_rank = divmod(rank, self.tp)
        return {"node": self.node_of(rank), "local": rank % self.per_node, "dp": dp_rank, "tp": tp_rank,
                "dp_replicate": dp_rank // self.dp_shard, "dp_shard": dp_rank % self.dp_shard}

    def describe(self) -> str:
        """`dp 4` / `dp 2 x tp 2` / `dp 2 (replicate 2 x shard 1) x tp 4`, with SP and loss parallel named."""
        dp = (f"dp {self.dp}" if self.dp_replicate == 1 else
              f"dp {self.dp} (replicate {self.dp_replicate} x shard {self.dp_shard})")
        if self.tp == 1:
            return dp
        extras = [x for x, on in (("SP", self.sequence_parallel), ("loss parallel", self.loss_parallel)) if on]
        return f"{dp} x tp {self.tp}" + (f" ({', '.join(extras)})" if extras else "")


def world_of(par) -> int:
    """Ranks over every node, from a `parallelism` config node."""
    return par.nproc_per_node * par.nnodes


def mesh_of(cfg, world: Optional[int] = None) -> Mesh:
    """The run's mesh: its nodes and ranks (or `world` ranks as nodes of the config's ranks per node, one node
    where they do not divide), `parallelism.tp`, and what its backend's family asks of the data-parallel ranks
    (HSDP's shard group, a post-forward group)."""
    from . import families

    par = cfg.parallelism
    world = world or world_of(par)
    per_node = par.nproc_per_node if world % par.nproc_per_node == 0 else world
    tp = par.tp if par.tp > 0 and per_node % par.tp == 0 and world % par.tp == 0 else 1
    request = families.of(cfg.backend).mesh_request(cfg.backend) or DPRequest()
    dp, dp_per_node = world // tp, max(per_node // tp, 1)
    resolve = lambda asked: min(asked or dp_per_node, dp)  # noqa: E731 - 0 = the data-parallel ranks of a node
    shard = resolve(request.shard) if request.shard is not None else 0
    post = resolve(request.post_forward) if request.post_forward is not None else 0
    tensor = families.of(cfg.backend).tensor_parallel_layout(cfg) if tp > 1 else (False, False)
    return Mesh(per_node=per_node, nodes=world // per_node, tp=tp, shard=0 if shard == dp else shard,
                post_forward=post, sequence_parallel=tensor[0], loss_parallel=tensor[1])


def per_node_overrides(world: int, per_node: int) -> List[str]:
    """A world of `world` ranks as nodes of up to `per_node` (a GPU node's, from a parallelism preset)."""
    per_node = min(world, per_node)
    return [f"parallelism.nproc_per_node={per_node}", f"parallelism.nnodes={world // per_node}"]

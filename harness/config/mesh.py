"""The mesh: the one owner of how a run's ranks are split, grouped and placed on nodes (no torch here).

A mesh is an ordered table of degrees, torchtitan's ParallelDims order, outermost first:

    pp x dp_replicate x dp_shard x cp x tp      (world = their product; dp = dp_replicate * dp_shard)

pp (pipeline stages) is held at 1 until its axis lands. ep (expert parallelism, parallel/ep/) is not a dimension of
the table: it borrows its ranks from the ones a parameter is sharded over, as torchtitan's does
(`dp_shard x cp x tp = efsdp x ep`, its expert tensor-parallel degree 1): the `ep` consecutive ranks of that
block split the experts, and the `efsdp` ranks `ep` apart hold the same experts, which FSDP2 shards over them.
cp (context parallelism, parallel/cp/) borrows its ranks
from the data-parallel ones: the `cp` ranks of one data-parallel rank read the same micro-batches, each a slice
of every sequence, so FSDP shards over `dp_shard x cp` (the `dp_shard_cp` group) and the loss is a mean over
`dp x cp` (`dp_cp`). Ranks are numbered node
by node (torchrun's order) and laid out row-major over the table, so the `tp` ranks of one data-parallel rank
are consecutive and sit inside one node (`tp` must divide the ranks of a node: refused here, in one line). Every
group, coordinate and link class is read off the table: a group is a run of consecutive dimensions, its size
their product, its stride the product of the dimensions inside it. A family may shard over part of the
data-parallel ranks (HSDP: `dp_shard` < dp, replicated `dp_replicate` times) and keep a block over a smaller
group between its forward and backward (FSDP2's reshard_after_forward=<int>, ZeRO++'s hpZ group:
`post_forward`). The family says what it asks (`Family.mesh_request`); `mesh_of` resolves "0 = the
data-parallel ranks of one node" into the table. `Mesh.replace(tp=8)` answers "what if": the other degrees
stay, and `dp_shard` takes up what they leave of the world.

Everything that needs a world size, a data-parallel degree, a group or a link class reads it here: the
strategies (through runtime/device_mesh.py, which builds torch's DeviceMesh from this record), the theory (its
Shape carries the mesh, its Collectives name a group of it), the studies and the reports (a run's summary keeps
`as_record()`, and `from_record` reads it back).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..core.errors import ConfigError

INTRA, INTER = "intra_node", "inter_node"
DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first: torchtitan's ParallelDims order


class TensorOutsideNode(ConfigError):
    """tp does not divide the ranks of a node: the one refusal the rules word with the node's divisors."""


class ExpertsOutsideShard(ConfigError):
    """ep does not divide the ranks a parameter is sharded over, whose ranks it borrows."""


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
    pp: int = 1  # pipeline stages (1 until pipeline parallelism is an axis)
    dp_replicate: int = 1  # replicas of the sharded data-parallel group (HSDP's inter-node dimension)
    dp_shard: int = 0  # data-parallel ranks a parameter is sharded over; 0: what the other degrees leave
    cp: int = 1  # context-parallel degree: ranks that split each sequence of one data-parallel rank
    tp: int = 1  # tensor-parallel degree, inside a node
    ep: int = 1  # expert-parallel degree, borrowed from dp_shard x cp x tp (not in the table: `efsdp` below)
    post_forward: int = 0  # data-parallel ranks a block stays sharded over after forward: 0 = as `dp_shard`
    sequence_parallel: bool = False  # tp > 1: activations between blocks sharded on the sequence
    loss_parallel: bool = False  # tp > 1: the logits stay sharded on the vocabulary into the loss
    embedding_replicated: bool = False  # tp > 1: the token embedding whole on every tensor-parallel rank
    cp_method: str = ""  # cp > 1: how the sequence is split, "ring" (torch's) or "Ulysses" (DeepSpeed's)

    def __post_init__(self):
        world = self.per_node * self.nodes
        if self.tp >= 1 and self.per_node % self.tp:
            raise TensorOutsideNode(f"tp={self.tp}: must divide the {self.per_node} ranks of a node (tensor "
                                    "parallelism stays inside a node)")
        if min(self.per_node, self.nodes, self.pp, self.dp_replicate, self.cp, self.tp) < 1 or self.dp_shard < 0:
            raise ConfigError(f"mesh: every degree must be at least 1 ({self.describe_table()})")
        others = self.pp * self.dp_replicate * self.cp * self.tp
        if not self.dp_shard:
            if world % others:
                raise ConfigError(f"mesh: pp x dp_replicate x cp x tp = {others} does not divide the {world} ranks")
            object.__setattr__(self, "dp_shard", world // others)
        if others * self.dp_shard != world:
            raise ConfigError(f"mesh: {self.describe_table()} is {others * self.dp_shard} ranks, not {world}")
        borrowed = self.dp_shard * self.cp * self.tp
        if self.ep < 1 or borrowed % self.ep:
            divisors = ", ".join(str(d) for d in range(1, borrowed + 1) if borrowed % d == 0)
            raise ExpertsOutsideShard(f"ep={self.ep}: must divide the {borrowed} ranks a parameter is sharded over "
                                      f"(dp_shard x cp x tp), whose ranks expert parallelism borrows; use one of "
                                      f"{divisors}")

    def __hash__(self) -> int:
        # once a mesh: group() and link() are cached by mesh, and the theory asks them millions of times in one
        # advise (a frozen dataclass hashes all its fields at every ask). Not pickled: a str's hash is per process
        held = self.__dict__.get("_hash")
        if held is None:
            held = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", held)
        return held

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_spans")}

    def size_and_span(self, name: Optional[str]) -> Tuple[int, bool]:
        """(size(name), whether link(name) crosses nodes), held by the mesh itself: the theory asks it four times
        for each of a step's collectives (a few hundred at 80 blocks), of every candidate of an advise."""
        spans = self.__dict__.get("_spans")
        if spans is None:
            spans = {}
            object.__setattr__(self, "_spans", spans)
        held = spans.get(name)
        if held is None:
            held = spans[name] = (self.size(name), self.link(name) == INTER)
        return held

    def replace(self, **changes) -> "Mesh":
        """This mesh with some degrees (or nodes, ranks per node, post_forward, the TP layout) changed: the
        degrees not named stay, and `dp_shard` takes up what they leave of the world unless it is named."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"mesh: no dimension {', '.join(sorted(unknown))}; known: {', '.join(DIMENSIONS)}")
        return dataclasses.replace(self, **{"dp_shard": 0, **changes})

    # --- degrees ---
    @property
    def world(self) -> int:
        """Every rank, over every node."""
        return self.per_node * self.nodes

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each sees its own micro-batches; the `cp x tp` ranks of one see the same ones."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_per_node(self) -> int:
        return max(self.per_node // (self.cp * self.tp), 1)

    @property
    def post_forward_group(self) -> int:
        """The post-forward group's ranks, or 0 where blocks go back to their ordinary shard."""
        return self.post_forward if 0 < self.post_forward < self.dp_shard else 0

    @property
    def efsdp(self) -> int:
        """The ranks that hold the same experts (what FSDP2 shards each expert over): dp_shard x cp x tp / ep."""
        return self.dp_shard * self.cp * self.tp // self.ep

    def degrees(self) -> Dict[str, int]:
        """The table, outermost dimension first."""
        return {d: getattr(self, d) for d in DIMENSIONS}

    def degree(self, name: str) -> int:
        """A dimension's or a borrowed axis's degree (`ep`)."""
        return getattr(self, name)

    def stride(self, dim: str) -> int:
        """Ranks between neighbours on `dim`: the product of the dimensions inside it."""
        inner = 1
        for d in DIMENSIONS[DIMENSIONS.index(dim) + 1:]:
            inner *= getattr(self, d)
        return inner

    def span(self, first: str, last: str) -> Tuple[int, int]:
        """The group of the consecutive dimensions `first`..`last`: (its ranks, the stride between them)."""
        dims = DIMENSIONS[DIMENSIONS.index(first):DIMENSIONS.index(last) + 1]
        size = 1
        for d in dims:
            size *= getattr(self, d)
        return size, self.stride(last)

    # --- groups: (ranks in it, stride between consecutive ones), rank 0's ---
    # group() and link() are cached a mesh (a frozen value): the theory asks them for every collective of every
    # block of every candidate the advisor weighs (138,000 calls for one llama_70b plan: 2.4 s -> 1.6 s)
    @functools.lru_cache(maxsize=4096)
    def group(self, name: Optional[str]) -> Tuple[int, int]:
        """`world`, a dimension of the table, `dp` (None: every data-parallel rank), `dp_shard_cp` (what FSDP
        shards over: the data-parallel shard group and the context-parallel ranks of each), `dp_cp` (the ranks whose
        losses differ: a mean is taken over them), `post_forward`, `dp_node` (the data-parallel ranks of one node) or
        `dp_nodes` (one data-parallel rank a node); `ep` (the consecutive ranks that split the experts) or `efsdp`
        (the ranks, `ep` apart, that hold the same experts)."""
        groups = {"world": (self.world, 1), "dp": self.span("dp_replicate", "dp_shard"),
                  "dp_shard_cp": self.span("dp_shard", "cp"), "dp_cp": self.span("dp_replicate", "cp"),
                  "dp_nodes": (self.nodes, self.per_node),
                  "post_forward": (self.post_forward_group or self.dp_shard, self.stride("dp_shard")),
                  "dp_node": (min(self.dp_per_node, self.dp), self.stride("dp_shard")),
                  "ep": (self.ep, 1), "efsdp": (self.efsdp, self.ep),
                  **{d: self.span(d, d) for d in DIMENSIONS}}
        groups[None] = groups["dp"]
        if name not in groups:
            raise KeyError(f"no group {name!r} in the mesh; known: {', '.join(str(g) for g in groups if g)}")
        return groups[name]

    def with_cp(self, name: Optional[str]) -> Optional[str]:
        """A data-parallel group of a family's theory as it runs on this mesh: with context parallelism its ranks
        join the data-parallel ones (the same parameters, each the gradient of its own tokens), so every
        data-parallel rank becomes `dp_cp` and the shard group `dp_shard_cp`; unchanged at cp 1."""
        if self.cp == 1:
            return name
        return {None: "dp_cp", "dp": "dp_cp", "dp_shard": "dp_shard_cp"}.get(name, name)

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

    def ranks_per_node(self, ranks: Sequence[int]) -> int:
        """A group's ranks on each node it spans (the fewest on any): the NICs its ring drives side by side
        (theory/time.RING_OPS)."""
        on = collections.Counter(self.node_of(r) for r in ranks)
        return min(on.values()) if on else 1

    @functools.lru_cache(maxsize=4096)
    def per_node_of(self, name: Optional[str]) -> int:
        """ranks_per_node of the named axis group holding rank 0 (the groups of an axis are alike)."""
        return self.ranks_per_node(self.ranks(name))

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
        for name in ("tp", "cp", "ep", "dp", "dp_shard", "dp_replicate", "dp_shard_cp", "dp_cp", "efsdp",
                     "post_forward", "pp", "world"):
            if self.size(name) == len(ranks) and self.ranks(name, ranks[0]) == ranks:
                return name
        return None

    # --- coordinates ---
    def coordinates(self, rank: int) -> Dict[str, int]:
        """Where `rank` sits: its node and local rank, its data-parallel rank (which batches it reads) and its
        place on each dimension of the table."""
        at = {d: (rank // self.stride(d)) % getattr(self, d) for d in DIMENSIONS}
        return {"node": self.node_of(rank), "local": rank % self.per_node,
                "dp": at["dp_replicate"] * self.dp_shard + at["dp_shard"], **at}

    # --- as words and as data ---
    def describe_table(self) -> str:
        return " x ".join(f"{d} {getattr(self, d)}" for d in DIMENSIONS)

    def describe(self) -> str:
        """`dp 4` / `dp 2 x tp 2` / `dp 2 (replicate 2 x shard 1) x tp 4` / `dp 1 x cp 8 (ring)`, with SP and loss
        parallel and the context-parallel method named."""
        dp = (f"dp {self.dp}" if self.dp_replicate == 1 else
              f"dp {self.dp} (replicate {self.dp_replicate} x shard {self.dp_shard})")
        outer = [f"pp {self.pp}"] if self.pp > 1 else []
        inner = [f"{d} {getattr(self, d)}" for d in ("cp", "tp") if getattr(self, d) > 1]
        if self.cp > 1 and self.cp_method:
            inner[0] += f" ({self.cp_method})"
        if self.ep > 1:  # borrowed ranks: the experts' own layout of the same ranks, not another factor
            dp += f" (experts: ep {self.ep} x efsdp {self.efsdp})"
        if self.tp == 1:
            return " x ".join([*outer, dp, *inner])
        extras = [x for x, on in (("SP", self.sequence_parallel), ("loss parallel", self.loss_parallel),
                                  ("embedding replicated", self.embedding_replicated)) if on]
        return " x ".join([*outer, dp, *inner]) + (f" ({', '.join(extras)})" if extras else "")

    def as_record(self) -> Dict[str, object]:
        """The mesh as data, for a run's summary: every field, the table resolved."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Dict[str, object]) -> "Mesh":
        return cls(**{f.name: record[f.name] for f in dataclasses.fields(cls) if f.name in record})


def world_of(par) -> int:
    """Ranks over every node, from a `parallelism` config node."""
    return par.nproc_per_node * par.nnodes


def mesh_of(cfg, world: Optional[int] = None) -> Mesh:
    """The run's mesh: its nodes and ranks (or `world` ranks as nodes of the config's ranks per node, one node
    where they do not divide), `parallelism.tp`, and what its backend's family asks of the data-parallel ranks
    (HSDP's shard group, a post-forward group). A tp that does not divide a node is refused in one line."""
    from . import axes, families

    par = cfg.parallelism
    world = world or world_of(par)
    per_node = par.nproc_per_node if world % par.nproc_per_node == 0 else world
    tp, cp, ep = max(par.tp, 1), max(par.cp, 1), max(par.get("ep", 1) or 1, 1)
    family = families.of(cfg.backend)
    request = family.mesh_request(cfg.backend) or DPRequest()
    flat = Mesh(per_node=per_node, nodes=world // per_node, cp=cp, tp=tp)
    # 0 = the data-parallel ranks of a node
    resolve = lambda asked: min(asked or flat.dp_per_node, flat.dp)  # noqa: E731
    shard = resolve(request.shard) if request.shard is not None else flat.dp
    post = resolve(request.post_forward) if request.post_forward is not None else 0
    layout = {}  # each active axis's switches as its implementation runs them (TP's SP and loss parallel, cp's method)
    for name, degree in (("tp", tp), ("cp", cp)):
        if degree > 1:
            layout.update(axes.get(name).layout(cfg, axes.implementation(family, name, cfg)))
    return flat.replace(dp_replicate=flat.dp // shard, dp_shard=shard, post_forward=post, ep=ep, **layout)


def per_node_overrides(world: int, per_node: int) -> List[str]:
    """A world of `world` ranks as nodes of up to `per_node` (a GPU node's, from a parallelism preset)."""
    per_node = min(world, per_node)
    return [f"parallelism.nproc_per_node={per_node}", f"parallelism.nnodes={world // per_node}"]

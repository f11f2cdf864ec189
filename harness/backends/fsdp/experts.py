"""FSDP2 and a mixture of experts' 3-D weights (no torch: the family's theory and the strategy read it): the
dimension fully_shard splits them on, one rank's elements of a parameter, and under expert parallelism the
experts' own units over efsdp with their collectives (parallel/ep/)."""
from __future__ import annotations

import dataclasses

from ...theory.communication import Collective
from ...theory.param_counts import numel as elements


def expert_shard_dim(experts: int, ranks: int) -> int:
    """The dimension FSDP2 shards a 3-D expert weight on over `ranks`: the experts' (0), unless the ranks
    outnumber the `experts` a rank holds, then the next (1), as torchtitan's shard_placement_fn does. On dim 0 each
    rank would hold a padded expert (torch.chunk): Mixtral's 8 over 256 ranks, 1/8 of every expert, not 1/256."""
    return 1 if ranks > experts else 0


def sharded_elements(shape, ranks: int, expert: bool) -> int:
    """One rank's elements of a parameter of `shape` fully_shard splits over `ranks`: ceil(rows / ranks) rows of
    its sharded dimension (the first; an expert weight's second when the ranks outnumber its experts)."""
    numel = elements(shape)
    if not shape:
        return numel
    dim = expert_shard_dim(shape[0], ranks) if expert and len(shape) > 1 else 0
    return -(-shape[dim] // ranks) * (numel // shape[dim]) if shape[dim] else numel


def expert_units(s) -> list:
    """Under expert parallelism each block's experts are a unit of their own (parallel/ep/dispatch.py), sharded
    over the efsdp ranks that hold the same E/ep experts, padded on the experts' dimension to a multiple of them:
    their all-gathers (forward, and backward again when resharded) and reduce-scatter, over `efsdp` (under HSDP
    each reduced shard all-reduced across the replicas), then the
    Shape with them taken out of the blocks and the padded shards, for the dense rest's collectives. [] without."""
    if s.mesh.ep == 1 or not s.block_experts:
        return []
    efsdp, taken = s.mesh.efsdp, s.blocks * s.block_experts
    padded = s.shard_experts * efsdp / taken if s.shard_experts else 1.0  # torch.chunk's padding over efsdp
    out = []
    reduces = s.blocks * (s.grad_accum if s.reduce_every_micro_batch else 1)
    if efsdp > 1:
        gathers = s.grad_accum * s.blocks * (2 if s.blocks_reshard else 1)
        out = [Collective("all_gather", s.block_experts * s.p * padded, gathers, "forward+backward", "efsdp"),
               Collective("reduce_scatter", s.block_experts * s.r * padded, reduces, "forward+backward", "efsdp")]
    if s.mesh.dp_replicate > 1:  # HSDP: each replica's reduced expert shard all-reduced across the replicas
        out.append(Collective("all_reduce", s.block_experts * s.r * padded / efsdp, reduces, "backward",
                              "dp_replicate"))
    dense = dataclasses.replace(
        s, params=s.params - taken, trainable_params=None if s.trainable_params is None else s.trainable_params - taken,
        block_params=s.block_params - s.block_experts,
        block_trainable=None if s.block_trainable is None else s.block_trainable - s.block_experts,
        shard_params=s.shard_params and s.shard_params - s.shard_experts,
        shard_trainable=s.shard_trainable and s.shard_trainable - s.shard_experts)
    return [*out, dense]

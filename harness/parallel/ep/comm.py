"""Expert parallelism's collectives: what the `ep` ranks send each other every MoE layer and micro-batch, over
the mesh's `ep` group, as transformers' AllToAllEP runs them (transformers/distributed/expert_parallel.py;
Lepikhin et al., "GShard", arXiv 2006.16668, section 2.2, for dispatch and combine; torchtitan's
expert_parallel.py for the same pair under FSDP2). DeepSpeed's AutoEP runs the same three a layer, its split
sizes in int32.

Each MoE layer, each micro-batch, for this rank's T tokens routed to k experts each:

- forward: the per-expert row counts (E int64, one small all-to-all: the split sizes, read back to the host),
  then `dispatch`, the k·T (token, expert) rows of the router's input to their experts' ranks, and `combine`,
  the experts' k·T output rows back to their tokens' ranks; both in the residual stream's dtype (the experts
  run in it: under autocast they stay fp32, theory/moe.py);
- backward: the two big ones' gradients, the same sizes in reverse;
- a block recomputed in backward (activation checkpointing) runs its forward's three again.

The buffer a rank sends (what the harness counts of an all-to-all, runtime/measure/collective_count.py) is its
own k·T rows in two of the four (the dispatch forward, the combine's gradient backward) and the R rows its
experts received in the other two (the combine forward sends their outputs back, the dispatch's gradient
returns theirs). R = k·T x the rank's received share (theory/moe.received_shares): 1 when the router is
balanced, which a prediction assumes; a run's summary prices each rank at the share its experts received in
the counted step (reporting/routed_memory.routed_comm), and the roofline's step (theory/time.predict_parts)
prices the shape's share it is given. Over the ranks of a group the shares average 1 (each row sent is received
once), so the group's bytes do not move with the routing; one rank's do, by half its share's excess. The expert
computation sits between the two all-to-alls and waits for them (no overlap: `collectives_hide`), as in
transformers' implementation.
"""
from __future__ import annotations

from typing import List

from ...theory.collective import Collective


def expert_parallel_collectives(backend, s) -> List[Collective]:
    """Every collective transformers' expert parallelism issues per optimizer step on one rank; none at ep 1."""
    if s.mesh.ep == 1 or not s.tokens or not s.num_experts:
        return []
    from ..tp.comm import dtypes

    stream, _ = dtypes(backend, s)
    rows = s.experts_per_token * s.tokens * s.hidden  # this rank's k·T routed rows of one micro-batch
    layers, again = s.blocks * s.grad_accum, s.reissued_blocks * s.grad_accum
    forwards = layers + again
    # the split sizes: transformers' are int64 (a bincount), AutoEP's int32 (deepspeed/moe/ep_router.py)
    count_bytes = 4 if s.plan("ep") == "autoep" else 8
    # each forward's dispatch and each backward's combine gradient send the rank's own rows; each forward's
    # combine and each backward's dispatch gradient send back what its experts received
    return [Collective("all_to_all", s.num_experts * count_bytes, forwards, None, "ep"),
            Collective("all_to_all", rows * stream, forwards + layers, None, "ep"),
            Collective("all_to_all", s.received_share * rows * stream, forwards + layers, None, "ep")]

"""Context parallelism's collectives: what the `cp` ranks of one data-parallel rank send each other every
micro-batch, over the mesh's `cp` group, as torch's ring runs them (torch/distributed/tensor/experimental/
_context_parallel/_attention.py; Liu et al., "Ring Attention with Blockwise Transformers", arXiv 2310.01889, for
the ring; torchtitan's context-parallel write-up for the all-gather form).

Each attention layer, each micro-batch, with K and V of this rank's S/cp tokens (2 b (S/cp) h_kv / tp elements in
the attention's dtype; h_kv = the key/value heads' width, so GQA sends less, and a tensor-parallel rank's own heads
only):

- forward: `allgather` (torch's default) all-gathers them once; `alltoall` passes them to the next rank cp - 1
  times (`permute`: each rank sends its whole buffer to one peer);
- backward: the keys and values again, the same way, and their gradients round the ring cp times, always as
  permutes, in fp32 (torch accumulates them in fp32: `_cp_options.convert_to_f32`);
- a block recomputed in backward (full activation checkpointing) runs its forward's ring again; a selectively
  checkpointed one does not (attention's output is saved, and its q, k and v are its own).

The attention between two exchanges hides them (the ring's point), which the time model prices as overlap
(`collectives_hide`); the all-gather form waits for the whole buffer once instead.

DeepSpeed-Ulysses (`ulysses`: deepspeed/runtime/sequence_parallel/ulysses_sp.py; Jacobs et al., "DeepSpeed
Ulysses", arXiv 2309.14509, section 3) moves the heads instead, each attention layer, each micro-batch:

- forward: q, k and v of this rank's S/cp tokens and every head through an all-to-all each (k and v at the
  key/value heads' width, replicated up to cp where cp exceeds the key/value heads), and attention's output
  back through a fourth; before them, every rank's position ids all-gathered (int64, b x S);
- backward: the four all-to-alls' gradients, the same sizes;
- a recomputed block runs its forward's five again, a selectively checkpointed one too (the all-to-alls' outputs,
  attention's inputs, are not among the saved ops).

Nothing hides them: attention waits for q, k and v, and the output projection for attention's output
(`ContextParallel.hides`).
"""
from __future__ import annotations

from typing import List

from ...theory.collective import Collective


def context_parallel_collectives(backend, s) -> List[Collective]:
    """Every collective the axis's implementation issues per optimizer step on one rank; none at cp 1."""
    if s.mesh.cp == 1 or not s.tokens:
        return []
    return ulysses_collectives(backend, s) if s.plan("cp") == "ulysses" else ring_collectives(backend, s, s.cp_rotate)


def ulysses_collectives(backend, s) -> List[Collective]:
    cp = s.mesh.cp
    from ..tp.comm import dtypes

    _, matmul = dtypes(backend, s)
    kv_heads = s.kv_hidden * s.heads // s.hidden if s.heads else 0
    kv = s.tokens * s.kv_hidden * max(cp // kv_heads, 1) if kv_heads else s.tokens * s.kv_hidden
    q = s.tokens * s.hidden  # this rank's S/cp tokens, every head: q, and attention's output
    layers, again = s.blocks * s.grad_accum, s.reissued_blocks * s.grad_accum
    forwards = layers + again
    return [Collective("all_to_all", q * matmul, 2 * (forwards + layers), "forward+backward", "cp"),
            Collective("all_to_all", kv * matmul, 2 * (forwards + layers), "forward+backward", "cp"),
            Collective("all_gather", s.tokens * cp * 8, forwards, "forward+backward", "cp")]


def ring_collectives(backend, s, rotate: str) -> List[Collective]:
    """Every collective the ring issues per optimizer step on one rank; none at cp 1."""
    cp = s.mesh.cp
    if cp == 1 or not s.tokens:
        return []
    from ..tp.comm import dtypes

    _, matmul = dtypes(backend, s)  # q, k and v are projections' outputs
    # this rank's keys and values of one micro-batch (s.tokens: b x S/cp), of its own heads: under the
    # tensor-parallel plan a rank attends with kv_heads/tp of them, and the ring passes only those
    kv = 2 * s.tokens * s.kv_hidden // s.mesh.tp
    # a selectively checkpointed block keeps attention's output (every selective policy saves it), and its
    # recompute gives the ring the same q, k and v, so the ring runs again only in a fully recomputed block
    # (measured: tiny Llama at dp 2 x cp 2 under selective_op, the bytes within 0.0% with this, -8.2% without)
    layers, again = s.blocks * s.grad_accum, s.recomputed_blocks * s.grad_accum

    def rotate_kv(count: float) -> List[Collective]:
        if rotate == "allgather":  # one all-gather of every rank's buffer
            return [Collective("all_gather", kv * matmul * cp, count, "forward+backward", "cp")]
        return [Collective("permute", kv * matmul, count * (cp - 1), "forward+backward", "cp")]

    return [*rotate_kv(layers + again + layers),  # forward, recomputed forward, backward
            Collective("permute", kv * 4, layers * cp, "backward", "cp")]  # dK, dV round the ring in fp32

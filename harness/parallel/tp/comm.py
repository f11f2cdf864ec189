"""Tensor parallelism's collectives: what the `tp` ranks of one data-parallel rank send each other every
micro-batch, in forward and backward, over the mesh's `tp` group (inside a node: config/mesh.py).

Megatron-LM's accounting (Korthikanti et al., arXiv 2205.05198, section 4.2.2; Shoeybi et al., arXiv 1909.08053,
figure 4): without sequence parallelism each block all-reduces its attention's and its MLP's output in forward
(the rowwise projections' partial sums) and its two inputs' gradients in backward (the colwise projections'
partial sums), four all-reduces of b·s·h elements; with it, each all-reduce is a reduce-scatter and an
all-gather of the same size, so the bytes on the wire are the same. The terms below are counted from the plans
as they run (parallel/tp/plan.py), each in the dtype it travels in:

- `torch` (parallel/tp/shard.py): per block and micro-batch, the input of attention and of the MLP
  all-gathered from its sequence shards and each output reduce-scattered (sequence parallelism), or each output
  all-reduced; backward the dual of each. Outside the blocks: the embedding's partial lookup reduced (a
  reduce-scatter into sequence shards, or an all-reduce), the output layer's input gathered (and its gradient
  reduced), the logits gathered whole unless loss parallel keeps them sharded (then its cross-entropy
  all-reduces three b·s fp32 vectors: the max, the sum of exponentials, the target's logit), and under
  sequence parallelism each norm weight's gradient summed over the ranks' sequence shards.
- `autotp` (DeepSpeed's AutoTP): no sequence parallelism; each rowwise projection all-reduces its output
  forward and each colwise one its input's gradient backward (five per block: q, k, v, gate, up, one each);
  an untied output layer gathers the logits forward and all-reduces its input's gradient backward.

Activation checkpointing recomputes each block's forward in backward, with its collectives up to the last tensor
the backward needs: torch's non-reentrant checkpoint stops early, so the MLP's output reduction is not redone
(counted on llama_70b traced at 256 ranks, tp 8: 402 reduce-scatters a step, not 482). The dtype: the
residual stream's (fp32 under autocast and in fp32 runs, else the 16-bit dtype) for what the norms produce and
what goes back into the stream, the matmuls' for what they output.
"""
from __future__ import annotations

from typing import List

from ...theory.collective import Collective


def dtypes(backend, s) -> tuple:
    """(bytes an element of the residual stream, of a matmul's output) in this backend's precision regime."""
    from ...theory.activations import regime

    reg = regime(backend, s.precision, s.master_weights)
    return (4 if reg in ("fp32", "autocast") else 2), (4 if reg == "fp32" else 2)


def tensor_parallel_collectives(backend, s) -> List[Collective]:
    """Every tensor-parallel collective a rank issues per optimizer step (module docstring); none at tp 1."""
    if s.mesh.tp == 1 or not s.tokens:
        return []
    return (autotp_plan if s.plan("tp") == "autotp" else torch_plan)(backend, s)


def torch_plan(backend, s) -> List[Collective]:
    mesh, ga = s.mesh, s.grad_accum
    stream, matmul = dtypes(backend, s)
    x = s.tokens * s.hidden  # one micro-batch's activations, b·s·h elements
    forward, backward = s.blocks * ga, s.blocks * ga
    # a checkpointed block (full or selective: neither saves a collective's output) gathers both inputs again and
    # reduces attention's output, not the MLP's (the recompute stops early)
    again = s.reissued_blocks * ga
    out: List[Collective] = []

    def add(op: str, size: float, count: float) -> None:
        if count and size:
            out.append(Collective(op, size, count, None, "tp"))

    if mesh.sequence_parallel:
        add("all_gather", x * stream, 2 * (forward + again))  # attention's and the MLP's input from sequence shards
        add("reduce_scatter", x * matmul, 2 * forward + again)  # their rowwise outputs into sequence shards
        add("reduce_scatter", x * stream, 2 * backward)  # the inputs' gradients
        add("all_gather", x * matmul, 2 * backward)  # the outputs' gradients
        if not mesh.embedding_replicated:  # a replicated embedding's lookup is whole: sliced, not reduced
            add("reduce_scatter", x * stream, ga)  # the embedding's partial lookups into sequence shards
        add("all_gather", x * stream, ga)  # and its gradient back whole
        add("all_gather", x * stream, ga)  # the output layer's input, from sequence shards
        add("reduce_scatter", x * stream, ga)  # and its gradient
        # each norm's weight gradient summed over the ranks' sequence shards (two a block and the final one)
        add("all_reduce", s.hidden * s.p, (2 * s.blocks + 1))
    else:
        add("all_reduce", x * matmul, 2 * forward + again)  # the rowwise outputs' partial sums
        add("all_reduce", x * stream, 2 * backward)  # the colwise inputs' gradients
        if not mesh.embedding_replicated:
            add("all_reduce", x * stream, ga)  # the embedding's partial lookups
        add("all_reduce", x * stream, ga)  # the output layer's input gradient
    if mesh.loss_parallel:
        add("all_reduce", 4 * s.tokens, 3 * ga)  # the parallel cross-entropy's max, sum of exp, target logit
    else:
        add("all_gather", s.tokens * s.vocab * matmul, ga)  # the logits, whole on every rank
    return out


def autotp_plan(backend, s) -> List[Collective]:
    ga = s.grad_accum
    stream, matmul = dtypes(backend, s)
    x = s.tokens * s.hidden
    forward = (2 * s.blocks + s.reissued_blocks) * ga  # o_proj's again when recomputed, not down_proj's
    out = [Collective("all_reduce", x * matmul, forward, None, "tp"),  # o_proj's and down_proj's outputs
           Collective("all_reduce", x * stream, 5 * s.blocks * ga, None, "tp")]  # q, k, v, gate, up inputs' grads
    if s.head_matmul_weights and not s.tied_output:
        out += [Collective("all_gather", s.tokens * s.vocab * matmul, ga, None, "tp"),
                Collective("all_reduce", x * stream, ga, None, "tp")]
    return out

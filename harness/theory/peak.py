"""Theory of the peak: the most live tensor bytes a rank holds in one training step.

predicted peak = model states + persistent buffers (theory/memory.layout) + the largest of the terms at the
moments of the step in PHASES, each with the activations of theory/activations.py alive then:

- `forward_end`: the end of forward, before the output layer: every block's activations;
- `backward_start`: the loss's backward, when every activation and the logits' gradients are alive;
- `block_backward`: inside a block's backward (the worst block), once the first gradients exist (gradient
  buckets are allocated at the first gradient, not before);
- `gradient_reduce`: a family's reduction, where its buffers are largest beyond the other moments;
- `step`: the optimizer step, when activations are gone and gradients are complete;
- `param_gather`: after the step, where a family gathers updated partitions into whole parameters.

Each family's terms, per phase, are in its package (harness/backends/<family>/family.py, phase_terms and the
methods beside it), derived from its mechanics: what it allocates, when, and when it frees it. The optimizer
step's temporaries are the family's too: torch's AdamW makes temporaries for its denominator, on the
single-tensor path (torch's default on CPU) two of the largest tensor at a time, on the foreach path (its
default on CUDA) one for every tensor.
"""
from __future__ import annotations

from typing import Dict, Tuple

from ..config import families
from . import activations
from .shape import Shape

PHASES = ("forward_end", "backward_start", "block_backward", "gradient_reduce", "step", "param_gather")


def produced(s: Shape, k: int) -> float:
    """Trainable elements whose gradient exists inside block k's backward: the head's, the later blocks', and
    block k's last matmul's."""
    return s.head_trainable + (s.blocks - 1 - k) * s.block_t + s.block_out_trainable


def phase_terms(backend, s: Shape, act: Dict[str, float]) -> Tuple[Dict[str, Dict[str, float]], int]:
    """{phase: {term: bytes}} on top of model states and buffers (`act`: theory/activations.parts), and which
    block's backward holds the most (0 the first block): block_backward's terms are that block's."""
    family = families.of(backend)
    out = {"forward_end": {"activations": activations.forward_end(act),
                           **family.phase_terms(backend, s, "forward_end", None)},
           "backward_start": {"activations": activations.backward_start(act),
                              **family.phase_terms(backend, s, "backward_start", None)}}
    blocks = [{"activations": activations.in_block(act, k), **family.phase_terms(backend, s, "block_backward", k)}
              for k in range(s.blocks)]
    worst = max(range(s.blocks), key=lambda k: sum(blocks[k].values()))
    out["block_backward"] = blocks[worst]
    reduce, _ = family.reduce_terms(backend, s, act)
    if reduce:  # the gradient reduction's own moment, where its buffers are largest beyond the other moments
        out["gradient_reduce"] = reduce
    out["step"] = family.step_transients(backend, s)
    gather = family.param_gather_terms(backend, s)  # after the step: gathering the updated partitions
    if gather:
        out["param_gather"] = gather
    return out, worst


def after_backward_buffers(backend, s: Shape) -> Dict[str, float]:
    """What may be live right after the last backward besides the model states and the buffers a strategy's
    classifier names: the closure check's candidates (runtime/measure/memory_profile.py), each a mechanism with its
    size, from the backend's family (buffers a collective or a framework releases late, out of Python's reach)."""
    return families.of(backend).after_backward_buffers(backend, s)


def explain_unaccounted(candidates: Dict[str, float], unaccounted: float, tolerance: float) -> list:
    """The smallest set of candidates whose sizes add up to the unaccounted bytes within `tolerance` bytes,
    or [] when none does."""
    from itertools import combinations

    names = list(candidates)
    for size in range(1, len(names) + 1):
        for combo in combinations(names, size):
            if abs(sum(candidates[n] for n in combo) - unaccounted) <= tolerance:
                return list(combo)
    return []

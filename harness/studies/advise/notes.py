"""What the advisor's theory table cannot say by itself, one sentence each, printed under it.

- Why a smaller micro-batch can peak higher at the same global batch (FSDP2 holds unsharded gradients through
  gradient accumulation, unless it reduces every micro-batch: parallelism.grad_sync=every).
- Why DeepSpeed is ruled out on a small budget: its default reduce bucket, allocated whole at
  reduce_bucket_size elements whatever the model, which alone overflows a CPU's or a small card's budget.
"""
from __future__ import annotations

from typing import List

from .search import Plan, size


def held_gradients(p: Plan) -> List[str]:
    held = max(p.candidates, key=lambda c: c.predicted_held_grads_bytes, default=None)
    if held is None or held.predicted_held_grads_bytes <= 0.1 * held.predicted_peak_bytes:
        return []
    return [f"Why a smaller micro-batch can peak higher at the same global batch: with grad_accum > 1, {held.backend} "
            f"keeps every gradient unsharded from the first micro-batch to the last and reduces on the last only "
            f"(FSDP2's set_requires_gradient_sync(False), fewer collectives for more memory): "
            f"{size(held.predicted_held_grads_bytes)} of the {size(held.predicted_peak_bytes)} peak of {held.label}."
            + (" The `-syncevery` candidates (parallelism.grad_sync=every, torchtitan's way) reduce-scatter every "
               "micro-batch instead, holding only the sharded gradients."
               if any(c.grad_sync == "every" for c in p.candidates) else "")]


def bucket_bound(p: Plan) -> List[str]:
    """The backends none of whose candidates fits, but whose smallest candidate would without the reduce bucket."""
    ruled_out = {}
    for backend in dict.fromkeys(c.backend for c in p.candidates):
        own = [c for c in p.candidates if c.backend == backend]
        if any(c.fits for c in own):
            continue
        smallest = min(own, key=lambda c: c.predicted_peak_bytes)
        rest = smallest.predicted_peak_bytes - smallest.predicted_reduce_bucket_bytes
        bucket = smallest.predicted_reduce_bucket_bytes
        if bucket * (1 + p.margin) > p.budget_bytes >= rest * (1 + p.margin):  # the bucket alone is over it
            ruled_out[backend] = (smallest.predicted_reduce_bucket_bytes, rest)
    if not ruled_out:
        return []
    bucket = max(b for b, _ in ruled_out.values())
    rest = max(r for _, r in ruled_out.values())
    where = "this CPU's" if p.device == "cpu" else "this"
    return [f"Why {', '.join(sorted(ruled_out))} cannot fit: DeepSpeed's reduce bucket, allocated whole at reduce_bucket_size "
            f"elements whatever the model ({size(bucket)} a rank under profile={p.profile}), is over {where} "
            f"{size(p.budget_bytes)} budget by itself; without it their smallest candidates would peak at "
            f"{size(rest)} or less. A fixed cost that decides only on small budgets (on an 80 GB GPU it is "
            f"{bucket / 80e9:.1%}): `profile=parity` sizes the bucket to the model, or set "
            f"`+backend.deepspeed.zero_optimization.reduce_bucket_size=<elements>`."]


def notes(p: Plan) -> List[str]:
    return held_gradients(p) + bucket_bound(p)

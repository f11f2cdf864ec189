"""What of a step's communication can hide behind its compute (theory/op_costs.py prices the rest): each
collective's hiding rule under the backend, and the compute gap before each phase's collectives."""
from __future__ import annotations

from typing import Dict, Optional

from ..config import axes
from .communication import collectives as theory_collectives
from .shape import Shape

PHASES = ("forward", "backward", "optimizer")
PARTS_COUNTED = PHASES + ("other",)  # the parts whose work is counted and priced (theory/op_costs.py)


def hiding_rule(backend, s: Shape) -> Dict[str, Optional[str]]:
    """For each collective op, the compute it may hide behind in this backend, from its theory's list (the
    largest of that op's buffers decides: the loss's 4-byte all-reduce is never hidden, DDP's buckets are). An
    axis's collectives that wait between a block's matmuls (Axis.collectives_hide) are exposed by their group
    wherever they are priced, so they do not decide the rule: tensor parallelism's whole-logits all-gather (2.1
    GB at 8,192 tokens of a 128,256 vocabulary) had outweighed FSDP2's block gathers and exposed them all."""
    rule: Dict[str, tuple] = {}
    for c in theory_collectives(backend, s):
        if c.group and not axes.collectives_hide(s.mesh, c.group, c.op):
            continue
        if c.size_bytes > rule.get(c.op, (0, None))[0]:
            rule[c.op] = (c.size_bytes, c.hidden_by)
    return {op: hidden for op, (_, hidden) in rule.items()}


def gaps_before(work: dict, parts: Dict[str, float]) -> Dict[str, float]:
    """The host work before each collective, by the phase that issues it: the phases run in order, and a
    phase's collectives share its time and that of the phases before it that issued none (the work counter
    keeps counts, not the order within a phase: a phase's collectives are taken as evenly spread)."""
    issued = {p: 0 for p in PARTS_COUNTED}
    for c in work.get("collectives", []):
        if c.get("phase") in issued:
            issued[c["phase"]] += c["count"]
    out, since = {}, 0.0
    for p in PARTS_COUNTED:
        since += parts[p]
        if issued[p]:
            out[p] = since / issued[p]
            since = 0.0
    return out

"""Why the dry run's pick beats each other kind of mesh, in one sentence a kind (studies/advise/answer.py prints
them after its recommendation). The kinds are what a user weighs against each other (search.mesh_kind): data
parallelism alone, data parallelism split by another axis (dp x tp), hybrid sharding, and offload. For each,
its fastest candidate that fits is set against the pick, and the sentence leads with what decides it:
- memory: nothing of that kind fits the budget with the margin (its smallest predicted peak);
- a tie: the two predictions' error bands overlap (frontier.tied), so theory cannot order them;
- the bytes across nodes: the extra bytes it sends over the inter-node link, at that link's bandwidth, make
  up at least half of its extra predicted step;
- else the predicted step itself (compute, recomputation, the collectives inside a node, the optimizer).
Each names its step, peak and bytes by link, so that the reader can check the reason against the numbers."""
from __future__ import annotations

from typing import List, Optional, Tuple

from .search import Candidate, Plan, size

KINDS = ("dp only", "split", "hybrid", "offload")  # the order the sentences go in


def figures(c: Candidate) -> str:
    return (f"{c.predicted_step_s * 1e3:,.0f} ms a step, peak {size(c.predicted_peak_bytes)}, "
            f"{c.predicted_inter_node_bytes / 1e9:,.1f} GB across nodes and {c.predicted_intra_node_bytes / 1e9:,.1f} "
            "GB inside a node per rank")


def reason(p: Plan, pick: Candidate, c: Candidate, band: Optional[Tuple[float, float, str]]) -> str:
    """Why `c` loses to `pick`, leading with what decides it (the module doc)."""
    from .frontier import tied

    slower = 100 * (c.predicted_step_s / pick.predicted_step_s - 1)
    if tied(pick, c, band):
        return (f"ties with the pick inside the error band ({slower:.1f}% slower predicted, {figures(c)}): theory "
                "cannot order the two; probe both (advise without --dry-run)")
    inter_gbps = p.rates.get("inter_gbps") or 0.0  # a ring over a node's NICs: the bytes' shortest time
    extra_inter = (c.predicted_inter_node_bytes - pick.predicted_inter_node_bytes) / (inter_gbps * 1e9) \
        if inter_gbps else 0.0
    extra = c.predicted_step_s - pick.predicted_step_s
    if extra > 0 and extra_inter >= extra / 2:
        return (f"{slower:.0f}% slower predicted, most of it the bytes across nodes: "
                f"{(c.predicted_inter_node_bytes - pick.predicted_inter_node_bytes) / 1e9:,.0f} GB more a step, "
                f"{extra_inter * 1e3:,.0f} ms at {inter_gbps:g} GB/s, against a step {extra * 1e3:,.0f} ms longer "
                f"({figures(c)})")
    return f"{slower:.0f}% slower predicted ({figures(c)})"


def sentences(p: Plan, band: Optional[Tuple[float, float, str]]) -> List[str]:
    """One line a kind of mesh: the pick's kind says it holds the pick; each other kind says why its best loses."""
    fitting = sorted(p.priced, key=lambda c: c.predicted_step_s)
    if not fitting:
        return []
    pick = fitting[0]
    out = [f"Why {pick.name} and not another kind of mesh (each kind's fastest that fits, against the pick):"]
    for kind in KINDS:
        mine = [c for c in p.candidates if c.kind == kind]
        if not mine:
            continue
        fits = [c for c in fitting if c.kind == kind]
        label = kind if kind != "split" else "dp split by " + ", ".join(
            sorted({name for c in mine for name, degree in c.axes.items() if degree > 1}))
        if pick.kind == kind:
            runner = next((c for c in fits if c is not pick), None)
            out.append(f"  {label}: the pick, {pick.name} ({figures(pick)})"
                       + (f"; its next, {runner.name}, {reason(p, pick, runner, band)}" if runner else ""))
        elif not fits:
            smallest = min(mine, key=lambda c: c.predicted_peak_bytes)
            out.append(f"  {label}: memory, none of its {len(mine)} candidates fits: the smallest predicted peak is "
                       f"{size(smallest.predicted_peak_bytes)} ({smallest.name}), over {size(p.budget_bytes)} less "
                       f"the {p.margin:.0%} margin")
        else:
            out.append(f"  {label}: {fits[0].name} {reason(p, pick, fits[0], band)}")
    return out + other_method(p, pick, band)


def by_other_method(p: Plan, c: Candidate) -> Optional[Candidate]:
    """`c`'s backend, mesh, batch, policy and way of accumulating, run by another implementation of an axis
    (Candidate.method: Ulysses beside torch's ring), where the search made one."""
    def setting(x):
        return x.backend, x.axes, x.micro_batch, x.grad_accum, x.grad_sync, x.policy

    return next((x for x in p.candidates if x is not c and x.method != c.method and setting(x) == setting(c)), None)


def other_method(p: Plan, pick: Candidate, band: Optional[Tuple[float, float, str]]) -> List[str]:
    """The pick's own mesh, batch and policy run by another implementation of an axis (search.Candidate.method:
    DeepSpeed's Ulysses against torch's ring under FSDP2), and why it loses: the method is half of the answer at
    long sequences, and the kinds above compare meshes, not methods."""
    twin = by_other_method(p, pick)
    if twin is None:
        return []
    if twin.fits and not twin.step_from:  # priced (Plan.priced), not only bounded by a twin
        why = reason(p, pick, twin, band)
    else:
        why = (f"does not fit: its predicted peak is {size(twin.predicted_peak_bytes)} against the pick's "
               f"{size(pick.predicted_peak_bytes)}, over {size(p.budget_bytes)} less the {p.margin:.0%} margin")
    return [f"  the pick's mesh by the other method: {twin.name} on {twin.mesh} {why}"]

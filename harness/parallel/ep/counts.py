"""One rank's parameter counts under expert parallelism: each 3-D expert weight (tag `expert`, theory/
param_counts.py) cut to the rank's E/ep experts, the rest whole (the data-parallel family shards it as before).

Under DeepSpeed's AutoEP the rank holds its experts as AutoEP's GroupedExperts does (deepspeed/moe/ep_experts.py,
gate_up_impl "separate", its default): three tensors of E/ep x i x h a block, w1, w2 and w3 in that order, where
transformers keeps two (gate_up_proj, down_proj). The elements are the same; the tensors' sizes and order are
what ZeRO flattens and partitions (backends/deepspeed/theory.gradient_span)."""
from __future__ import annotations

from ...core.identity_cache import IdentityCache
from ...theory.param_counts import aggregate

_LOCAL = IdentityCache()


def local_counts(counts: dict, ep: int, implementation: str = "transformers") -> dict:
    """Rank 0's counts (every rank holds as many experts); counts without tensor records (a hypothetical model)
    lose the (ep - 1)/ep of their `experts` elements from the totals only."""
    if ep <= 1 or not counts.get("experts"):
        return counts
    if not counts.get("tensors"):
        gone = counts["experts"] - counts["experts"] // ep
        return {**counts, "total": counts["total"] - gone, "experts": counts["experts"] // ep}
    return {**counts, **_LOCAL.get(counts["tensors"], (ep, implementation),
                                   lambda: _cut(counts["tensors"], ep, implementation == "autoep"))}


def _cut(tensors: list, ep: int, autoep: bool) -> dict:
    local, held = [], []  # held: AutoEP's w3, placed after the block's down projection (w2)
    for name, shape, trains, tags in tensors:
        if "expert" not in tags:
            local.append([name, list(shape), trains, tags])
            continue
        cut = [shape[0] // ep, *shape[1:]]
        if autoep and name.endswith("gate_up_proj"):  # gate|up (E x 2i x h) as w1 and w3 (E x i x h each)
            half = [cut[0], cut[1] // 2, *cut[2:]]
            module = name.rsplit(".", 1)[0]
            local.append([f"{module}.w1", half, trains, tags])
            held.append([f"{module}.w3", half, trains, [t for t in tags if t != "block_out"]])
        else:
            local.append([name if not autoep else f"{name.rsplit('.', 1)[0]}.w2", cut, trains, tags])
            local += held
            held = []
    return {**aggregate(local + held), "tensors": local + held}

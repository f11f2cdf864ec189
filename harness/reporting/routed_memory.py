"""Under expert parallelism, each rank's peak against its own prediction: the rows its experts received (the
largest share over the profiled step's micro-batches, against the k x T a balanced router sends them:
theory/moe.received_shares, from every rank's routed rows, runtime/routing.py) move what the rank keeps
(theory/moe.py). One rank's peak moves with the routing; the theory at the balanced share is the prediction a
plan makes, and stays beside it (`memory/tensor_peak_balanced_predicted_bytes`)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from ..config.mesh import mesh_of
from ..core.records import RankReport
from ..theory import moe
from ..theory.predict import predict
from ..theory.shape import shape_of


def routed_peaks(cfg, ranks: List[RankReport]) -> Optional[List[dict]]:
    """Each rank's received share, measured peak and predicted peak at that share; None unless the run split its
    experts (parallelism.ep > 1) and every rank's profile kept its routed rows."""
    return routed_predictions(cfg, [r.tensor_peak for r in sorted(ranks, key=lambda r: r.rank)], ranks[0].params)


def routed_predictions(cfg, profiles: List[Optional[dict]], counts: dict) -> Optional[List[dict]]:
    """routed_peaks from the ranks' memory profiles, by global rank (runtime/measure/memory_profile.StepMemory's,
    with the routed rows the loop adds), and the model's parameter counts (the memory check's)."""
    mesh = mesh_of(cfg)
    if mesh.ep == 1 or not all(p and p.get("routed_rows") for p in profiles):
        return None
    base, groups = shape_of(cfg, None, counts), mesh.groups("ep")
    out = []
    for rank, profile in enumerate(profiles):
        step = profile.get("step_index", 0)  # each rank's lowest profiled step is its own
        # a rank's share in each micro-batch, whose peak is one micro-batch's activations: the largest
        micro_batches = [moe.received_shares([p["routed_rows"][step][m] for p in profiles], groups)[rank]
                         for m in range(len(profile["routed_rows"][step]))]
        share = max(micro_batches)
        predicted = predict(cfg, None, counts, dataclasses.replace(base, received_share=share))
        out.append({"rank": rank, "share": share, "micro_batches": micro_batches, "peak": profile["peak"],
                    "predicted": predicted["memory/tensor_peak_predicted_bytes"]})
    return out


def figures(cfg, ranks: List[RankReport], predicted: Dict[str, float]) -> Dict[str, float]:
    """What replaces and joins the run's balanced `predicted` figures: the busiest rank's predicted peak at its own
    received share (so that the peak's error compares a rank with itself), the balanced one beside it, the shares'
    range and the error of the rank furthest from its prediction; nothing without routed peaks."""
    peaks = routed_peaks(cfg, ranks)
    if not peaks:
        return {}
    busiest = max(peaks, key=lambda p: p["peak"])
    worst = max(peaks, key=lambda p: abs(p["peak"] / p["predicted"] - 1))
    moved = busiest["predicted"] - predicted["memory/tensor_peak_predicted_bytes"]
    return {"moe/received_share_max": max(p["share"] for p in peaks),
            "moe/received_share_min": min(p["share"] for p in peaks),
            "memory/tensor_peak_balanced_predicted_bytes": predicted["memory/tensor_peak_predicted_bytes"],
            "memory/tensor_peak_predicted_bytes": busiest["predicted"],
            "memory/device_peak_predicted_bytes": predicted["memory/device_peak_predicted_bytes"] + moved,
            "memory/tensor_peak_worst_rank_error_pct": 100 * (worst["peak"] / worst["predicted"] - 1)}

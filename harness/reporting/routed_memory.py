"""Under expert parallelism, each rank against its own routing. Its peak: the rows its experts received (the
largest share over the profiled step's micro-batches, against the k x T a balanced router sends them:
theory/moe.received_shares, from every rank's routed rows, runtime/routing.py) move what the rank keeps
(theory/moe.py). Its bytes sent: half of its all-to-alls return what its experts received (parallel/ep/comm.py),
at its mean share over the counted step's micro-batches. One rank's figures move with the routing; the theory at
the balanced share is the prediction a plan makes, and stays beside it (`memory/tensor_peak_balanced_predicted_bytes`,
`comm/balanced_predicted_bytes_per_step`)."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from ..config.mesh import mesh_of
from ..core.records import RankReport
from ..theory import moe
from ..theory.communication import comm_per_step
from ..theory.predict import predict
from ..theory.shape import shape_of


def shares_by_micro_batch(rows_by_rank: List[list], groups: List[List[int]]) -> List[List[float]]:
    """Every rank's received share in each micro-batch ([micro-batch][rank]: theory/moe.received_shares), from
    each rank's routed rows per micro-batch, by global rank; as many micro-batches as every rank recorded."""
    count = min(len(rows) for rows in rows_by_rank)
    return [moe.received_shares([rows[m] for rows in rows_by_rank], groups) for m in range(count)]


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
    by_step: Dict[int, List[List[float]]] = {}
    out = []
    for rank, profile in enumerate(profiles):
        step = profile.get("step_index", 0)  # each rank's lowest profiled step is its own
        if step not in by_step:
            by_step[step] = shares_by_micro_batch([p["routed_rows"][step] for p in profiles], groups)
        # a rank's share in each micro-batch, whose peak is one micro-batch's activations: the largest
        micro_batches = [shares[rank] for shares in by_step[step]]
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


def routed_comm(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    """The bytes the rank that sends most is predicted to send in the counted step, at its experts' received share
    of that step (the mean over its micro-batches: the bytes add up over them), which replace the balanced
    prediction (kept beside it), so that `comm/bytes_error_pct` compares that rank with itself; nothing unless
    the run split its experts and every rank's counted work kept its routed rows (runtime/loop.py)."""
    mesh = mesh_of(cfg)
    works = [r.work or {} for r in sorted(ranks, key=lambda r: r.rank)]
    if mesh.ep == 1 or not all(w.get("routed_rows") for w in works):
        return {}
    base = shape_of(cfg, None, ranks[0].params)
    by_micro_batch = shares_by_micro_batch([w["routed_rows"] for w in works], mesh.groups("ep"))
    shares = [sum(s[rank] for s in by_micro_batch) / len(by_micro_batch) for rank in range(len(works))]
    predicted = [comm_per_step(cfg.backend, dataclasses.replace(base, received_share=share)) for share in shares]
    most = max(range(len(works)), key=lambda rank: predicted[rank]["bytes"])
    balanced = comm_per_step(cfg.backend, base)["bytes"]
    return {"moe/counted_received_share_max": max(shares), "moe/counted_received_share_min": min(shares),
            "comm/balanced_predicted_bytes_per_step": balanced,
            "comm/predicted_bytes_per_step": predicted[most]["bytes"],
            "comm/predicted_intra_node_bytes_per_step": predicted[most]["intra_node_bytes"],
            "comm/predicted_inter_node_bytes_per_step": predicted[most]["inter_node_bytes"]}

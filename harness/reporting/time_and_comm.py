"""A run's time and communication figures, set beside theory: the measured step breakdown on the slowest
rank, the bytes counted in one step by the link they cross, and the time model's parts with each one's error
(harness/theory/time.py). run_summary.py puts them into the summary."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, List

from ..core.records import RankReport
from ..theory.communication import counted_by_link
from ..theory.shape import ranks_per_node, shape_of
from ..theory.time import PARTS, CommTable, Rates, predict_parts


def time_breakdown(ranks: List[RankReport]) -> Dict[str, float]:
    """The step's parts (runtime/time_profile.py) on the rank whose measured step was slowest: a synchronous
    step goes at that rank's pace, and one rank's parts sum to its step. How far that step is from the
    rank's timed steps says whether the breakdown describes them."""
    profiled = [r.time_breakdown for r in ranks]
    if not all(profiled):
        return {}
    slowest = max(profiled, key=lambda p: p["step"])
    out = {f"time/{part}_s": slowest[part] for part in PARTS + ("comm_total",)}
    out["time/profiled_step_s"] = slowest["step"]
    out["time/breakdown_vs_step_pct"] = slowest["vs_timed_pct"]
    out["time/comm_exposed_pct"] = 100 * slowest["comm_exposed"] / slowest["step"]
    out["time/comm_total_pct"] = 100 * slowest["comm_total"] / slowest["step"]
    return out


def communication(cfg, ranks: List[RankReport]) -> Dict[str, float]:
    """Bytes sent in the counted step (runtime/collective_count.py), on the rank that sent most: in all, inside
    a node and across nodes (its groups' ranks against the node size), beside the theory's
    comm/predicted_*."""
    counted = [r for r in ranks if r.collectives is not None]
    if not counted:
        return {}
    per_node = ranks_per_node(cfg, len(ranks))  # as the theory splits its own bytes
    split = [counted_by_link(r.collectives, per_node) for r in counted]
    most = max(split, key=lambda b: b["intra_node"] + b["inter_node"])
    return {"comm/measured_bytes_per_step": most["intra_node"] + most["inter_node"],
            "comm/measured_intra_node_bytes_per_step": most["intra_node"],
            "comm/measured_inter_node_bytes_per_step": most["inter_node"],
            "comm/measured_collectives_per_step": float(max(sum(c["count"] for c in r.collectives) for r in counted))}


def collectives_table(cfg) -> list:
    """This machine's `make collectives` rows (under paths.root), or none: the time model then says it used
    its stated default."""
    path = Path(cfg.paths.root) / "collectives" / "collectives.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def time_model(cfg, ranks: List[RankReport], flop_counts: dict, measured: dict) -> Dict[str, float]:
    """The predicted parts of a step (theory/time.py) and each part's error against the measured one."""
    if not flop_counts.get("counted") or not ranks[0].measured_copy_gbps:
        return {}
    world, par = len(ranks), cfg.parallelism
    rates = Rates(tflops=statistics.fmean(r.measured_peak_tflops for r in ranks),
                  mem_gbps=statistics.fmean(r.measured_copy_gbps for r in ranks),
                  comm=CommTable(collectives_table(cfg), par.device, world, par.intra_node_gbps, par.inter_node_gbps),
                  device=par.device)
    flops_per_step = flop_counts["counted"] * par.micro_batch * par.seq_len * par.grad_accum
    parts = predict_parts(cfg.backend, shape_of(cfg, world, ranks[0].params), flops_per_step, rates,
                          cfg.train.activation_checkpointing)
    out = {f"time/{k}_predicted_s": v for k, v in parts.items()}
    out["time/collectives_measured"] = float(rates.comm.measured)
    for part in ("forward", "backward", "optimizer", "comm_exposed", "comm_total"):
        if f"time/{part}_s" in measured and parts[part] > 0:
            out[f"time/{part}_error_pct"] = 100 * (measured[f"time/{part}_s"] - parts[part]) / parts[part]
    if "time/profiled_step_s" in measured:
        out["time/step_error_pct"] = 100 * (measured["time/profiled_step_s"] - parts["step"]) / parts["step"]
    return out


def time_notes(figures: dict) -> List[str]:
    """Every part the time model misses by more than 30%, named (`other` is not modelled: not a miss)."""
    misses = [f"{part} {figures[f'time/{part}_s'] * 1e3:.2f} ms measured, {figures[f'time/{part}_predicted_s'] * 1e3:.2f} "
              f"predicted ({figures[f'time/{part}_error_pct']:+.0f}%)"
              for part in ("forward", "backward", "optimizer", "comm_exposed", "comm_total")
              if abs(figures.get(f"time/{part}_error_pct", 0)) > 30]
    if not misses:
        return []
    source = ("this machine's collectives table" if figures.get("time/collectives_measured")
              else "the stated default link (no `make collectives` result for this device and world size)")
    return [f"time: the model misses by over 30% on {'; '.join(misses)} (communication from {source})"]

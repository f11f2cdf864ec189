"""Every prediction for one run, under the summary's metric keys."""
from __future__ import annotations

from typing import Dict, Optional

from ..config.recompute import recompute_of
from ..core.components import totals
from .communication import comm_per_step
from . import activations, moe
from .memory import layout, paper_bytes, paper_stage
from .peak import phase_terms
from .shape import Shape, shape_of

# the headroom a predicted peak must leave under a budget to count as fitting (shardbench advise, shardbench estimate)
FIT_MARGIN = 0.10


def predict(cfg, world: int, counts: Dict[str, int], shape: Optional[Shape] = None) -> Dict[str, float]:
    """Every prediction for one run, under the metric keys the summary uses; `shape`: shape_of(cfg, world, counts),
    where the caller has it already."""
    s = shape or shape_of(cfg, world, counts)
    components = layout(cfg.backend, s)
    total = totals(components)
    out = {f"memory/model_states_{k}_predicted_bytes": v for k, v in components.items() if k != "buffers"}
    out.update({
        "memory/model_states_predicted_bytes": total["total"],
        "memory/model_states_device_predicted_bytes": total["device"],
        "memory/model_states_host_predicted_bytes": total["host"],
        "memory/model_states_paper_bytes": paper_bytes(paper_stage(cfg.backend), s),
        "memory/buffers_predicted_bytes": components.get("buffers", 0.0),
    })
    act = activations.parts(cfg.model, cfg.parallelism, activations.regime(cfg.backend, cfg.train.precision,
                                                                         cfg.train.master_weights),
                            recompute_of(cfg), s.matmul_weights, s.head_matmul_weights, s.mesh,
                            compiled=counts.get("compiled_kept"), dispatch=moe.dispatch_of(s))
    # what one micro-batch's forward keeps for backward (theory/activations.py)
    out["memory/activations_predicted_bytes"] = activations.saved(act)
    phases, out["memory/peak_block_predicted"] = phase_terms(cfg.backend, s, act)
    # the peak of live tensors on the training device (on CPU every state is on it, offloaded or not): states
    # and buffers, plus the largest phase's terms (theory/peak.py)
    states = total["total"] if cfg.parallelism.device == "cpu" else total["device"]
    base = states + out["memory/buffers_predicted_bytes"]
    for phase, terms in phases.items():
        out.update({f"memory/{phase}_{k}_predicted_bytes": v for k, v in terms.items()})
        out[f"memory/peak_at_{phase}_predicted_bytes"] = base + sum(terms.values())
    out["memory/tensor_peak_predicted_bytes"] = max(out[f"memory/peak_at_{p}_predicted_bytes"] for p in phases)
    # what a budget bounds: on CUDA the same peak; on CPU all of it but the offloaded (host) states
    out["memory/device_peak_predicted_bytes"] = (out["memory/tensor_peak_predicted_bytes"]
                                                 - (total["host"] if cfg.parallelism.device == "cpu" else 0.0))
    comm = comm_per_step(cfg.backend, s)
    out["comm/predicted_bytes_per_step"] = comm["bytes"]
    out["comm/paper_elements_per_step"] = comm["paper_elements"]
    # which link those bytes cross (theory/communication.py): inside a node, or between nodes
    out["comm/predicted_intra_node_bytes_per_step"] = comm["intra_node_bytes"]
    out["comm/predicted_inter_node_bytes_per_step"] = comm["inter_node_bytes"]
    return out

"""What expert parallelism cannot run, one line each, and the degrees the estimator and the advisor search."""
from __future__ import annotations

from typing import List

from ...config.axes import family_refusal
from ...config.mesh import mesh_of
from ...core.errors import ConfigError

EP_DEGREES = (1, 2, 4, 8)  # the expert-parallel degrees the estimator and the advisor search on a mixture of experts


def degree_rules(cfg) -> List[str]:
    """The degree against the model, the ranks and the family: what the search leaves out."""
    par, m = cfg.parallelism, cfg.model
    ep = par.ep
    if ep == 1:
        return []
    if not m.num_experts:
        return [f"parallelism.ep={ep}: model {m.name} is dense (model.num_experts=0): there are no experts to "
                "split; use a mixture of experts (e.g. model=tiny_qwen3_moe) or parallelism.ep=1"]
    out = []
    if m.num_experts % ep:
        divisors = ", ".join(str(d) for d in range(1, m.num_experts + 1) if m.num_experts % d == 0)
        out.append(f"parallelism.ep={ep}: must divide model.num_experts={m.num_experts} (each rank holds whole "
                   f"experts, as transformers shards them); use one of {divisors}")
    refusal = family_refusal(cfg, "ep")
    if refusal is None:
        return out  # an unknown family is backend_rules' to say
    if refusal:
        out.append(f"parallelism.ep={ep}: {refusal}")
    try:
        mesh = mesh_of(cfg)
    except ConfigError:
        return out  # the mesh's own refusal says why ep does not divide the ranks (config/mesh_check.mesh_rules)
    # HSDP's replicas hold the experts' layout each, ep x efsdp inside a replica (runtime/device_mesh.py)
    if mesh.post_forward_group:
        out.append(f"parallelism.ep={ep}: backend={cfg.backend.name} keeps each block over a smaller group between "
                   "forward and backward (partial resharding, ZeRO++'s hpZ), whose expert groups are not held by a "
                   "test yet; use a backend that reshards over its whole shard group (HSDP for replicas "
                   "across nodes)")
    return out


def composition_rules(cfg) -> List[str]:
    """What the run's other choices do not do with expert parallelism yet (the mixture of experts' own
    refusals, tp, cp, compile, float8 and selective_op, are config/moe_check.py's)."""
    ep = cfg.parallelism.ep
    if ep == 1 or not cfg.model.num_experts:
        return []
    out = []
    if cfg.workload.name != "full":
        out.append(f"parallelism.ep={ep}: workload={cfg.workload.name} is not split by expert parallelism here "
                   "(peft's adapters on 3-D expert weights are not sharded by transformers' plan); use "
                   "workload=full or parallelism.ep=1")
    if cfg.train.master_weights == "model":
        out.append(f"parallelism.ep={ep}: train.master_weights=model is not measured with expert parallelism; use "
                   "train.master_weights=fp32 or parallelism.ep=1")
    return out

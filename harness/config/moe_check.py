"""A mixture of experts' rules (model.num_experts > 0; theory/moe.py), checked before any rank starts: one line
naming why a combination cannot run.

What runs on a mixture of experts is what has been held to DDP's losses and to the memory theory here: every
data-parallel family (DDP, FSDP2, FSDP1, ZeRO 1-3, with DeepSpeed's leaf-module setting for the MoE block or
without it). The other axes are refused until they are: tensor and context parallelism (transformers' and
DeepSpeed's plans shard the experts in ways the theory does not count yet), torch.compile (the experts' grouped
matmul is an opaque op whose compiled activations are not traced here), the selective policies (their saved-op
list has no grouped matmul) and float8 (torchao converts nn.Linear only, not the 3-D experts). DeepSpeed's leaf-module
setting is its family's rule (backends/deepspeed/family.py).
"""
from __future__ import annotations

from typing import List

from .recompute import is_selective


WHY = {"parallelism.tp": "the experts' tensor-parallel split is not in the theory yet",
       "parallelism.cp": "context parallelism is held to the theory for dense blocks only",
       "train.compile": "the experts' grouped matmul is opaque to the compiled-activation trace; set it false",
       "train.float8": "torchao converts nn.Linear only, not the 3-D expert weights; use train.float8=none",
       "train.activation_checkpointing": "its saved-op list has no grouped matmul; use full"}


def _value(cfg, key: str) -> str:
    """`=<policy>` after the checkpointing key, whose refusal is for some of its values only."""
    return f"={cfg.train.activation_checkpointing}" if key == "train.activation_checkpointing" else ""


def axis_problems(cfg) -> List[str]:
    """The parallel axes a mixture of experts does not run on yet (the estimator's and the advisor's search
    skips their meshes: config/mesh_check.mesh_points)."""
    if not cfg.model.num_experts:
        return []
    par = cfg.parallelism
    return [f"parallelism.{axis}={par.get(axis)}: not with a mixture of experts (model.num_experts="
            f"{cfg.model.num_experts}): {WHY['parallelism.' + axis]}; use parallelism.{axis}=1"
            for axis in ("tp", "cp") if (par.get(axis) or 1) > 1]


def problems(cfg) -> List[str]:
    m = cfg.model
    if not m.num_experts:
        if m.experts_per_token:
            return [f"model.experts_per_token={m.experts_per_token}: a dense model (model.num_experts=0) routes "
                    f"nowhere; set model.num_experts too, or leave experts_per_token at 0"]
        return []
    out = []
    where = f"model.num_experts={m.num_experts}"
    if m.family != "llama" or not m.hf_config:
        out.append(f"{where}: a mixture of experts is built from a mixtral or qwen3_moe config.json "
                   f"(model.hf_config, e.g. model=tiny_mixtral); model.family={m.family} has no experts")
    if not 1 <= m.experts_per_token <= m.num_experts:
        out.append(f"model.experts_per_token={m.experts_per_token}: each token is routed to between 1 and "
                   f"model.num_experts={m.num_experts} experts")
    train = cfg.train
    refused = {"train.compile": train.compile, "train.float8": train.float8 != "none",
               "train.activation_checkpointing": is_selective(cfg)}
    out += axis_problems(cfg)
    out += [f"{key}{_value(cfg, key)}: not with a mixture of experts ({where}): {WHY[key]}"
            for key, on in refused.items() if on]
    return out

"""Transformers' expert parallelism applied inside a rank (transformers/distributed/expert_parallel.py): each
experts module's 3-D weights become `Shard(0)` DTensors on the `ep` dimension (rank r keeps experts
r·E/ep .. (r+1)·E/ep - 1) and its forward AllToAllEP's dispatch, local experts and combine. The model's own
`ep_plan` (Mixtral's, Qwen3-MoE's) names the modules, so nothing here knows a class name.

The data-parallel family then shards the experts over `efsdp`, the ranks that hold the same experts, before the
blocks (torchtitan's order: `shard_units`): each expert's gradient is the sum of what every ep rank's tokens
sent it, so it is divided by the whole data-parallel degree, not by `efsdp` (set_gradient_divide_factor), to
equal DDP's mean over every rank's tokens. gloo has no PREMUL_SUM, so on CPU the division is FSDP2's pre/post
one around a SUM (set_force_sum_reduction_for_comms), except over one efsdp rank, where torch 2.13 then divides
twice. Adam hides a constant factor in the gradients (its m / sqrt(v)), so losses alone would not have shown
it: the test holds the optimizer's states too.
"""
from __future__ import annotations

from torch import nn

IMPLEMENTATION = "all_to_all"  # transformers' AllToAllEP (its "auto" picks it too where no DeepGEMM kernel runs)


def apply(model: nn.Module, meshes) -> tuple:
    """Split `model`'s experts over the `ep` dimension of `meshes` (runtime/device_mesh.Meshes); returns the
    settings that ran and the experts modules, which the family shards over `efsdp`."""
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    plan = model._expand_parallel_plan(model.ep_plan)
    apply_expert_parallelism(model, meshes.dimension("ep"), meshes.dimension("etp"), plan, IMPLEMENTATION)
    modules = dict(model.named_modules())
    experts = [modules[name] for name, style in plan.items() if style == "ep_dispatch_experts"]
    first = experts[0] if experts else None
    settings = {"ep": meshes.dimension("ep").size(), "efsdp": meshes.dimension("efsdp").size(),
                "implementation": f"transformers apply_expert_parallelism ({IMPLEMENTATION})",
                "plan": dict(model.ep_plan), "experts_modules": len(experts),
                "local_experts": getattr(first, "num_experts", None)}
    return settings, experts

"""A mixture of experts' rules (model.num_experts > 0; theory/moe.py), checked before any rank starts: one line
naming why a combination cannot run.

What runs on a mixture of experts is what has been held to DDP's losses and to the memory theory here: every
data-parallel family (DDP, FSDP2, FSDP1, ZeRO 1-3, with DeepSpeed's leaf-module setting for the MoE block or
without it), context parallelism at ep 1 (each cp rank routes its own tokens), and torch.compile at ep 1 under
the families that compile block by block and ZeRO-3's split module (compile_problems). The other axes are refused
until they are: tensor parallelism (transformers' and DeepSpeed's plans shard the experts in ways the theory does
not count yet), context parallelism with expert parallelism, compile with expert parallelism or ZeRO-1/2's whole
compiled module, and float8 (torchao converts nn.Linear only, not the 3-D experts). The selective policies save
the grouped matmuls' outputs beside the matmuls', at any ep: of the rows a rank's experts run (runtime/models.py,
theory/moe.selective_bytes_per_token); selective_op_half alternates the matmuls alone, as torchtitan's op policy
counts mm only. DeepSpeed's leaf-module setting is its
family's rule (backends/deepspeed/family.py).
"""
from __future__ import annotations

from typing import List

WHY = {"parallelism.tp": "the experts' tensor-parallel split is not in the theory yet",
       # each cp rank routes its own S/cp tokens to whole local experts (ep 1): the dense blocks' ring or Ulysses
       # beside the experts, held to DDP's losses (tests/test_context_parallel.py); expert parallelism borrows
       # its ranks from the data-parallel ones only here (torchtitan's dp_shard x cp = efsdp x ep is not built)
       "parallelism.cp": "with expert parallelism, whose ranks are borrowed from the data-parallel ones only here "
                         "(not from cp, as torchtitan's efsdp x ep = dp_shard x cp does); set parallelism.ep=1",
       "train.float8": "torchao converts nn.Linear only, not the 3-D expert weights; use train.float8=none"}


def axis_problems(cfg) -> List[str]:
    """The parallel axes a mixture of experts does not run on yet (the estimator's and the advisor's search
    skips their meshes: config/mesh_check.mesh_points)."""
    if not cfg.model.num_experts:
        return []
    par = cfg.parallelism
    return [f"parallelism.{axis}={par.get(axis)}: not with a mixture of experts (model.num_experts="
            f"{cfg.model.num_experts}): {WHY['parallelism.' + axis]}; use parallelism.{axis}=1"
            for axis in ("tp", "cp") if (par.get(axis) or 1) > 1 and (axis == "tp" or (par.ep or 1) > 1)]


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
        out.append(f"{where}: a mixture of experts is built from a mixtral, qwen2_moe or qwen3_moe config.json "
                   f"(model.hf_config, e.g. model=tiny_mixtral); model.family={m.family} has no experts")
    if not 1 <= m.experts_per_token <= m.num_experts:
        out.append(f"model.experts_per_token={m.experts_per_token}: each token is routed to between 1 and "
                   f"model.num_experts={m.num_experts} experts")
    train = cfg.train
    refused = {"train.float8": train.float8 != "none"}
    out += axis_problems(cfg)
    if (cfg.parallelism.cp or 1) > 1 and m.router_aux_loss_trained:
        out.append(f"parallelism.cp={cfg.parallelism.cp}: not with a trained load-balancing loss "
                   "(output_router_logits): each cp rank would compute it over its S/cp tokens, a different loss "
                   "from the whole sequence's, which no test holds here; set parallelism.cp=1")
    out += [f"{key}: not with a mixture of experts ({where}): {WHY[key]}"
            for key, on in refused.items() if on]
    return out + compile_problems(cfg)


def compile_problems(cfg) -> List[str]:
    """torch.compile on a mixture of experts: each block compiled (FSDP2, FSDP1, DDP) and ZeRO-3's split module run
    and are held to DDP's losses and the memory theory at ep 1 (tests/test_moe.py); the rest is refused."""
    from . import families

    if not cfg.train.compile:
        return []
    head = f"train.compile=true: not with a mixture of experts (model.num_experts={cfg.model.num_experts})"
    if (cfg.parallelism.ep or 1) > 1:
        return [f"{head} at parallelism.ep={cfg.parallelism.ep}: the experts' all-to-all reads its split sizes from "
                "the routing (.tolist()), a graph break whose compiled activations are not traced here; set "
                "parallelism.ep=1 or train.compile=false"]
    if families.of(cfg.backend).compile_scope(cfg.backend) == "module":
        # measured 2026-12-03, tiny Qwen3-MoE at 2 ranks: ZeRO-2's compiled module +15.8% over the theory, where
        # the blocks' compile reads +1.2% to +8.3% and ZeRO-3's split module +3.6%
        return [f"{head} under backend={cfg.backend.name}: its engine compiles the whole module, whose graphs, "
                "broken at each router, keep more than the theory traces (ZeRO-2: +15.8% measured at 2 ranks); use "
                "train.compile=false, or a backend that compiles block by block"]
    return []

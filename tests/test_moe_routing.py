"""What a rank keeps under expert parallelism moves with the rows its experts receive: theory/moe.py's split into
what a rank sends and what it receives, under transformers' all-to-all and DeepSpeed's AutoEP (with its padded
buffer), held storage by storage against autograd's saved-tensor hooks on two forked gloo ranks
(tests/forked_ranks.py), with the router pushed towards rank 0's experts so that one rank receives several times
the other's rows; and the share of the balanced rows each rank received, as the run summary reads it from every
rank's routed rows (runtime/routing.py)."""
from __future__ import annotations

import functools

import pytest
import torch

from harness.config.compose import compose
from harness.runtime import models
from harness.theory import activations, moe

from forked_ranks import run_ranks
from test_moe import model_cfg

TOKENS = 96
CASES = {"transformers": [(name, reg) for name in ("tiny_mixtral", "tiny_qwen3_moe", "tiny_qwen2_moe")
                          for reg in ("fp32", "16-bit", "autocast")],
         # DeepSpeed runs its parameters in 16 bits or fp32, never under autocast
         "autoep": [(name, reg) for name in ("tiny_mixtral", "tiny_qwen3_moe", "tiny_qwen2_moe")
                    for reg in ("fp32", "16-bit")]}


def saved_under_push(m, model, reg: str, router: torch.nn.Module, chosen_of, push: float) -> dict:
    """Block 0's saved bytes on this rank (less its parameters, input and cos/sin) over TOKENS tokens pushed by
    `push` towards the first half of the experts (rank 0's), the rows this rank's tokens sent, the rows its
    experts received and every rank's routed rows per expert."""
    import torch.distributed as dist

    rank, layer = dist.get_rank(), model.model.layers[0]
    weight = router.weight.detach().float()
    towards = weight[:m.num_experts // 2].mean(0) - weight[m.num_experts // 2:].mean(0)
    torch.manual_seed(1 + rank)
    x = torch.randn(1, TOKENS, m.hidden_size) + push * towards / towards.norm()
    x = x.to(next(model.parameters()).dtype).requires_grad_(True)
    positions = torch.arange(TOKENS)[None]
    chosen, seen = [], {}

    def choose(module, args, output) -> None:
        with torch.no_grad():  # saving nothing of its own
            chosen.append(chosen_of(output))
    hook = router.register_forward_hook(choose)

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=reg == "autocast"):
        cos_sin = model.model.rotary_emb(x, positions)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, position_embeddings=cos_sin, position_ids=positions)
    hook.remove()
    for t in [*(getattr(p, "_local_tensor", p) for p in layer.parameters()), x, *cos_sin]:
        seen.pop(t.untyped_storage().data_ptr(), None)
    rows = torch.bincount(chosen[0].reshape(-1), minlength=m.num_experts)
    every = [torch.zeros_like(rows) for _ in range(2)]
    dist.all_gather(every, rows)
    mine = slice(rank * m.num_experts // 2, (rank + 1) * m.num_experts // 2)
    return {"saved": sum(seen.values()), "sent": int(rows.sum()),
            "received": int(sum(r[mine].sum() for r in every)), "rows": [r.tolist() for r in every]}


def built(name: str, reg: str):
    m = model_cfg(name)
    torch.manual_seed(0)
    model = models.build(m)
    return m, (model.to(torch.bfloat16) if reg == "16-bit" else model)


def transformers_blocks(push: float, measure=None) -> list:
    """Each case's block under transformers' apply_expert_parallelism (all_to_all) over the two ranks, measured by
    `measure` (saved_under_push's arguments; default saved_under_push)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("ep", "etp"))
    out = []
    for name, reg in CASES["transformers"]:
        m, model = built(name, reg)
        apply_expert_parallelism(model, mesh["ep"], mesh["etp"], model._expand_parallel_plan(model.ep_plan),
                                 "all_to_all")
        router = next(mod for n, mod in model.model.layers[0].named_modules() if n.endswith("mlp.gate"))
        out.append((measure or saved_under_push)(m, model, reg, router, lambda output: output[2], push))
    return out


def autoep_blocks(push: float, measure=None) -> list:
    """Each case's block under DeepSpeed's AutoEP: its groups and its replaced MoE layers, as the engine builds
    them (deepspeed/runtime/engine.py), without the engine; measured as transformers_blocks measures."""
    import torch.distributed as dist
    import deepspeed.comm
    from deepspeed.module_inject.auto_ep import AutoEP
    from deepspeed.module_inject.auto_ep_config import parse_autoep_config
    from deepspeed.utils import groups

    from harness.backends.deepspeed.autoep import keyed_output_registry

    deepspeed.comm.init_distributed(dist_backend="gloo", verbose=False)
    groups._create_expert_and_data_parallel(expert_parallel_size_=2, mp_size=1, pp_size=1, mp_mode="sp")
    keyed_output_registry()
    out = []
    for name, reg in CASES["autoep"]:
        m, model = built(name, reg)
        autoep = AutoEP(model, parse_autoep_config({"enabled": True, "autoep_size": 2}))
        autoep.replace_moe_layers(autoep.ep_parser(), ep_size=2, ep_rank=dist.get_rank())
        gate = next(mod for n, mod in model.model.layers[0].named_modules()
                    if n.endswith("gate") and isinstance(mod, torch.nn.Linear))  # AutoEP's router's own Linear
        out.append((measure or saved_under_push)(m, model, reg, gate, lambda logits: torch.topk(
            logits.float(), m.experts_per_token, dim=-1).indices, push))
    return out


@pytest.mark.parametrize("implementation, blocks", [("transformers", transformers_blocks), ("autoep", autoep_blocks)])
def test_a_ranks_activations_are_what_it_sends_and_what_its_experts_receive(implementation, blocks):
    ranks = run_ranks(blocks, 2, 3.0)
    for c, (name, reg) in enumerate(CASES[implementation]):
        m = model_cfg(name)
        counts = models.param_count(m)
        got = [r[c] for r in ranks]
        assert got[0]["received"] > 3 * got[1]["received"] > 0, (name, got)  # the push did move the rows
        assert sum(r["received"] for r in got) == sum(r["sent"] for r in got)  # every row sent is received once
        predicted = {}
        for rank, r in enumerate(got):
            assert r["sent"] == m.experts_per_token * TOKENS
            share = r["received"] / r["sent"]
            assert moe.received_shares(r["rows"], [[0, 1]])[rank] == pytest.approx(share)
            dispatch = moe.Dispatch(2, implementation, share)
            predicted[rank] = (TOKENS * activations.block_bytes_per_token(m, reg, dispatch=dispatch)
                               + moe.mlp_bytes_per_block(m, dispatch, TOKENS, reg))
            if reg != "16-bit":
                predicted[rank] -= TOKENS * 4 * m.hidden_size  # the fp32 input the first norm keeps is the block's
            if reg == "autocast":  # autocast's 16-bit copies of the block's matmul weights, its router's among them
                predicted[rank] += 2 * (counts["matmul_weights"] - counts["head_matmul_weights"]) / m.num_layers
            assert r["saved"] == pytest.approx(predicted[rank], abs=1e-6), (name, reg, rank,
                                                                             r["saved"] - predicted[rank])
        # the balanced router's count lies between the two ranks': the routing moves each rank's
        balanced = moe.Dispatch(2, implementation)
        assert got[1]["saved"] < (TOKENS * activations.block_bytes_per_token(m, reg, dispatch=balanced)
                                  + moe.mlp_bytes_per_block(m, balanced, TOKENS, reg)
                                  - (TOKENS * 4 * m.hidden_size if reg != "16-bit" else 0)) < got[0]["saved"]


def selective_under_push(blocks, implementation: str, push: float) -> dict:
    """{policy: `blocks`'s cases with block 0 checkpointed by it}: what the policy's cache holds on this rank (the
    saved matmuls', attention's and grouped matmuls' outputs), with the rows sent and received."""
    from harness.config.recompute import Recompute
    from harness.runtime.compiled.compiled_activations import _record_selective_caches, _tensors_in

    def checkpointed(policy, m, model, reg, router, chosen_of, push):
        model.train()
        models.enable_activation_checkpointing(model, Recompute(policy, 1, m.num_layers))
        caches = _record_selective_caches(models.blocks(model))
        out = saved_under_push(m, model, reg, router, chosen_of, push)
        kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors_in(caches)}
        return {**out, "cached": sum(kept.values())}

    return {policy: blocks(push, functools.partial(checkpointed, policy)) for policy in POLICIES}


POLICIES = ("selective_op", "selective_op_half")


@pytest.mark.parametrize("implementation, blocks", [("transformers", transformers_blocks), ("autoep", autoep_blocks)])
def test_the_selective_policies_keep_the_grouped_matmuls_outputs_of_the_rows_a_ranks_experts_run(
        implementation, blocks):
    """Under expert parallelism the selective policies' grouped matmuls run on the rows a rank's experts received
    (and, under AutoEP, its buffer's padding rows): what the policy's cache holds moves with the routing, as the
    theory counts it (theory/moe.selective_bytes_per_token and selective_bytes_per_block), byte for byte, under
    selective_op and under selective_op_half (every other mm); the block's input is all autograd saves besides."""
    from harness.config.recompute import Recompute
    from harness.theory.widths import residual_bytes

    ranks = run_ranks(selective_under_push, 2, blocks, implementation, 3.0)
    par = compose([f"parallelism.seq_len={TOKENS}", "parallelism.micro_batch=1"]).parallelism
    for policy in POLICIES:
        for c, (name, reg) in enumerate(CASES[implementation]):
            m = model_cfg(name)
            got = [r[policy][c] for r in ranks]
            assert got[0]["received"] > 3 * got[1]["received"] > 0, (name, got)
            for r in got:
                assert r["saved"] == 0, (name, reg, r["saved"])  # under the checkpoint only its input, set aside
                dispatch = moe.Dispatch(2, implementation, r["received"] / r["sent"])
                a = activations.parts(m, par, reg, Recompute(policy, 1, m.num_layers), dispatch=dispatch)
                predicted = a["selective_block"] - TOKENS * residual_bytes(reg) * m.hidden_size
                assert r["cached"] == pytest.approx(predicted, abs=1e-6), (policy, name, reg, r["cached"] - predicted)


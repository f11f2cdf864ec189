"""What a rank keeps under transformers' expert parallelism moves with the rows its experts receive: theory/moe.py's
split into what a rank sends and what it receives, held storage by storage against autograd's saved-tensor hooks
on two forked gloo ranks (tests/forked_ranks.py), with the router pushed towards rank 0's experts so that one
rank receives several times the other's rows; and the share of the balanced rows each rank received, as the run
summary reads it from every rank's routed rows (runtime/routing.py)."""
from __future__ import annotations

import pytest
import torch

from harness.runtime import models
from harness.theory import activations, moe

from forked_ranks import run_ranks
from test_moe import model_cfg

CASES = [(name, reg) for name in ("tiny_mixtral", "tiny_qwen3_moe") for reg in ("fp32", "16-bit", "autocast")]


def kept_by_a_split_block(push: float) -> list:
    """On each of two ranks, for each case: block 0's saved bytes (less its parameters, input and cos/sin), the
    rows this rank's tokens sent and the rows its experts received, over 96 tokens pushed by `push` towards the
    router's first half of the experts (rank 0's)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism

    rank, tokens, out = dist.get_rank(), 96, []
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("ep", "etp"))
    for name, reg in CASES:
        m = model_cfg(name)
        torch.manual_seed(0)
        model = models.build(m)
        if reg == "16-bit":
            model = model.to(torch.bfloat16)
        apply_expert_parallelism(model, mesh["ep"], mesh["etp"], model._expand_parallel_plan(model.ep_plan),
                                 "all_to_all")
        layer = model.model.layers[0]
        router = next(mod for n, mod in layer.named_modules() if n.endswith("mlp.gate"))
        weight = router.weight.detach().float()
        towards = weight[:m.num_experts // 2].mean(0) - weight[m.num_experts // 2:].mean(0)
        torch.manual_seed(1 + rank)
        x = torch.randn(1, tokens, m.hidden_size) + push * towards / towards.norm()
        x = x.to(next(model.parameters()).dtype).requires_grad_(True)
        positions = torch.arange(tokens)[None]
        chosen, seen = [], {}
        hook = router.register_forward_hook(lambda module, args, output: chosen.append(output[2]))

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
        out.append({"saved": sum(seen.values()), "sent": int(rows.sum()),
                    "received": int(sum(r[mine].sum() for r in every)), "rows": [r.tolist() for r in every]})
    return out


def test_a_ranks_activations_are_what_it_sends_and_what_its_experts_receive():
    ranks = run_ranks(kept_by_a_split_block, 2, 3.0)
    for c, (name, reg) in enumerate(CASES):
        m = model_cfg(name)
        counts = models.param_count(m)
        got = [r[c] for r in ranks]
        assert got[0]["received"] > 3 * got[1]["received"] > 0, (name, got)  # the push did move the rows
        assert sum(r["received"] for r in got) == sum(r["sent"] for r in got)  # every row sent is received once
        for rank, r in enumerate(got):
            share = r["received"] / r["sent"]
            assert moe.received_shares(r["rows"], [[0, 1]])[rank] == pytest.approx(share)
            dispatch = moe.Dispatch(2, "transformers", share)
            tokens = r["sent"] // m.experts_per_token
            predicted = (tokens * activations.block_bytes_per_token(m, reg, dispatch=dispatch)
                         + moe.mlp_bytes_per_block(m, dispatch))
            if reg != "16-bit":
                predicted -= tokens * 4 * m.hidden_size  # the fp32 input the first norm keeps is the block's input
            if reg == "autocast":  # autocast's 16-bit copies of the block's matmul weights, its router's among them
                predicted += 2 * (counts["matmul_weights"] - counts["head_matmul_weights"]) / m.num_layers
            assert r["saved"] == pytest.approx(predicted, abs=1e-6), (name, reg, rank, r["saved"] - predicted)
        # a balanced router's count lies between the two ranks': the routing moves each rank's
        balanced = tokens * activations.block_bytes_per_token(m, reg, dispatch=moe.Dispatch(2, "transformers"))
        assert got[1]["saved"] < balanced < got[0]["saved"]

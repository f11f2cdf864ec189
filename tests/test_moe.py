"""Mixtures of experts (Mixtral, Qwen3-MoE): read from their config.json, counted by the theory (what a block
keeps, against torch's saved-tensor hooks in every precision regime; total and active parameters against the
published figures), refused in one line where the theory stops, logged (the router's load-balancing loss against
transformers' own), and trained under every data-parallel family in the two-rank launch: losses equal to DDP's,
states and bytes the theory's, the peak within 10% of it."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from harness.config import hf_models, schema
from harness.config.compose import compose
from harness.config.rules import problems
from harness.runtime import models
from harness.runtime.routing import RouterLog
from harness.theory import activations, moe


def model_cfg(name: str, **fields):
    m = OmegaConf.structured(schema.ModelConfig)
    m.name, m.hf_config = name, f"hf/{name}"
    hf_models.fill(m, [])
    for key, value in fields.items():
        m[key] = value
    return m


def saved_by_block(m, reg: str, tokens: int) -> int:
    """Bytes block 0 keeps for backward on `tokens` tokens, storage by storage, less its parameters, its cos/sin
    and its input (which the previous block's count holds), as autograd's saved-tensor hooks see them."""
    model = models.build(m)
    if reg == "16-bit":
        model = model.to(torch.bfloat16)
    x = torch.randn(1, tokens, m.hidden_size, dtype=next(model.parameters()).dtype, requires_grad=True)
    positions = torch.arange(tokens)[None]
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    layer = model.model.layers[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=reg == "autocast"):
        cos_sin = model.model.rotary_emb(x, positions)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, position_embeddings=cos_sin, position_ids=positions)
    for t in [*layer.parameters(), x, *cos_sin]:
        seen.pop(t.untyped_storage().data_ptr(), None)
    return sum(seen.values())


@pytest.mark.parametrize("name", ["tiny_mixtral", "tiny_qwen3_moe", "tiny_qwen2_moe"])
@pytest.mark.parametrize("reg", ["fp32", "16-bit", "autocast"])
def test_a_moe_block_keeps_what_the_theory_counts(name, reg):
    m = model_cfg(name)
    counts = models.param_count(m)
    for tokens in (64, 128):
        predicted = tokens * activations.block_bytes_per_token(m, reg) + moe.mlp_bytes_per_block(m)
        if reg != "16-bit":
            predicted -= tokens * 4 * m.hidden_size  # the fp32 input the first norm keeps is the block's input
        if reg == "autocast":  # autocast's 16-bit copies of the block's matmul weights, its router's among them
            predicted += 2 * (counts["matmul_weights"] - counts["head_matmul_weights"]) / m.num_layers
        assert saved_by_block(m, reg, tokens) == predicted, (name, reg, tokens)


def test_published_totals_and_active_parameters():
    # Mixtral-8x7B: 46.7B, 12.9B active (Mistral AI); Qwen3-30B-A3B: 30.5B, 3.3B active (Qwen's model card);
    # Qwen1.5-MoE-A2.7B: 14.3B, 2.7B active (its model card), its shared expert among the active ones
    for name, total, active in (("mixtral_8x7b", 46.7e9, 12.9e9), ("qwen3_30b_a3b", 30.5e9, 3.3e9),
                                ("qwen1_5_moe_a2_7b", 14.3e9, 2.7e9)):
        m = model_cfg(name)
        counts = models.param_count(m)
        assert counts["total"] == pytest.approx(total, rel=0.002), name
        assert moe.active_params(m, counts) == pytest.approx(active, rel=0.02), name
    m = model_cfg("qwen3_30b_a3b")
    assert (m.num_experts, m.experts_per_token, m.expert_intermediate_size, m.head_dim, m.qk_norm) == \
        (128, 8, 768, 128, True)


@pytest.mark.parametrize("model_type, says", [
    ("deepseek_v3", "multi-head latent attention"), ("deepseek_v2", "multi-head latent attention"),
    ("gpt_oss", "attention sinks"), ("dbrx", "mixture-of-experts model of type 'dbrx'")])
def test_uncovered_moe_designs_are_refused_in_one_line(tmp_path, model_type, says):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, "num_experts": 8, "n_routed_experts": 8}))
    found = hf_models.file_problem(str(path))
    assert found and says in found and "\n" not in found


@pytest.mark.parametrize("overrides, says", [
    (["parallelism.tp=2", "parallelism.nproc_per_node=2"], "parallelism.tp=2: not with a mixture of experts"),
    (["train.float8=rowwise"], "train.float8: not with a mixture of experts"),
    (["parallelism.cp=2", "parallelism.ep=2", "parallelism.nproc_per_node=4"],
     "parallelism.cp=2: not with a mixture of experts (model.num_experts=8): with expert parallelism"),
    (["parallelism.cp=2", "model.router_aux_loss_trained=true"], "not with a trained load-balancing loss"),
    (["model.experts_per_token=9"], "between 1 and model.num_experts=8"),
    (["backend=ds_zero2", "backend.leaf_moe_blocks=true"], "has no ZeRO-3"),
    (["backend=ds_zero2", "train.compile=true"], "its engine compiles the whole module"),
    (["backend=fsdp", "train.compile=true", "parallelism.ep=2"], "train.compile=true: not with a mixture of experts"),
])
def test_what_a_mixture_of_experts_cannot_run_is_refused(overrides, says):
    found = problems(compose(["model=tiny_mixtral", *overrides]), cuda_devices=lambda: 0)
    assert any(says in line for line in found), found


def test_the_selective_policies_are_not_refused_at_ep_1_or_2():
    """The selective policies save the experts' grouped matmuls' outputs (runtime/models.SELECTIVE_SAVED_OPS): a MoE
    runs them at ep 1 and under expert parallelism, the block's count held by tests/test_recompute.py and, a rank's
    received rows, by tests/test_moe_routing.py."""
    for model in ("tiny_mixtral", "tiny_qwen3_moe"):
        for backend in ("fsdp", "ds_zero2"):
            for ep in ("parallelism.ep=1", "parallelism.ep=2"):
                for policy in ("selective_op", "selective_op_half"):
                    cfg = compose([f"model={model}", f"backend={backend}", ep, "parallelism.nproc_per_node=2",
                                   f"train.activation_checkpointing={policy}"])
                    assert not problems(cfg, cuda_devices=lambda: 0), (model, backend, ep, policy)


@pytest.mark.parametrize("name", ["tiny_qwen3_moe", "tiny_qwen2_moe"])
def test_dense_layers_among_the_experts_are_refused(tmp_path, name):
    config = json.loads((hf_models.locate(f"hf/{name}")).read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "mlp_only_layers": [0]}))
    found = hf_models.file_problem(str(tmp_path))
    assert found and "keep a dense MLP" in found


def test_the_logged_aux_loss_is_transformers_load_balancing_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    m = model_cfg("tiny_mixtral")
    torch.manual_seed(0)
    model = models.build(m)
    log = RouterLog.attach(model, m)
    out = model(input_ids=torch.randint(0, 256, (2, 64)), output_router_logits=True)
    theirs = load_balancing_loss_func(out.router_logits, m.num_experts, m.experts_per_token)
    ours = log.step_metrics()
    assert ours["moe/aux_loss"] == pytest.approx(float(theirs.detach()), rel=1e-5)
    assert ours["moe/imbalance"] >= 1.0
    assert log.step_metrics() == {}  # read once a step: a fresh count after


@pytest.mark.parametrize("name", ["tiny_mixtral", "tiny_qwen2_moe"])
def test_moe_flops_are_counted_on_the_active_experts(name):
    """The FLOPs counted op by op are the active parameters' (each token's k experts; Qwen2-MoE's shared expert
    and its gate, which every token runs, among them)."""
    from harness.runtime.measure.probes import count_flops_per_token, formula_flops_per_token

    m = model_cfg(name)
    counts = models.param_count(m)
    counted = count_flops_per_token(m, 256)
    formula = formula_flops_per_token(moe.active_params(m, counts), counts["embedding"], m.num_layers,
                                      m.hidden_size, 256)
    dense = formula_flops_per_token(counts["total"], counts["embedding"], m.num_layers, m.hidden_size, 256)
    assert counted == pytest.approx(formula, rel=0.01) and counted < 0.8 * dense


def test_every_data_parallel_family_trains_a_moe_as_ddp_does(moe_runs, moe_no_leaf_runs, moe_mixtral_runs,
                                                             moe_compile_runs, moe_qwen2_runs):
    # compiled blocks against eager DDP: the routers' log (runtime/routing.py) runs eagerly between the graphs; traced
    # into a block's graph, which both layers reuse, it had counted both layers' routing under the first's
    for runs, reference in ((moe_runs, moe_runs["ddp"][1]), (moe_mixtral_runs, moe_mixtral_runs["ddp"][1]),
                            (moe_compile_runs, moe_runs["ddp"][1]), (moe_qwen2_runs, moe_qwen2_runs["ddp"][1])):
        for backend, (summary, records, _) in runs.items():
            assert summary["status"] == "ok", (backend, summary.get("reason"))
            assert [r["loss/loss"] for r in records] == pytest.approx([r["loss/loss"] for r in reference],
                                                                       rel=1e-4), backend
            # the same tokens reach the same experts under every family
            assert [r["moe/aux_loss"] for r in records] == pytest.approx([r["moe/aux_loss"] for r in reference],
                                                                          rel=1e-4), backend
            if runs is moe_compile_runs:  # and the gradients, which the losses of 5 steps could hide
                assert [r["loss/grad_norm"] for r in records] == pytest.approx(
                    [r["loss/grad_norm"] for r in reference], rel=1e-4), backend
    for summary, records, _ in moe_runs.values():  # the run's figures: the timed steps' (warm-up excluded)
        timed = [r for r in records if not r["warmup"]]
        assert summary["figures"]["moe/aux_loss_mean"] == pytest.approx(
            sum(r["moe/aux_loss"] for r in timed) / len(timed))
        assert summary["figures"]["moe/imbalance_max"] == max(r["moe/imbalance"] for r in timed) >= 1
    # DeepSpeed makes Qwen2-MoE's block, shared expert and all, a ZeRO-3 leaf by default, as it does Qwen3-MoE's
    assert json.loads((moe_qwen2_runs["ds_zero3"][2] / "settings.json").read_text())["z3_leaf_modules"] == \
        ["Qwen2MoeSparseMoeBlock"]
    no_leaf = moe_no_leaf_runs["ds_zero3"][1]
    assert [r["loss/loss"] for r in no_leaf] == pytest.approx([r["loss/loss"] for r in moe_runs["ddp"][1]], rel=1e-4)


def test_four_ranks_train_a_moe_as_two_do(moe_runs, moe_four_rank_runs):
    reference = [r["loss/loss"] for r in moe_runs["ddp"][1]]  # 2 ranks x 2 micro-batches: the same 8 sequences
    assert set(moe_four_rank_runs) == {"fsdp", "ds_zero3", "fsdp_cp", "ds_zero3_cp"}  # _cp: dp 2 x cp 2
    for backend, (summary, records, _) in moe_four_rank_runs.items():
        assert summary["status"] == "ok", (backend, summary.get("reason"))
        assert [r["loss/loss"] for r in records] == pytest.approx(reference, rel=1e-4), backend


def test_moe_states_bytes_and_peak_are_the_theorys(moe_runs, moe_no_leaf_runs, moe_mixtral_runs, moe_four_rank_runs,
                                                   moe_compile_runs, moe_qwen2_runs):
    every = {**{f"qwen3_moe/{b}": r for b, r in moe_runs.items()},
             **{f"qwen3_moe/{b} compiled": r for b, r in moe_compile_runs.items()},
             **{f"qwen3_moe/{b} without leaves": r for b, r in moe_no_leaf_runs.items()},
             **{f"mixtral/{b}": r for b, r in moe_mixtral_runs.items()},
             **{f"qwen2_moe/{b}": r for b, r in moe_qwen2_runs.items()},
             **{f"qwen3_moe/{b} at 4 ranks": r for b, r in moe_four_rank_runs.items()}}
    for cell, (summary, _, run_dir) in every.items():
        f = summary["figures"]
        assert abs(f["memory/model_states_error_pct"]) <= 1, (cell, f["memory/model_states_error_pct"])
        assert f["comm/bytes_error_pct"] == pytest.approx(0, abs=0.1), cell
        predicted = f["memory/tensor_peak_predicted_bytes"]
        for rank in json.loads((run_dir / "ranks" / "report.json").read_text())["ranks"]:
            p = rank["tensor_peak"]
            error = 100 * (p["peak"] - predicted) / predicted
            held = 100 * (p["peak"] - p["unaccounted"] - predicted) / predicted
            print(f"MoE {cell} rank {rank['rank']}: peak {error:+.1f}% against the theory ({held:+.1f}% less what "
                  f"it had not released at the after-backward marker)")
            # gloo frees a timing-dependent number of ZeRO's buffers (the whole gradient's under ZeRO-2, gathered
            # blocks under ZeRO-3) a phase late on this 2-core machine: as in the Ulysses and AutoTP cells
            # (tests/test_context_parallel.py), the peak is not under the theory by more than 10%, and with what
            # the rank had not released at the marker set aside not over it by more than 10%
            assert -10 <= error and held <= 10, (cell, rank["rank"], error, held)


def test_zero3_gathers_a_moe_blocks_router_and_experts_together_where_deepspeed_makes_the_block_a_leaf(
        moe_runs, moe_no_leaf_runs):
    """DeepSpeed 0.19.8 makes the Mixtral, Qwen2-MoE and Qwen3-MoE blocks ZeRO-3 leaves by default (its
    zero_optimization.leaf_module classes): the router's and the experts' weights are gathered in one all-gather
    a block. Without (backend.leaf_moe_blocks=false) ZeRO-3 gathers module by module: the router, then the
    experts, whose weights transformers 5 holds as two 3-D tensors of one module, so two all-gathers a block of
    the same bytes, never DeepSpeed #5047's one an expert. The run records which classes were leaves."""
    def gathers(run_dir):
        rank0 = json.loads((run_dir / "ranks" / "report.json").read_text())["ranks"][0]
        return sorted((c["size_bytes"], c["phase"], c["count"]) for c in rank0["collectives"]
                      if c["op"] == "all_gather")
    leaf, no_leaf = moe_runs["ds_zero3"][2], moe_no_leaf_runs["ds_zero3"][2]
    m = model_cfg("tiny_qwen3_moe")
    router = 4 * m.num_experts * m.hidden_size
    experts = 4 * m.num_experts * 3 * m.expert_intermediate_size * m.hidden_size
    # fp32, 2 ranks: each rank's half, gathered once a block a micro-batch forward and once backward
    for phase in ("forward", "backward"):
        assert (router + experts, phase, m.num_layers * 2) in gathers(leaf)
        assert {(router, phase, m.num_layers * 2), (experts, phase, m.num_layers * 2)} <= set(gathers(no_leaf))
    others = [g for g in gathers(leaf) if g[0] != router + experts]
    assert others == [g for g in gathers(no_leaf) if g[0] not in (router, experts)]
    assert json.loads((leaf / "settings.json").read_text())["z3_leaf_modules"] == ["Qwen3MoeSparseMoeBlock"]
    assert json.loads((no_leaf / "settings.json").read_text())["z3_leaf_modules"] == []


def test_a_moe_config_json_is_estimated_without_tensor_or_context_parallelism(capsys):
    from harness.studies.predict import estimate

    assert estimate.main(["model=tiny_mixtral", "parallelism=gpu8"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    assert {line.split("│")[1].strip() for line in rows} >= {"ddp", "fsdp", "ds_zero3"}
    # dp x cp x tp: the search skips the axes a mixture of experts is refused on (ep: tests/test_expert_parallel.py)
    assert {tuple(c.strip() for c in line.split("│")[2:5]) for line in rows} == {("8", "1", "1")}

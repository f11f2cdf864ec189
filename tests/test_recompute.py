"""The activation-checkpointing policy (config/recompute.py, runtime/models.enable_activation_checkpointing,
theory/activations.py), in process: each policy gives the gradients of no checkpointing, checkpoints the blocks
transformers' own `every_n_layers` would, and is refused in one line where it cannot run. Its memory is held
against measured peaks in tests/test_memory_check.py."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from harness.config import recompute, rules
from harness.config.compose import compose
from harness.config.recompute import Recompute, recompute_of
from harness.runtime import models
from harness.theory import activations, selective

POLICIES = ("none", "full", "every_2", "selective_op", "selective_op_half")


def _grads(model_name: str, label: str, layers: int = 3):
    cfg = compose([f"model={model_name}", f"model.num_layers={layers}", *recompute.overrides(label)])
    torch.manual_seed(0)
    model = models.build(cfg.model)
    model.train()
    r = recompute_of(cfg)
    applied = models.enable_activation_checkpointing(model, r) if r.any else {"checkpointed_blocks": []}
    ids = torch.randint(0, cfg.model.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, applied


@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gpt2"])
def test_every_policy_gives_the_gradients_of_no_checkpointing(model_name):
    """Recomputing is exact: the same loss and the same gradients, element for element, under every policy
    (selective_op reuses the saved matmul and attention outputs; the rest is recomputed in fp32 as before)."""
    base_loss, base, _ = _grads(model_name, "none")
    for label in POLICIES[1:]:
        loss, grads, applied = _grads(model_name, label)
        assert loss == base_loss, label
        worst = max((grads[n] - g).abs().max().item() for n, g in base.items())
        assert worst <= 1e-6, (label, worst)
        assert applied["checkpointed_blocks"] == ([0, 2] if label == "every_2" else [0, 1, 2]), (label, applied)
    assert applied["saved_ops"] and "mm" in applied["saved_ops"]


def test_every_k_checkpoints_the_blocks_transformers_every_n_layers_would():
    """transformers' own activation_checkpointing_enable(every_n_layers=k), where it has it (5.18+), flags the
    same blocks as the harness's every_k, so a user of either gets the same memory."""
    cfg = compose(["model=tiny_llama", "model.num_layers=5", "train.activation_checkpointing=every_k",
                   "train.activation_checkpointing_every=2"])
    mine = models.build(cfg.model)
    models.enable_activation_checkpointing(mine, recompute_of(cfg))
    theirs = models.build(cfg.model)
    if not hasattr(theirs, "activation_checkpointing_enable"):
        pytest.skip("this transformers has no every_n_layers")
    theirs.activation_checkpointing_enable(every_n_layers=2)
    flags = [[b.gradient_checkpointing for b in models.blocks(m)] for m in (mine, theirs)]
    assert flags[0] == flags[1] == [True, False, True, False, True]


def test_bad_policies_and_combinations_are_refused_in_one_line_and_old_booleans_still_mean_full_and_none():
    def problems(*overrides):
        return rules.problems(compose(["model=tiny_llama", *overrides]))

    assert problems("train.activation_checkpointing=sometimes")[0].startswith(
        "train.activation_checkpointing=sometimes: unknown policy; use one of none, full, every_k, selective_op")
    assert "must be positive" in problems("train.activation_checkpointing=every_k",
                                          "train.activation_checkpointing_every=0")[0]
    found = problems("train.activation_checkpointing=selective_op", "parallelism.tp=2", "backend=ds_zero2",
                     "parallelism.nproc_per_node=2")
    assert found and found[0].startswith("train.activation_checkpointing=selective_op: not with parallelism.tp>1 "
                                         "under ds_zero2")
    assert not problems("train.activation_checkpointing=selective_op_half", "parallelism.tp=2", "backend=fsdp",
                        "parallelism.nproc_per_node=2")
    for value, policy in (("true", "full"), ("false", "none"), ("every_3", "every_k")):
        cfg = compose(["model=tiny_llama", f"train.activation_checkpointing={value}"])
        assert not rules.problems(cfg) and recompute_of(cfg).policy == policy
    assert recompute_of(compose(["model=tiny_llama", "model.num_layers=7",
                                 "train.activation_checkpointing=every_3"])).checkpointed_layers == (0, 3, 6)
    # scale-check's grid takes the same policies (and on/off), and refuses another before it traces a cell
    from harness.core.errors import ConfigError
    from harness.studies.predict.scale_check import policy_of

    assert (policy_of("on"), policy_of("off"), policy_of("selective_op_half")) == (True, False, "selective_op_half")
    with pytest.raises(ConfigError, match="checkpointing sometimes: not a policy"):
        policy_of("sometimes")


def test_the_kept_activations_order_as_the_policies_trade_memory_for_recompute():
    """On one shape, per micro-batch: none keeps every block, every_2 half of them, selective_op each block's
    matmul and attention outputs, full only the blocks' inputs; and every_k with k=1 is full. Against the
    measured peaks: tests/test_memory_check.py's activation-dominated cells."""
    cfg = compose(["model=llama_1b", "parallelism=gpu1", "train.precision=bf16"])
    saved = {}
    for label in POLICIES + ("every_1",):
        r = recompute_of(compose(["model=llama_1b", *recompute.overrides(label)]))
        a = activations.parts(cfg.model, cfg.parallelism, "16-bit", r)
        saved[label] = activations.kept_by_blocks(a)
    assert saved["none"] > saved["every_2"] > saved["selective_op"] > saved["selective_op_half"] > saved["full"] \
        == saved["every_1"]
    # every_2 on an even depth keeps half the blocks whole and half as their inputs
    r = Recompute("every_k", 2, cfg.model.num_layers)
    a = activations.parts(cfg.model, cfg.parallelism, "16-bit", r)
    assert saved["every_2"] == pytest.approx(cfg.model.num_layers / 2 * (a["block"] + a["block_input"]))


def test_the_time_model_recomputes_the_checkpointed_blocks_forward_only():
    """The roofline's backward: 2 forwards, plus the share of blocks recomputed whole (selective_op's recompute
    is elementwise, no matmul FLOPs)."""
    from harness.theory.shape import shape_of
    from harness.theory.time import CommTable, Rates, predict_parts

    rates = Rates(tflops=1.0, mem_gbps=100.0, comm=CommTable([], "cpu", 2))
    backward = {}
    for label in POLICIES:
        cfg = compose(["model=tiny_llama", "model.num_layers=4", *recompute.overrides(label)])
        counts = models.param_count(cfg.model, cfg.workload)
        backward[label] = predict_parts(cfg.backend, shape_of(cfg, 2, counts), 3e12, rates)["backward"]
    half = backward.pop("selective_op_half")
    assert backward == pytest.approx({"none": 2.0, "full": 3.0, "every_2": 2.5, "selective_op": 2.0})
    # selective_op_half recomputes k, o and up: their share of a block's forward, attention's products included
    assert 2.2 < half < 2.5, half


@pytest.mark.parametrize("policy", ["selective_op", "selective_op_half"])
@pytest.mark.parametrize("model_name", ["tiny_llama", "tiny_gpt2", "tiny_mixtral", "tiny_qwen3_moe", "tiny_qwen2_moe"])
def test_a_selectively_checkpointed_block_keeps_what_the_theory_counts(model_name, policy):
    """What one selectively checkpointed block keeps through forward, storage by storage: its input (the
    checkpoint's one saved tensor) and what the policy's cache holds (the saved matmuls' and attention's outputs),
    per token, is the theory's count within 1%. selective_op_half (torchtitan's) keeps every other matmul: on
    the GQA Llama q, v, gate and down, not k, o and up. A mixture of experts' block keeps its router's logits and
    its two grouped matmuls' outputs for each routed copy instead of the dense MLP's three (selective_op_half: q, v
    and the router's logits, every other mm as torchtitan counts them, and the grouped matmuls' outputs), with
    Qwen2-MoE's shared expert's three and its sigmoid gate's among the mm outputs, and its backward makes the
    gradients its uncheckpointed twin makes."""
    from harness.runtime.compiled.compiled_activations import _record_selective_caches, _tensors_in

    width = [] if "moe" in model_name or "mixtral" in model_name else ["model.intermediate_size=512"]
    cfg = compose([f"model={model_name}", *width, f"train.activation_checkpointing={policy}"])
    model = models.build(cfg.model)
    model.train()
    r = recompute_of(cfg)
    models.enable_activation_checkpointing(model, r)
    caches = _record_selective_caches(models.blocks(model))
    tokens, kept = 64, {}

    def pack(t):  # parameters are states, not activations; a storage kept twice is counted once
        if not isinstance(t, torch.nn.Parameter):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    block = models.blocks(model)[0]
    x = torch.randn(1, tokens, cfg.model.hidden_size, requires_grad=True)
    position = torch.arange(tokens)[None]
    extra = ({"position_embeddings": model.model.rotary_emb(x, position)} if cfg.model.family == "llama" else {})
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x, **extra)
    for tensor in _tensors_in(caches):
        pack(tensor)
    predicted = selective.selective_bytes_per_token(cfg.model, "fp32", r.matmul_stride)
    assert len(caches) == 1 and sum(kept.values()) / tokens == pytest.approx(predicted, rel=0.01), \
        (sum(kept.values()) / tokens, predicted)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert x.grad is not None
    if cfg.model.num_experts:  # the recompute routes as the forward did: the gradients of no checkpointing
        block.gradient_checkpointing = False
        again = x.detach().clone().requires_grad_(True)
        grads = [p.grad.clone() for p in block.parameters()]
        for p in block.parameters():
            p.grad = None
        plain = block(again, **extra)
        (plain[0] if isinstance(plain, tuple) else plain).sum().backward()
        torch.testing.assert_close(again.grad, x.grad)
        for p, g in zip(block.parameters(), grads):
            torch.testing.assert_close(p.grad, g)


def test_the_runs_settings_record_the_policy_that_ran():
    cfg = compose(["model=tiny_llama", "train.activation_checkpointing=every_2"])
    model = models.build(cfg.model)
    applied = models.enable_activation_checkpointing(model, recompute_of(cfg))
    assert applied["policy"] == "every_k" and applied["checkpointed_blocks"] == [0]
    assert "GradientCheckpointingLayer" in applied["applied_by"] and not applied["saved_ops"]
    assert OmegaConf.select(cfg, "train.activation_checkpointing_every") == 2


@pytest.mark.slow
def test_a_checkpointed_run_has_the_losses_of_its_uncheckpointed_run_step_for_step(bf16_runs, policy_runs):
    """Real ranks, tiny_gpt2 in bf16 (the bf16 sweep's cells): full under FSDP2 and ZeRO-3, selective_op under
    DDP's autocast and FSDP2, each against the same backend's run without checkpointing. The axes table
    (harness/studies/axes/table.py) reads the same run dirs: the only axis that differs is the policy, within its
    tolerance, and the settings record the policy that ran."""
    from harness.studies.axes import rows as axes

    for policy, runs in policy_runs.items():
        assert set(runs) == ({"fsdp", "ds_zero3"} if policy == "full" else {"ddp", "fsdp"}), (policy, set(runs))
        for backend, (summary, records, run_dir) in runs.items():
            assert summary["status"] == "ok", (policy, backend, summary.get("reason"))
            base = [r["loss/loss"] for r in bf16_runs[backend][1]]
            mine = [r["loss/loss"] for r in records]
            assert len(mine) == len(base) >= 4 and max(abs(a - b) / b for a, b in zip(mine, base)) <= 1e-6, \
                (policy, backend, mine, base)
            rows = axes.rows_of([bf16_runs[backend][2], run_dir])
            assert [(r["checkpointing"], r["differs"], r["within"]) for r in rows] == [
                ("none", [], True), (policy, ["checkpointing"], True)], rows
            assert rows[1]["loss_difference"] <= axes.TOLERANCE["checkpointing"]["bf16"]
            assert f"| {backend} | {policy} | off | none | ok |" in axes.render(rows, "t", "c")

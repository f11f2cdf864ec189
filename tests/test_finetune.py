"""Fine-tuning: a pretrained checkpoint loads on every construction path, and LoRA trains under every backend.

Two sweeps share one checkpoint (conftest.llama_checkpoint) and one shape (3 ranks, grad_accum 2, fp32,
parity): the fp32 sweep trains every parameter with FSDP2 on the meta device and ZeRO-3 under zero.Init; the
LoRA sweep trains peft's adapters over the frozen checkpoint, every backend built on the host.
"""
from __future__ import annotations

import json

import pytest
import torch

from conftest import BACKENDS
from harness.config import rules
from harness.config.compose import compose
from harness.runtime import initial_weights, models
from harness.runtime.measure import probes
from harness.runtime.pretrained import Checkpoint
from test_memory_model import _measured_vs_predicted
from test_parity import assert_losses_match


def lora_params(cfg) -> int:
    """peft's default LoRA on a Llama: rank-r A (r x in) and B (out x r) on q_proj (h -> h) and v_proj
    (h -> h_kv) of every layer."""
    m, r = cfg.model, 8
    h_kv = m.hidden_size * m.num_kv_heads // m.num_heads
    return m.num_layers * r * ((m.hidden_size + m.hidden_size) + (m.hidden_size + h_kv))


@pytest.mark.slow
def test_the_checkpoint_gives_one_first_loss_on_every_path_with_or_without_adapters(fp32_runs, lora_runs):
    # the same checkpoint, the same data: meta + FSDP2, zero.Init and host builds, full or LoRA (B starts at
    # zero, so the adapted model is its base) must all see the same first loss
    first = {(sweep, b): runs[b][1][0]["loss/loss"] for sweep, runs in (("full", fp32_runs), ("lora", lora_runs))
             for b in BACKENDS}
    reference = first[("full", "ddp")]
    assert all(v == pytest.approx(reference, rel=1e-4) for v in first.values()), first
    assert {s["model_init"] for s, _, _ in lora_runs.values()} == {"host"}
    for runs in (fp32_runs, lora_runs):
        for backend, (summary, _, run_dir) in runs.items():
            # the load-time cost is reported per rank: what building, wrapping and loading added to the host
            assert summary["figures"]["memory/load_host_added_bytes_max"] > 0, backend
            ran = json.loads((run_dir / "settings.json").read_text())["workload"]
            assert ran["pretrained_path"] and ran["name"] in ("full", "lora")


@pytest.mark.slow
def test_lora_losses_match_ddp_and_only_the_adapters_train(lora_runs, fp32_runs):
    assert_losses_match(lora_runs, rel=1e-4)
    full = [r["loss/loss"] for r in fp32_runs["ddp"][1]]
    lora = [r["loss/loss"] for r in lora_runs["ddp"][1]]
    assert lora[1:] != pytest.approx(full[1:], rel=1e-3), "LoRA must not train the base"
    cfg = compose(["model=tiny_llama", "workload=lora"])
    settings = lora_runs["ddp"][0]["settings"]["workload"]
    assert settings["target_modules"] == ["q_proj", "v_proj"] and settings["r"] == 8
    assert lora_runs["ddp"][0]["figures"]["model/trainable_params"] == lora_params(cfg)


def test_lora_flops_skip_the_frozen_weight_gradients():
    # backward computes no gradient for a frozen weight: FlopCounterMode counts fewer FLOPs per token, and the
    # formula, with 2T instead of 2N for the weight gradients, follows it as it follows full training
    cfg = compose(["model=tiny_llama", "workload=lora"])
    counts = models.param_count(cfg.model, cfg.workload)
    m, seq = cfg.model, cfg.parallelism.seq_len
    full = probes.count_flops_per_token(m, seq)
    lora = probes.count_flops_per_token(m, seq, cfg.workload)
    assert lora < 0.8 * full and counts["trainable"] == lora_params(cfg)
    formula = probes.formula_flops_per_token(counts["total"], counts["embedding"], m.num_layers, m.hidden_size, seq,
                                             counts["trainable"])
    assert formula == pytest.approx(lora, rel=0.10)


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_lora_model_states_match_the_frozen_base_layout(lora_runs, name):
    # parameters at the backend's dtype for the whole model; gradients, masters and Adam only for the adapters
    # (under FSDP1, a gradient for the whole flat slice of each unit that holds an adapter, and AdamW's states on
    # the ranks whose slices hold them: uneven, the theory the most-loaded rank's)
    _measured_vs_predicted(lora_runs, name, uneven=name.startswith("fsdp1"))
    f = lora_runs[name][0]["figures"]
    grads = f.get("memory/model_states_grads_bytes_max", 0) + f.get("memory/model_states_host_grads_bytes_max", 0)
    params = f.get("memory/model_states_params_bytes_max", 0) + f.get("memory/model_states_host_params_bytes_max", 0)
    # FSDP1 gives each unit that holds an adapter a gradient for its whole flat slice: the blocks', not the root's
    assert 0 < grads < (params if name.startswith("fsdp1") else 0.1 * params), (grads, params)


def _tiny_gpt2(tmp_path, shard_bytes=200_000):
    """A tied model (lm_head is the embedding) saved by save_pretrained (in 3 shards by default), and its state."""
    cfg = compose(["model=tiny_gpt2"])
    torch.manual_seed(1)
    source = models.build(cfg.model)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_()  # nothing like a seeded init: a load that fell back to it would show
    source.save_pretrained(tmp_path, max_shard_size=shard_bytes)
    return cfg, {k: v.clone() for k, v in source.state_dict().items()}


@pytest.mark.parametrize("shard_bytes, index", [(200_000, True), (10**9, False)])
def test_a_tied_checkpoint_loads_exactly_sharded_or_not_with_and_without_adapters(tmp_path, shard_bytes, index):
    cfg, state = _tiny_gpt2(tmp_path, shard_bytes)
    assert (tmp_path / "model.safetensors.index.json").is_file() == index
    plain = models.build(cfg.model)
    initial_weights.apply(plain, seed=0, checkpoint=Checkpoint(tmp_path))
    assert plain.lm_head.weight is plain.transformer.wte.weight
    for key, value in plain.state_dict().items():
        if key in state:
            assert torch.equal(value, state[key]), key
    lora_cfg = compose(["model=tiny_gpt2", "workload=lora"])
    adapted = models.build(lora_cfg.model, workload=lora_cfg.workload)
    initial_weights.apply(adapted, seed=0, checkpoint=Checkpoint(tmp_path))
    loaded = {models.base_name(k): v for k, v in adapted.state_dict().items()}
    for key, value in state.items():
        if key in loaded:
            assert torch.equal(loaded[key], value), key
    adapters = {k: v for k, v in adapted.named_parameters() if v.requires_grad}
    assert adapters and all(".lora_" in k for k in adapters)
    assert all(not v.any() for k, v in adapters.items() if ".lora_B." in k)  # the adapted model is its base
    assert all(v.abs().sum() > 0 for k, v in adapters.items() if ".lora_A." in k)


def test_estimate_counts_the_frozen_base_apart_from_the_adapters():
    from harness.studies.predict.rows import rows

    cfg = compose(["model=tiny_llama", "workload=lora"])
    counts = models.param_count(cfg.model, cfg.workload)
    psi, t = counts["total"], counts["trainable"]
    by_backend = {r["backend"]: r for r in rows(["model=tiny_llama", "workload=lora"])}
    # DDP: fp32 parameters for all of it (adapters included), fp32 gradients and Adam's m and v for the adapters
    assert by_backend["ddp"]["device_bytes"] == 4 * psi + 12 * t
    assert by_backend["fsdp"]["device_bytes"] == pytest.approx((4 * psi + 12 * t) / 2)
    assert by_backend["ds_zero2"]["framework_estimate_gpu_bytes"] is None  # its estimator trains every parameter


@pytest.mark.parametrize("overrides, says", [
    (["workload=lora", "workload.lora_targets=[q_proj,nope]"], "nope is not a linear layer of a llama model"),
    (["workload=lora", "workload.lora_rank=0"], "workload.lora_rank=0"),
    (["workload.lora_rank=16"], "only workload=lora has adapters"),
])
def test_a_lora_the_model_cannot_take_is_refused_in_one_line(overrides, says):
    found = rules.problems(compose(["model=tiny_llama", *overrides]), lambda: 0)
    assert len(found) == 1 and says in found[0], found


def test_a_checkpoint_of_another_shape_is_refused_before_any_rank_starts(tmp_path):
    _tiny_gpt2(tmp_path)
    assert rules.problems(compose(["model=tiny_gpt2", f"model.pretrained_path={tmp_path}"]), lambda: 0) == []
    for overrides, says in ((["model=tiny_llama"], "a gpt2 checkpoint"), (["model=tiny_gpt2", "model.hidden_size=128"],
                            "its n_embd is 64"), (["model.pretrained_path=/nonexistent"], "no config.json")):
        cfg = compose([f"model.pretrained_path={tmp_path}", *overrides])
        found = rules.problems(cfg, lambda: 0)
        assert len(found) == 1 and says in found[0] and "\n" not in found[0], found


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gpt2"])
def test_adding_the_adapters_prints_no_framework_warning(model):
    # peft warned of GPT-2's Conv1D fan_in_fan_out and read transformers' deprecated is_gradient_checkpointing:
    # lines in every LoRA estimate and advise that the user could do nothing about
    import warnings

    cfg = compose([f"model={model}", "workload=lora"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models.build(cfg.model, device="meta", workload=cfg.workload)
    assert not [str(w.message) for w in caught if "peft" in w.filename or "transformers" in w.filename], \
        [f"{w.filename}: {w.message}" for w in caught]

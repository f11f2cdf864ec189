"""The two settings profiles (config/profiles.py): native is each framework's own defaults, parity the settings
the exact-accounting tests use. Every run records what really ran; docs/strategies.md lists every difference.

The fp32 sweep runs parity and the bf16 sweep native (conftest), so these read settings back from both."""
from __future__ import annotations

import json

import pytest

from conftest import REPO
from harness.config import profiles
from harness.config.compose import compose
from harness.backends.deepspeed.json_config import ds_config

TUNING_KEYS = {"overlap_comm", "reduce_bucket_size", "allgather_bucket_size", "stage3_param_persistence_threshold",
               "stage3_prefetch_bucket_size", "contiguous_gradients"}


def test_the_docs_table_lists_every_difference():
    readme = (REPO / "docs" / "strategies.md").read_text()
    for d in profiles.differences():
        row = f"| {d.family} | {d.setting} | {d.native} | {d.parity} | {d.source} |"
        assert row in readme, f"docs/strategies.md lacks: {row}"


@pytest.mark.parametrize("backend", ["ds_zero1", "ds_zero2", "ds_zero3", "ds_zero3_offload"])
def test_native_passes_deepspeed_no_tuning_key_and_parity_passes_its_own(backend):
    native = ds_config(compose([f"backend={backend}", "train.precision=bf16"]), 2, 10_000)
    assert not TUNING_KEYS & set(native["zero_optimization"]) and "data_types" not in native
    parity = ds_config(compose([f"backend={backend}", "train.precision=bf16", "profile=parity"]), 2, 10_000)
    assert parity["zero_optimization"]["overlap_comm"] is False
    assert parity["data_types"] == {"grad_accum_dtype": "fp32"}
    assert (parity["zero_optimization"].get("stage3_param_persistence_threshold") == 0) == (backend.startswith("ds_zero3"))


@pytest.mark.slow
def test_every_run_records_the_settings_that_ran(fp32_runs, bf16_runs):
    for runs, profile in ((fp32_runs, "parity"), (bf16_runs, "native")):
        for backend, (summary, _, run_dir) in runs.items():
            settings = json.loads((run_dir / "settings.json").read_text())
            assert summary["profile"] == profile and summary["settings"] == settings
            assert settings["profile"] == profile and settings["construction"] == summary["model_init"]
    # DDP as DDP holds it: its default 25 MiB bucket, or one bucket of the model's size for parity
    ddp_native = json.loads((bf16_runs["ddp"][2] / "settings.json").read_text())["ddp"]
    assert ddp_native["bucket_bytes_cap"] == 25 * 2**20 and ddp_native["gradient_as_bucket_view"] is False
    ddp_parity = json.loads((fp32_runs["ddp"][2] / "settings.json").read_text())["ddp"]
    assert ddp_parity["bucket_bytes_cap"] == 4 * fp32_runs["ddp"][0]["params"] and ddp_parity["gradient_as_bucket_view"]
    # FSDP2: native leaves the root to FSDP2's default; parity reshards it like the blocks
    assert bf16_runs["fsdp"][0]["settings"]["fsdp"]["root_reshard_after_forward"] is None
    assert fp32_runs["fsdp"][0]["settings"]["fsdp"]["root_reshard_after_forward"] is True
    # DeepSpeed: the JSON it got, and its own reading of it. Native ZeRO-3 overlaps communication (DeepSpeed's
    # default for stage 3) and ZeRO-1 in bf16 is DeepSpeed's ZeRO optimizer; parity turns overlap off and its
    # fp32 accumulation makes ZeRO-1 a BF16_Optimizer (not in this fp32 sweep: ZeRO-1 there is the ZeRO optimizer).
    native3 = bf16_runs["ds_zero3"][0]["settings"]["deepspeed"]
    assert native3["zero_optimization"]["overlap_comm"] is True
    assert native3["zero_optimization"]["param_persistence_threshold"] == 100_000
    assert fp32_runs["ds_zero3"][0]["settings"]["deepspeed"]["zero_optimization"]["overlap_comm"] is False
    assert bf16_runs["ds_zero1"][0]["settings"]["deepspeed"]["optimizer_wrapper"] == "DeepSpeedZeroOptimizer"


@pytest.mark.slow
def test_native_zero3_keeps_small_parameters_whole_on_every_rank(bf16_runs):
    # every tensor of tiny_gpt2 is under DeepSpeed's default persistence threshold (1e5 elements), so each
    # rank keeps all of them whole, in bf16, beside its shard: 2Ψ + 2Ψ/N bytes, where parity would hold 2Ψ/N
    summary = bf16_runs["ds_zero3"][0]
    psi, n = summary["params"], summary["world_size"]
    for rank in summary["per_rank"]:
        assert rank["model_states"]["params"] == pytest.approx(2 * psi + 2 * psi / n, rel=0.01)
    assert summary["figures"]["memory/model_states_params_predicted_bytes"] == pytest.approx(2 * psi + 2 * psi / n)

"""Sharding really happens: measured from the tensors each rank holds, not read from the config."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def per_rank(runs, backend):
    summary = runs[backend][0]
    assert summary["status"] == "ok", summary.get("reason")
    return summary, [r["model_states"] for r in summary["per_rank"]]


def test_ddp_holds_everything_on_every_rank(fp32_runs):
    summary, ranks = per_rank(fp32_runs, "ddp")
    full = 4 * summary["params"]  # fp32
    for states in ranks:
        assert states["params"] == full and states["grads"] == full
        assert states["optimizer"] == pytest.approx(2 * full, rel=0.01)  # exp_avg + exp_avg_sq (+ step)


@pytest.mark.parametrize("backend", ["fsdp", "fsdp_grad_op", "ds_zero3", "ds_zero3_offload"])
def test_parameters_are_sharded(fp32_runs, backend):
    summary, ranks = per_rank(fp32_runs, backend)
    full = 4 * summary["params"]
    for states in ranks:
        held = states.get("params", 0) + states.get("host_params", 0)
        assert held == pytest.approx(full / summary["world_size"], rel=0.05), f"{backend} holds {held} of {full}"


@pytest.mark.parametrize("backend", ["ds_zero1", "ds_zero2", "ds_zero2_offload", "fsdp", "ds_zero3"])
def test_optimizer_state_is_sharded(fp32_runs, backend):
    summary, ranks = per_rank(fp32_runs, backend)
    full = 8 * summary["params"]  # Adam: two fp32 moments
    for states in ranks:
        held = states.get("optimizer", 0) + states.get("host_optimizer", 0)
        assert held == pytest.approx(full / summary["world_size"], rel=0.05), f"{backend} holds {held} of {full}"


def test_offload_puts_optimizer_state_on_the_host(fp32_runs):
    _, ranks = per_rank(fp32_runs, "ds_zero2_offload")
    assert all(s.get("host_optimizer", 0) > 0 and s.get("optimizer", 0) == 0 for s in ranks)
    _, ranks = per_rank(fp32_runs, "ds_zero3_offload")
    assert all(s.get("host_params", 0) > 0 and s.get("params", 0) == 0 for s in ranks)

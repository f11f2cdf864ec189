"""Large models need not be materialised whole on every rank: FSDP builds on the meta device and
materialises only its shards; ZeRO-3 partitions parameters as they are constructed (deepspeed.zero.Init)."""
from __future__ import annotations

import json

import pytest

from conftest import FAST, cli

pytestmark = pytest.mark.slow


def test_meta_device_and_zero_init_runs_train(tmp_path):
    proc = cli("-m", "backend=fsdp,ds_zero3", "model.init=meta", f"paths.root={tmp_path}", "sweep.name=meta", *FAST)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "sweeps" / "meta").glob("*/summary.json")]
    assert sorted(s["backend"] for s in summaries) == ["ds_zero3", "fsdp"]
    for s in summaries:
        assert s["status"] == "ok" and s["model_init"] == "meta", s.get("reason")
        losses = s["figures"]["loss/first_loss"], s["figures"]["loss/final_loss"]
        assert 4.0 < losses[0] < 6.5 and losses[1] < losses[0]  # random init near ln(256)=5.5, then learning
        # each rank holds exactly what the layout predicts for fp32 (half the weights, all of them fp32):
        # this caught zero.Init building bf16 weights for an fp32 run
        predicted = s["figures"]["memory/model_states_params_predicted_bytes"]
        assert predicted == 4 * s["params"] / 2
        for rank in s["per_rank"]:
            assert rank["model_states"]["params"] == pytest.approx(predicted, rel=0.05)

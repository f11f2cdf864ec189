"""A run predicted past the machine's memory is refused before anything is allocated (runtime/preflight.py),
in one line that gives the prediction and what the machine has; a run that fits is not."""
from __future__ import annotations

import time

import psutil
import pytest

from conftest import cli

from harness.config.compose import compose
from harness.runtime import models, preflight
from harness.runtime.errors import MemoryBudgetExceeded
from harness.theory.predict import predict

# the example: tiny_llama at 100,000 sequences a micro-batch, ~90 GB a rank by shardbench estimate
TOO_BIG = ["parallelism.micro_batch=100000"]


def test_the_prediction_against_the_host_decides_and_the_reason_gives_both_figures(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cfg = compose(TOO_BIG)
    counts = models.param_count(cfg.model, cfg.workload)
    per_rank = predict(cfg, 2, counts)["memory/tensor_peak_predicted_bytes"]
    assert 2 * per_rank > psutil.virtual_memory().total  # past this host, whatever else runs
    with pytest.raises(MemoryBudgetExceeded) as refused:
        preflight.refuse_what_cannot_fit(cfg, counts)
    reason = str(refused.value)
    assert "\n" not in reason and f"{per_rank / 2**30:,.2f} GiB per rank x 2 ranks" in reason
    assert "host's available memory" in reason and "train.refuse_predicted_oom=false" in reason
    preflight.refuse_what_cannot_fit(compose([]), counts)  # the default run fits: nothing raised
    preflight.refuse_what_cannot_fit(compose([*TOO_BIG, "train.refuse_predicted_oom=false"]), counts)


def test_the_shortfall_counts_every_rank_of_the_node():
    assert preflight.shortfall(1.0 * 2**30, 2, 2.5 * 2**30, "here") is None
    said = preflight.shortfall(1.5 * 2**30, 2, 2.5 * 2**30, "here")
    assert said.startswith("refused before training: predicted peak 1.50 GiB per rank x 2 ranks = 3.00 GiB, "
                           "over here (2.50 GiB)")


@pytest.mark.drill  # a real launch and its ranks (7 s): make test-drills and CI; the decision is tested above
def test_a_run_past_the_host_ends_as_oom_in_seconds_without_growing(tmp_path):
    started = time.monotonic()
    proc = cli(*TOO_BIG, f"paths.root={tmp_path}", "logger=none", timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("[oom]")]
    assert line and "refused before training: predicted peak" in line[0], proc.stdout
    assert took < 30  # imports and a meta-device build; the run grew to 11.8 GB in 30 s

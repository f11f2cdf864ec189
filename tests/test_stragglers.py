"""A straggler is named: the rank whose busy time (its step less the time it sat in collectives) exceeds the other
ranks' median by over 25%, and what the others spend waiting on it. In-process on synthetic breakdowns, and once
on a real 2-rank run where fault.kind=slow makes rank 1 work 30 ms more in every step (a drill)."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO
from harness.core.records import RankReport
from harness.reporting.time_and_comm import stragglers, time_notes
from harness.core.spawn import train_command


def rank(r: int, step: float, waiting: float) -> RankReport:
    return RankReport(rank=r, records=[], timed_step_s=[step], model_states={}, unclassified={}, host_peak_bytes=0,
                      host_peak_reset=False, device={}, after_setup={}, peak_tflops=1.0, peak_source="x",
                      optimizer="AdamW", init="host", params={},
                      time_breakdown={"step": step, "comm_exposed": waiting})


def test_the_busiest_rank_is_named_only_past_the_margin_with_what_the_others_wait():
    # four ranks in step together (40 ms): three work 10 ms and wait 30; rank 2 works 38 and waits 2
    figures = stragglers([rank(0, 0.040, 0.030), rank(1, 0.040, 0.030), rank(2, 0.040, 0.002), rank(3, 0.040, 0.030)])
    assert figures["time/straggler_rank"] == 2 and figures["time/waiting_on_straggler_s"] == pytest.approx(0.028)
    assert figures["time/straggler_busy_excess_pct"] == pytest.approx(280)
    (note,) = [n for n in time_notes(figures) if "straggler" in n]
    assert note.startswith("time: rank 2 is a straggler: it works 38.0 ms a step, 280% over") and "wait 28.0 ms" in note
    # a rank 20% busier than the others is ordinary variation, not a straggler
    assert stragglers([rank(0, 0.040, 0.028), rank(1, 0.040, 0.0256)]) == {}
    assert stragglers([rank(0, 0.040, 0.030)]) == {}  # one rank waits on nobody


@pytest.mark.slow
@pytest.mark.drill
def test_a_slow_rank_is_named_in_a_real_run_with_the_wait_it_costs_the_others(tmp_path):
    run_dir = tmp_path / "slow"
    proc = subprocess.run(train_command("backend=ddp", "logger=none", "train.steps=12", "fault.kind=slow",
                                        "fault.rank=1", "fault.step=0", "fault.slow_s=0.03", run_dir=run_dir),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-1500:]
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = summary["figures"]
    assert figures["time/straggler_rank"] == 1
    assert 0.6 * 0.03 < figures["time/waiting_on_straggler_s"] < 1.4 * 0.03, figures["time/waiting_on_straggler_s"]
    assert any(n.startswith("time: rank 1 is a straggler") for n in summary["notes"]), summary["notes"]

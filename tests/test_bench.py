"""make bench's statistics: the median paired ratio is read against a bootstrap interval, and the verdict says
whether the whole interval lies under the target, over it, or spans it (harness/studies/bench/overhead.py)."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from harness.studies.bench.overhead import paired_interval, verdict


def test_the_launch_interval_widens_when_launches_disagree_though_each_launchs_pairs_agree():
    # make bench's pairs share a launch's process and cores: two launches whose pairs agree within themselves
    # but not with each other must not read as a tight interval (a bootstrap over the pairs alone would)
    from harness.studies.bench.overhead import launch_interval

    launches = [0.99, 1.0, 1.01, 1.02]  # four launches, each of 8 pairs within 0.002 of its own level
    spread = [-0.003, -0.002, -0.001, 0.0, 0.0005, 0.001, 0.002, 0.003]
    apart = [[level + d for d in spread] for level in launches]
    low, high = launch_interval(apart)
    flat_low, flat_high = paired_interval([r for launch in apart for r in launch])
    assert low < 0.995 and high > 1.015 and (high - low) > 2 * (flat_high - flat_low), (low, high, flat_low, flat_high)
    together = [[1.01 + d for d in spread] for _ in launches]  # launches that agree: as tight as the pairs
    low, high = launch_interval(together)
    assert 1.007 <= low <= 1.01 <= high <= 1.013 and launch_interval(together) == (low, high)  # seeded


def test_the_interval_holds_the_median_and_narrows_as_the_pairs_agree():
    noisy = [0.78, 1.21, 0.95, 1.10, 0.88, 1.04, 1.15, 0.92]  # the spread single repeats showed here
    low, high = paired_interval(noisy)
    assert low <= statistics.median(noisy) <= high and paired_interval(noisy) == (low, high)  # seeded
    tight = [1.01, 1.02, 1.015, 1.012, 1.018, 1.011, 1.02, 1.016]
    t_low, t_high = paired_interval(tight)
    assert t_high - t_low < (high - low) / 10 and 1.01 <= t_low <= t_high <= 1.02
    assert verdict({"interval_95": [low, high]}, 1.03).endswith("it contains 1")
    assert verdict({"interval_95": [t_low, t_high]}, 1.03).startswith("within")
    assert verdict({"interval_95": [1.04, 1.09]}, 1.03).startswith("over")


def test_the_yardstick_shares_no_code_with_the_harness():
    # make bench compares the harness against a loop a user would write: whatever the two shared, the
    # comparison could not show (the old yardstick built the model and set FSDP up with the harness's code)
    import ast
    from pathlib import Path

    import harness.studies.bench.independent_loop as loop

    tree = ast.parse(Path(loop.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.startswith(".") or m.startswith("harness")], imported


def test_the_yardstick_trains_what_the_harness_run_resolved():
    from harness.config.compose import compose
    from harness.runtime import models
    from harness.studies.bench.overhead import DEFAULTS, spec_of
    from transformers import LlamaConfig

    cfg = compose(["backend=fsdp", *DEFAULTS])
    spec = spec_of(cfg, "fsdp")
    assert (spec["micro_batch"], spec["seq_len"], spec["precision"]) == (4, 128, "fp32")
    ours, theirs = models.hf_config(cfg.model).to_dict(), LlamaConfig(**spec["model"]).to_dict()
    differ = {k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    assert not differ - {"transformers_version", "_attn_implementation_autoset"}, differ


@pytest.mark.drill  # a launch of 2 pairs (~25 s): make test-drills and CI
def test_a_paired_launch_trains_both_loops_in_the_same_ranks_in_alternating_order(tmp_path):
    """make bench's default design (studies/bench/worker.py): one launch a backend, each pair a harness run (a
    cell, with its own metrics) and the independent loop in the same ranks, the order alternating; each side's
    timed steps after the same warm-up, both loops training from an untrained model (loss near ln(vocab))."""
    import json
    import math

    from harness.studies.bench.overhead import pairs_in_one_launch, row_of_launches

    launch = pairs_in_one_launch("ddp", ["model=tiny_llama", "train.steps=6", "train.warmup_steps=2"], 2, tmp_path)
    assert [len(s) for s in launch["harness"] + launch["independent"]] == [4] * 4 and not launch["retries"], launch
    row = row_of_launches("ddp", [launch, launch])
    assert row["design"] == "2 launches" and len(row["ratio_per_pair"]) == 4, row
    assert 0.5 < row["ratio"] < 2 and row["interval_95"][0] <= row["ratio"] <= row["interval_95"][1], row
    pairs = json.loads((tmp_path / "attempt0" / "plan.json").read_text())["pairs"]
    assert [p["order"] for p in pairs] == [["harness", "independent"], ["independent", "harness"]]
    for pair in pairs:
        harness_losses = [json.loads(line)["loss/loss"] for line in
                          (Path(pair["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        independent_losses = json.loads(Path(pair["out"]).read_text())["loss"]
        assert len(harness_losses) == len(independent_losses) == 6
        for first in (harness_losses[0], independent_losses[0]):
            assert abs(first - math.log(256)) < 0.5, (harness_losses, independent_losses)


@pytest.mark.parametrize("flag", ["--launches", "--pairs", "--profile-steps"])
def test_a_count_below_one_is_refused_in_one_line(flag, capsys):
    from harness.studies.bench.overhead import main

    with pytest.raises(SystemExit) as end:
        main([flag, "0"])
    err = capsys.readouterr().err.strip()
    assert end.value.code == 2 and err == f"bench: invalid input: {flag}=0: must be at least 1", err

"""make bench's statistics: the median paired ratio is read against a bootstrap interval, and the verdict says
whether the whole interval lies under the target, over it, or spans it (harness/studies/bench.py)."""
from __future__ import annotations

import statistics

from harness.studies.bench import paired_interval, verdict


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

    import harness.studies.independent_loop as loop

    tree = ast.parse(Path(loop.__file__).read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.startswith(".") or m.startswith("harness")], imported


def test_the_yardstick_trains_what_the_harness_run_resolved():
    from harness.config.compose import compose
    from harness.runtime import models
    from harness.studies.bench import DEFAULTS, spec_of
    from transformers import LlamaConfig

    cfg = compose(["backend=fsdp", *DEFAULTS])
    spec = spec_of(cfg, "fsdp")
    assert (spec["micro_batch"], spec["seq_len"], spec["precision"]) == (4, 128, "fp32")
    ours, theirs = models.hf_config(cfg.model).to_dict(), LlamaConfig(**spec["model"]).to_dict()
    differ = {k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
    assert not differ - {"transformers_version", "_attn_implementation_autoset"}, differ

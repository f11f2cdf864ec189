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

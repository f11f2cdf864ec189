"""The GPU review (studies/gpu/review.py, queue.py), on CPU: the queue's order and commands, the skipping of what is
settled for this code on this device, the budget, and the record a call leaves as it goes. The checks' real runs
need a lent GPU; here the loop runs real commands of the table that need none."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import REPO

from harness.studies.gpu import review
from harness.studies.gpu.queue import QUEUE, Check, code_version, plan


def test_the_queue_holds_the_issues_order_and_every_command_checks(monkeypatch, capsys):
    """Axes first, then the seeds' headline capacity, the bench pair, the time model, the CUDA-only parts; every
    check a command of the table whose line passes its own check (train's: the rules, on a one-GPU machine)."""
    from harness import commands
    from harness.config import overrides, rules
    from harness.config.command_line import CHECK_ONLY
    from harness.config.compose import compose

    names = [c.name for c in QUEUE]
    assert names[:5] == ["axes", "capacity-headline", "capacity-rest", "bench-mb2", "time-model"]
    assert {"zeropp-quantized", "cuda-only-offload"} <= set(names) and len(set(names)) == len(names)
    for check in QUEUE:
        words = [w.replace("{budget_s}", "300").replace("{device}", "nvidia-h200") for w in check.command]
        assert words[0] in commands.COMMANDS, check.name
        assert check.estimate_s > 0 and check.estimate_source and check.settles
        if words[0] == "train":
            assert overrides.problem(words[1:]) is None, check.name
            assert rules.problems(compose(words[1:]), lambda: 1) == [], check.name
            continue
        monkeypatch.setenv(CHECK_ONLY, "1")
        assert commands.main(words) == 0, (check.name, capsys.readouterr())


def test_settled_checks_are_skipped_and_none_starts_past_the_budget():
    a, b, c, d = (Check(n, "claim", ("estimate",), s, "stated") for n, s in (("a", 100), ("b", 300), ("c", 400),
                                                                            ("d", 50)))
    queue = [a, b, c, d]
    fresh = plan(queue, {}, "v1", budget_s=500)
    # c (400 s) would end at 800: left for the next call; d (50 s) still fits after it
    assert [x.name for x in fresh.run] == ["a", "b", "d"] and [x.name for x in fresh.over_budget] == ["c"]
    record = {"a": {"status": "ok", "code": "v1", "seconds": 90.0}, "b": {"status": "failed", "code": "v1"},
              "c": {"status": "timeout", "code": "v1", "seconds": 20.0}, "d": {"status": "ok", "code": "v0"}}
    again = plan(queue, record, "v1", budget_s=500)
    # a finished and b failed on this code: settled; c was cut by a budget, so it runs again, at its measured 20 s;
    # d finished on other code: it runs again
    assert [x.name for x in again.settled] == ["a", "b"] and [x.name for x in again.run] == ["c", "d"]
    assert [x.name for x in plan(queue, record, "v1", 500, retry=True).run] == ["a", "b", "c", "d"]  # 460 s
    assert [x.name for x in plan(queue, record, "v1", 500, spent_s=480).run] == ["c"]  # set-up counts
    assert [x.name for x in plan(queue, {}, "v1", 1000, only=["d", "a"]).run] == ["a", "d"]  # the queue's order


def test_the_code_version_follows_the_code_not_git(tmp_path):
    for d in ("harness", "conf"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.py").write_text("x = 1\n")
    first = code_version(tmp_path)
    (tmp_path / "README.md").write_text("not code")
    assert code_version(tmp_path) == first
    (tmp_path / "conf" / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) != first and len(first) == 16
    assert code_version() == code_version(REPO)


def test_a_call_records_each_check_as_it_ends_and_the_next_goes_on(tmp_path):
    """Real commands of the table in processes of their own: the record after each, a check the budget stops
    marked `timeout` (not settled), the second call skipping what the first settled."""
    queue = [Check("help", "claim", ("estimate", "--help"), 1, "stated"),
             Check("slow", "claim", ("estimate", "model=tiny_llama"), 0.1, "stated"),  # torch's import alone: > 1 s
             Check("never", "claim", ("estimate", "--help"), 10_000, "stated")]
    device_dir = tmp_path / "nvidia-test"
    record = review.review(queue, device_dir, "nvidia-test", "v1", budget_s=3, started=time.time())
    assert record["help"]["status"] == "ok" and record["help"]["code"] == "v1"
    assert record["slow"]["status"] == "timeout" and "never" not in record  # stopped at the budget; never started
    saved = json.loads((device_dir / "review.json").read_text())["checks"]
    assert saved.keys() == record.keys() and "| help |" in (device_dir / "review.md").read_text()
    again = review.review(queue[:2], device_dir, "nvidia-test", "v1", budget_s=0.5, started=time.time())
    assert again["help"] == record["help"]  # settled: not run again
    assert again["slow"]["status"] == "timeout" and again["slow"]["finished"] >= record["slow"]["finished"]


def test_the_dry_run_prints_the_queue_and_what_is_settled(tmp_path):
    """`python -m harness gpu-review --dry-run`, as a user runs it on CPU."""
    device = tmp_path / "nvidia-h200"
    device.mkdir()
    (device / "review.json").write_text(json.dumps({"checks": {
        "axes": {"status": "ok", "code": code_version(), "seconds": 470.0, "finished": "2026-11-28 12:00"}}}))
    proc = subprocess.run([sys.executable, "-m", "harness", "gpu-review", "--dry-run", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "nvidia-h200" in lines[0] and "budget 540 s" in lines[0]
    assert any(line.split()[:1] == ["axes"] and "settled (ok" in line for line in lines)
    assert any(line.split()[:1] == ["capacity-headline"] and "would run, ending by 450 s" in line for line in lines)
    assert any(line.split()[:1] == ["capacity-rest"] and "left for the next call" in line for line in lines)
    refused = subprocess.run([sys.executable, "-m", "harness", "gpu-review", "--only", "axis"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.startswith("gpu-review: invalid input: --only: no check axis;")

"""Bad input through the real CLI: one clear line, a non-zero exit, no traceback, and no rank started."""
from __future__ import annotations

import pytest

from conftest import cli


@pytest.mark.parametrize("overrides, says", [
    (["backend=nope"], "backend/nope"),
    (["model=gpt5"], "model/gpt5"),
    (["train.precision=fp16"], "train.precision=fp16"),
    (["parallelism.nproc_per_node=64"], "parallelism.nproc_per_node=64"),
    (["parallelism.seq_len=100000"], "parallelism.seq_len=100000"),
    (["train.steps=0"], "train.steps=0"),
])
def test_bad_input_fails_before_any_rank_starts(tmp_path, overrides, says):
    proc = cli(*overrides, f"paths.root={tmp_path}", "logger=none", timeout=120)
    assert proc.returncode != 0
    assert says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    # no rank started: torchrun never ran, so no launcher log or rank outcome exists anywhere
    assert not list(tmp_path.rglob("launcher.log")) and not list(tmp_path.rglob("rank*.json"))


def test_rule_violations_are_exactly_one_line(tmp_path):
    proc = cli("train.precision=fp16", f"paths.root={tmp_path}", "logger=none", timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("shardbench: invalid config: train.precision=fp16")

"""What a run writes is never left torn: summary.json (and every JSON a run writes) is replaced whole or not at
all, so a disk that fills mid-write leaves the previous file as it was; metrics.jsonl is read up to its last whole
line. (A real full disk under a sweep is tests/test_environment_faults.py's drill.)"""
from __future__ import annotations

import errno
import json
import os

import pytest

from harness.core import rundir


def test_a_write_that_fails_for_a_full_disk_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    rundir.write_json(path, {"status": "ok", "figures": {"loss/final_loss": 3.1}})
    before = path.read_bytes()

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # the data reached the page cache; the disk refuses it
    with pytest.raises(OSError):
        rundir.write_json(path, {"status": "failed", "reason": "x" * 10_000})
    assert path.read_bytes() == before and json.loads(before)["status"] == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind


def test_a_torn_last_line_of_metrics_is_dropped_and_every_whole_line_kept(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "loss/loss": 5.0 - i}) for i in range(3)]
    metrics.write_text("\n".join(lines) + "\n" + lines[0][:9])  # the write of step 3 cut short
    assert [r["step"] for r in rundir.read_jsonl(metrics)] == [0, 1, 2]

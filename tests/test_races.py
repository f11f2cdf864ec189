"""Launches that race for a run dir, and a launcher that dies: real processes, real signals (the same drills
`make faults` records, harness/studies/faults/launcher_drill.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.reporting.collect import collect
from harness.studies.faults.launcher_drill import KILL_BOUND_S, concurrent_sweeps, race_and_sigkill

# a launcher drill: run by `make test-drills` (and CI), not by `make test`
pytestmark = [pytest.mark.slow, pytest.mark.drill]


def test_a_held_run_dir_refuses_a_second_launch_and_no_rank_outlives_a_killed_launcher(tmp_path):
    got = race_and_sigkill(tmp_path)
    second = got["second"]
    # the second launch: one line naming the holder, a non-zero exit, nothing in the dir changed
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == 1 and len(lines) == 1, second.stderr
    assert f"pid {got['holder_pid']} on host" in lines[0] and str(got["run_dir"]) in lines[0]
    assert "Traceback" not in second.stderr and got["refused_s"] < 10
    assert got["unchanged"], (got["before"], got["after"])
    assert got["steps"] == list(range(len(got["steps"]))) and got["steps"]  # one run's steps, in order, once
    # SIGKILL of the launcher: torchrun and both ranks gone within the bound, checked by pid
    assert len(got["pids"]) >= 3, got["pids"]  # torchrun's agent and two ranks were found before the kill
    assert got["left"] == [] and got["gone_s"] < KILL_BOUND_S, (got["left"], got["gone_s"])
    # the abandoned dir reads as a lost launcher, in a report and in the re-run that archives it
    rerun = got["rerun"]
    assert rerun.returncode == 0 and "[lost] ddp" in rerun.stdout, rerun.stderr[-2000:]
    lost = (got["run_dir"] / "attempts" / "1" / "summary.json").read_text()
    assert '"status": "failed"' in lost and "launcher lost" in lost


def test_a_report_names_a_lost_launcher_and_a_run_held_elsewhere(tmp_path):
    from harness.core.runlock import RunLock

    lost, held = tmp_path / "lost", tmp_path / "held"
    for d in (lost, held):
        (d / "ranks").mkdir(parents=True)
        (d / "config.yaml").write_text("backend:\n  name: ddp\nmodel:\n  name: tiny_llama\n")
    with RunLock(held):  # this test's own process holds it, as a live launch would
        # read from another process, as `make report` would: a lock is seen from outside its holder
        code = ("import json, sys; from harness.reporting.collect import collect; "
                "print(json.dumps([(r['run_dir'], r['status'], r['reason']) for r in collect(sys.argv[1])]))")
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    rows = {name: (status, reason) for name, status, reason in json.loads(proc.stdout)}
    assert rows["held"][0] == "running" and "running elsewhere: pid" in rows["held"][1]
    assert rows["lost"][0] == "failed" and rows["lost"][1].startswith("launcher lost")
    assert {r["run_dir"]: r["status"] for r in collect(tmp_path)}["lost"] == "failed"


def test_the_same_sweep_started_twice_runs_each_run_once(tmp_path):
    got = concurrent_sweeps(tmp_path)
    assert got["codes"] == (0, 0), got["stderr"]
    assert [name.split(",")[0] for name in sorted(got["runs"])] == ["backend=ddp", "backend=fsdp"]
    for name, run in got["runs"].items():
        assert run["summary"]["status"] == "ok", (name, run["summary"])
        assert run["steps"] == list(range(40)), name  # trained once: no steps mixed in from a second launch
        assert not run["attempts"], name  # never archived, so never started twice
    # each run trains in exactly one launch; the other names it held ("running elsewhere") or done ("[skip]").
    # Which launch trains which depends on the machine's load: the second starts once the first's first run
    # trains, and may reach the second run before the first launch does (CI saw that: it trained fsdp itself)
    for backend in ("ddp", "fsdp"):
        trained = [out.count(f"[ok] {backend} ") for out in got["stdout"]]
        assert sorted(trained) == [0, 1], (backend, got["stdout"])
        other = got["stdout"][trained.index(0)]
        assert f"[running elsewhere] {backend}" in other or f"[skip] {backend}: ok result" in other, other

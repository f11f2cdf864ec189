"""The launcher's faults, for `make faults` and tests/test_races.py: two launches racing for one run dir, a
SIGKILLed launcher, and the same sweep started twice at once. Every launch is the real CLI in a subprocess.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import psutil

from ...config import families
from ...core.paths import REPO
from ...core.rundir import RunDir
from ...core.spawn import train_command

QUICK = ["logger=none", "train.measure_flops=false", "train.profile_memory=false", "train.breakdown_steps=0"]  # failure paths, not figures
KILL_BOUND_S = 10.0  # no torchrun agent or rank may outlive a SIGKILLed launcher by more than this


def _start(*overrides: str) -> subprocess.Popen:
    return subprocess.Popen(train_command(*overrides, *QUICK), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while not (path.exists() and path.stat().st_size) and time.time() < deadline:
        time.sleep(0.2)


def _fingerprint(run_dir: Path, growing=("metrics.jsonl", "launcher.log")) -> Dict[str, str]:
    """Every entry of the run dir, with the content hash of each file that the holder is not appending to."""
    out = {}
    for p in sorted(run_dir.rglob("*")):
        rel = str(p.relative_to(run_dir))
        out[rel] = "dir" if p.is_dir() else ("growing" if p.name in growing else
                                             hashlib.sha1(p.read_bytes()).hexdigest())
    return out


def alive(pids: List[int]) -> List[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def run_processes(run_dir: Path) -> List[int]:
    """torchrun's agent and the ranks of a run: every process whose command line names its run dir."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or ())
            and p.pid != os.getpid()]


def race_and_sigkill(root: Path) -> dict:
    """A long run of one family's backend holds a run dir; a launch of another family's into the same dir must
    refuse and change nothing; then the first launcher is SIGKILLed, and nothing of its run may survive it; a
    re-run names the lost attempt."""
    run_dir = root / "runs" / "raced"
    holder, other = families.representatives()[:2]
    first = _start(f"backend={holder}", "train.steps=100000", f"paths.root={root}", f"hydra.run.dir={run_dir}")
    _wait_for(run_dir / "metrics.jsonl")
    before = _fingerprint(run_dir)
    started = time.time()
    second = subprocess.run(train_command(*QUICK, f"backend={other}", "train.steps=30", f"paths.root={root}",
                                          f"hydra.run.dir={run_dir}"), cwd=REPO, capture_output=True, text=True)
    refused_s = time.time() - started
    after = _fingerprint(run_dir)
    pids = run_processes(run_dir)
    killed = time.time()
    first.send_signal(signal.SIGKILL)
    first.communicate()
    while alive(pids) and time.time() - killed < 30:
        time.sleep(0.1)
    gone_s = time.time() - killed
    left = alive(pids)
    steps = [r["step"] for r in RunDir(run_dir).read_metrics()]
    rerun = subprocess.run(train_command(*QUICK, f"backend={holder}", "train.steps=3", "train.warmup_steps=1",
                                         f"paths.root={root}", f"hydra.run.dir={run_dir}"),
                           cwd=REPO, capture_output=True, text=True)
    return {"run_dir": run_dir, "holder_pid": first.pid, "second": second, "refused_s": refused_s,
            "unchanged": before == after, "before": before, "after": after, "steps": steps,
            "pids": pids, "left": left, "gone_s": gone_s, "rerun": rerun}


def concurrent_sweeps(root: Path, steps: int = 40) -> dict:
    """The same two-run sweep (two families' backends) started twice, the second once the first's first run is
    training."""
    sweep = ["-m", "backend=" + ",".join(families.representatives()[:2]), f"train.steps={steps}", "train.warmup_steps=1", f"paths.root={root}",
             "sweep.name=twice"]
    one = _start(*sweep)
    first_run = root / "sweeps" / "twice"
    deadline = time.time() + 120
    while time.time() < deadline and not list(first_run.glob("*/metrics.jsonl")):
        time.sleep(0.2)
    two = _start(*sweep)
    out_one, err_one = one.communicate(timeout=600)
    out_two, err_two = two.communicate(timeout=600)
    runs = {}
    for path in sorted(p for p in first_run.iterdir() if p.is_dir() and p.name.startswith("backend=")):
        rd = RunDir(path)
        runs[path.name] = {"summary": rd.read_summary(), "steps": [r["step"] for r in rd.read_metrics()],
                           "attempts": rd.attempts.exists()}
    return {"codes": (one.returncode, two.returncode), "stdout": (out_one, out_two), "stderr": (err_one, err_two),
            "runs": runs}

"""`make faults`: inject every fault into real runs and record the status each became and how long it took.

    python -m harness fault-drill [--timeout-s 10] [--out results/faults] [overrides...]

1. One sweep, `fault.kind=none,oom,raise,nan,kill,segfault,hang` (rank 1, step 3, `dist.timeout_s=--timeout-s`).
   Time to detect = the run's summary.json written, minus the moment the faulting rank injected the fault
   (its ranks/fault.json).
2. The same command again, which skips the ok run and re-runs the failed ones, then SIGINT (a terminal's
   Ctrl-C) once the re-run's hung rank has hung. Time to detect = SIGINT to the sweep's exit.
3. The launcher's own faults (launcher_drill.py): a second launch into a run dir another launch holds (time
   to refuse), SIGKILL of a running launcher (time until its torchrun agent and ranks are gone), and the same
   sweep started twice at once.
After each step it counts the processes left that belong to the runs (`pgrep -f <run_dir>`).
Writes <out>/faults.md and faults.json; tests/test_faults.py asserts the same outcomes.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from ...config.command_line import parse
from ...config.schema import FAULT_KINDS, SAVE_FAULT_KINDS

# hang last: the re-run is interrupted while it waits. A save's faults need checkpoints: tests/test_checkpoint_drill.py
# a straggler (slow) ends ok, with a note naming it: its drill is tests/test_stragglers.py
KINDS = [k for k in FAULT_KINDS if k not in SAVE_FAULT_KINDS and k != "slow"]
from ...core.paths import REPO, results_dir
from ...core.rundir import RunDir, read_json, write_json, write_text
from .launcher_drill import concurrent_sweeps, race_and_sigkill
from ...core.spawn import train_command


def sweep_command(root: Path, timeout_s: int, extra: List[str]) -> List[str]:
    return train_command("-m", f"fault.kind={','.join(KINDS)}", "fault.rank=1", "fault.step=3",
                         f"dist.timeout_s={timeout_s}", "train.steps=6", "train.warmup_steps=1", "logger=none",
                         "train.measure_flops=false", "train.profile_memory=false", "train.breakdown_steps=0", f"paths.root={root}", "sweep.name=faults",
                         *extra)


def read_runs(root: Path) -> dict:
    """{fault kind: summary, run dir, fault time, detection time, mtime} for every run of the sweep."""
    runs = {}
    for path in (root / "sweeps" / "faults").glob("*/" + RunDir(".").summary.name):
        run_dir = RunDir(path.parent)
        kind = next(p.split("=")[1] for p in run_dir.root.name.split(",") if p.startswith("fault.kind="))
        fault = read_json(run_dir.fault) if kind != "none" else None
        runs[kind] = {"summary": read_json(path), "dir": run_dir.root, "mtime_ns": path.stat().st_mtime_ns,
                      "fault_time": fault["time"] if fault else None,
                      "detected_s": path.stat().st_mtime - fault["time"] if fault else None}
    return runs


def left_running(run_dir: Path) -> List[str]:
    return subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()


def interrupt_rerun(root: Path, timeout_s: int, extra: List[str], before: dict) -> dict:
    """Run the sweep again and SIGINT it once the re-run's hang has happened; return what was seen."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(sweep_command(root, timeout_s, extra), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a shell does
    hang_fault = RunDir(before["hang"]["dir"]).fault
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        fault = read_json(hang_fault)
        if fault and fault["time"] > before["hang"]["fault_time"]:
            break
        time.sleep(0.2)
    time.sleep(1)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return {"returncode": proc.returncode, "stopped_s": time.time() - sent, "stdout": out, "stderr": err}


def launcher_rows(root: Path) -> List[dict]:
    race = race_and_sigkill(root / "launcher")
    refusal = race["second"].stderr.strip().splitlines()[-1] if race["second"].stderr.strip() else ""
    lost = read_json(race["run_dir"] / "attempts" / "1" / "summary.json") or {}
    twice = concurrent_sweeps(root / "launcher")
    trained = sum(out.count("[ok] ") for out in twice["stdout"])
    once = all(r["steps"] == sorted(set(r["steps"])) and not r["attempts"] for r in twice["runs"].values())
    return [
        {"fault": "second launch into a held run dir", "status": f"refused, exit {race['second'].returncode}",
         "reason": f"{refusal} (dir {'unchanged' if race['unchanged'] else 'CHANGED'})",
         "detected_s": race["refused_s"], "processes_left": 0},
        {"fault": "SIGKILL of the launcher", "status": f"{lost.get('status')} (on re-run)",
         "reason": f"{lost.get('reason', '')}; torchrun + ranks gone after the kill (pids {race['pids']})",
         "detected_s": race["gone_s"], "processes_left": len(race["left"])},
        {"fault": "same sweep started twice at once", "status": f"exit codes {twice['codes']}",
         "reason": f"{len(twice['runs'])} runs, {trained} trainings in all, each run's steps once: {once}",
         "detected_s": None, "processes_left": 0},
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-s", type=int, default=10, help="dist.timeout_s for the hung rank")
    parser.add_argument("--out", default=str(results_dir("faults")))
    parser.add_argument("--root", default="results/fault_drill", help="paths.root of the drill's runs (emptied)")
    args, extra = parse("fault-drill", parser, argv)
    root, out = Path(args.root).resolve(), Path(args.out)
    import shutil

    for old in (root / "sweeps" / "faults", root / "launcher"):  # a drill starts from nothing
        shutil.rmtree(old, ignore_errors=True)
    first = subprocess.run(sweep_command(root, args.timeout_s, extra), cwd=REPO, capture_output=True, text=True)
    if first.returncode:
        print(first.stderr[-3000:], file=sys.stderr)
        return first.returncode
    before = read_runs(root)
    rows = [{"fault": kind, "status": run["summary"]["status"], "reason": run["summary"].get("reason", ""),
             "detected_s": run["detected_s"], "processes_left": len(left_running(run["dir"]))}
            for kind, run in sorted(before.items(), key=lambda kv: KINDS.index(kv[0]))]
    again = interrupt_rerun(root, args.timeout_s, extra, before)
    after = read_runs(root)
    rerun = {kind: after[kind]["fault_time"] != before[kind]["fault_time"] or after[kind]["mtime_ns"] !=
             before[kind]["mtime_ns"] for kind in KINDS}
    rows.append({"fault": "Ctrl-C (SIGINT) of the re-run", "status": after["hang"]["summary"]["status"],
                 "reason": f"{after['hang']['summary'].get('reason')}; sweep exit code {again['returncode']}",
                 "detected_s": again["stopped_s"],
                 "processes_left": sum(len(left_running(r["dir"])) for r in after.values())})
    rows += launcher_rows(root)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "faults.json", {"rows": rows, "rerun": rerun, "timeout_s": args.timeout_s})
    md = [f"# Fault drill: `python -m harness fault-drill --timeout-s {args.timeout_s}`", "",
          "2 CPU ranks (gloo), tiny_llama, fault on rank 1 at step 3. Detected = summary.json written minus "
          "the fault's injection; for Ctrl-C, SIGINT to the sweep's exit; for a second launch, its start to "
          "its refusal; for SIGKILL of the launcher, the kill until no process of the run is left.", "",
          "| fault | status | detected after (s) | rank processes left | reason |", "|---|---|---:|---:|---|"]
    md += [f"| {r['fault']} | {r['status']} | {r['detected_s']:.2f} | {r['processes_left']} | {r['reason']} |"
           if r["detected_s"] is not None else f"| {r['fault']} | {r['status']} | - | {r['processes_left']} | "
           f"{r['reason']} |" for r in rows]
    md += ["", "Re-run of the same sweep: " + ", ".join(f"{k} {'re-ran' if v else 'skipped'}" for k, v in
                                                        rerun.items()) + " (then Ctrl-C during hang)."]
    write_text(out / "faults.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0

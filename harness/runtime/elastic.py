"""Elastic restarts (`launch.max_restarts=<n>`): torchelastic's model, not a new one.

torchrun runs the ranks with `--max-restarts=n`. When a rank dies, its agent stops the others and starts the
whole group again, at most n times, with TORCHELASTIC_RESTART_COUNT set to the restart's number. A restarted
rank:
- loads the latest complete checkpoint whose files are intact (core/checkpoint_dirs.latest_intact), whatever
  `train.resume` said for the first attempt; with none, it starts from step 0;
- injects no fault: a fault is injected once, on the first attempt (runtime/faults.py);
- on rank 0, records the restart in <run_dir>/restarts.jsonl: the step it goes on from, the cause (the
  fault a rank wrote before acting, else the step the metrics reached), and the time lost. The time lost runs
  from the moment the checkpoint was complete to the moment the restarted group had loaded it: the steps redone
  plus the restart (new processes, imports, setup, the load). The metrics of the steps to be redone move from
  metrics.jsonl to restarts/<n>.metrics.jsonl, so that metrics.jsonl holds each step once.

The launcher copies the records into summary.json (`restarts`, and `launch/restarts` among the figures).
"""
from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

from ..core.checkpoint_dirs import MARKER, latest_intact, step_of
from ..core.rundir import RunDir, read_json


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def restart_store(rank: int, world: int, timeout: timedelta) -> Optional[dict]:
    """init_process_group's store arguments for a restarted group; None on the first attempt (torch's own
    env:// rendezvous). Measured with torch 2.13 and gloo under torchrun --standalone: a restarted group reads
    the first attempt's rank addresses from the agent's store, which outlives the restart, and every rank's
    connectFullMesh fails with "Connection refused" (a bare all_reduce script does the same). Each restart's
    keys therefore live under a prefix of their own in that store."""
    attempt = restart_count()
    if not attempt:
        return None
    import torch.distributed as dist

    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0 hosts it
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent_hosts, timeout=timeout)
    return {"store": dist.PrefixStore(f"shardbench/restart_{attempt}", store), "rank": rank, "world_size": world}


def checkpoint_to_resume(run_dir: RunDir) -> Optional[Path]:
    return latest_intact(run_dir.checkpoints)[0]


def record(run_dir: RunDir, path: Optional[Path]) -> dict:
    """Rank 0, once the restarted group has loaded `path` (None: from step 0): the restart's line."""
    step = step_of(path) if path is not None else 0
    fault = (read_json(run_dir.fault) or {}) if restart_count() == 1 else {}  # a fault fires on the first attempt
    moved = set_aside_metrics(run_dir, step, restart_count())
    failed_at = fault.get("step", step + moved)
    cause = (f"fault.kind={fault['kind']} on rank {fault['rank']} at step {fault['step']}" if fault
             else f"a rank ended after step {failed_at - 1} (see launcher.log)")
    complete_at = (path / MARKER).stat().st_mtime if path is not None else None
    line = {"restart": restart_count(), "resumed_from_step": step, "failed_at_step": failed_at, "cause": cause,
            "redone_steps": max(0, failed_at - step),
            "time_lost_s": round(time.time() - complete_at, 3) if complete_at else None}
    with open(run_dir.restarts, "a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def set_aside_metrics(run_dir: RunDir, step: int, restart: int) -> int:
    """Move metrics.jsonl's lines of steps >= `step` to restarts/<restart>.metrics.jsonl, in place: the sink
    holds the file open for appending, so it is rewritten, not replaced. Returns how many moved."""
    if not run_dir.metrics.exists():
        return 0
    with open(run_dir.metrics, "r+") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
        redone = [json.loads(line).get("step", 0) >= step for line in lines]
        keep = [line for line, r in zip(lines, redone) if not r]
        moved = [line for line, r in zip(lines, redone) if r]
        f.seek(0)
        f.write("".join(line + "\n" for line in keep))
        f.truncate()
    if moved:
        aside = run_dir.root / "restarts" / f"{restart}.metrics.jsonl"
        aside.parent.mkdir(parents=True, exist_ok=True)
        aside.write_text("".join(line + "\n" for line in moved))
    return len(moved)

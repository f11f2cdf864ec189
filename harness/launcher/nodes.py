"""Multi-node runs: one owner of the run dir, and the other nodes' launchers as its followers.

Every node runs the same command (`python -m harness train parallelism.nnodes=N ...`), with its node rank in
SHARDBENCH_NODE_RANK (or SLURM_NODEID under SLURM) and the rendezvous host in SHARDBENCH_MASTER_ADDR (or the
allocation's first host). They share one run dir on a shared filesystem:

- **Node 0 owns it**: it takes the run-dir lock, archives an earlier attempt, writes config.yaml, env.json,
  launcher.log and the summary (rank 0 writes it, merging every node's ranks; on failure the parent reads
  every rank's outcome file).
- **Node k > 0 follows**: it takes only its own node lock (`.lock.node<k>`: one launcher per node), waits
  until node 0 holds the run-dir lock *for the same rendezvous id*, then starts its torchrun. It writes only
  node-scoped files: `launcher.node<k>.log`, and its ranks' own `ranks/rank<R>.json`. It prints its own
  node's line, never the run's summary.
- **One run, one rendezvous id**: SHARDBENCH_RDZV_ID, else SLURM's job id, else the run dir's name. The lock
  admits the nodes of that run and refuses any other launch into the dir.
- **A node that never joins** ends the run as `timeout` after `dist.rendezvous_timeout_s` (torchrun's c10d
  join timeout), naming the nodes whose launcher holds no node lock.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List

from ..config.mesh import mesh_of
from ..core.fatal_dump import read_dump
from ..core.records import RankOutcome, Status
from ..core.rundir import NODE_ENDED, RunDir, read_json
from ..core.runlock import RunDirBusy, RunLock, describe, holder
from ..core.waiting import Announcer, stderr_line
from .ops import ensure_ops
from .torchrun import launch_follower, node_rank, rank_env, rdzv_id

__all__ = ["node_rank", "follow", "owner_lock"]

OWNER = 0


def node_lock(run_dir: Path, node: int) -> RunLock:
    return RunLock(run_dir, name=f".lock.node{node}", info={"rdzv_id": rdzv_id(run_dir), "node": node})


def owner_lock(run_dir: Path) -> RunLock:
    return RunLock(run_dir, info={"rdzv_id": rdzv_id(run_dir), "node": OWNER})


def wait_for_owner(run_dir: Path, timeout_s: float) -> str | None:
    """None once node 0 holds the run dir for our rendezvous id; else why we cannot join (one line)."""
    ours, deadline = rdzv_id(run_dir), time.time() + timeout_s
    announce = Announcer()
    while True:
        held = holder(run_dir)
        if held is not None and held.get("rdzv_id") == ours and held.get("node") == OWNER:
            return None
        if held is not None and held.get("rdzv_id") not in (None, ours):
            return (f"run dir {run_dir} is in use by another launch ({describe(held)}, rendezvous id "
                    f"{held.get('rdzv_id')}, not {ours}); set another hydra.run.dir")
        if time.time() > deadline:
            return (f"node 0 never started run {ours} in {run_dir} within dist.rendezvous_timeout_s="
                    f"{timeout_s:g}")
        if announce.due():
            stderr_line(announce.line(f"node 0 to start run {ours} in {run_dir}",
                                      f"dist.rendezvous_timeout_s={timeout_s:g} s"))
        time.sleep(0.2)


def node_outcomes(run_dir: RunDir, cfg, node: int) -> List[RankOutcome]:
    mesh = mesh_of(cfg)
    out = []
    for rank in (r for r in range(mesh.world) if mesh.node_of(r) == node):
        found = read_json(run_dir.rank_outcome(rank))
        out.append(RankOutcome.from_dict(found) if found else RankOutcome.killed(
            rank, None, node, read_dump(run_dir.rank_fatal(rank))))
    return out


def follow(cfg, run_dir: RunDir, node: int) -> int:
    """Node k's launcher: its torchrun, joined to node 0's run. Returns the process exit code."""
    try:
        lock = node_lock(run_dir.root, node).acquire()
    except RunDirBusy as err:
        print(f"shardbench: node {node} of {run_dir.root} is already launched by {describe(err.holder)}",
              file=sys.stderr)
        return 1
    try:
        refused = wait_for_owner(run_dir.root, cfg.dist.rendezvous_timeout_s)
        if refused:
            print(f"shardbench: node {node}: {refused}", file=sys.stderr)
            return 1
        blocked = ensure_ops(cfg, run_dir, rank_env(cfg), log_name=f"ops.node{node}.log")  # this node's own ops
        if blocked is not None:
            print(f"shardbench: node {node}: {blocked.reason}", file=sys.stderr)
            return 1
        returncode = launch_follower(cfg, run_dir, node)
        # said before the lock goes: a node whose lock is free without this line lost its launcher
        with open(run_dir.root / f"launcher.node{node}.log", "a") as log:
            log.write(f"{NODE_ENDED} {returncode}\n")
    finally:
        lock.release()
    outcomes = node_outcomes(run_dir, cfg, node)
    worst = min(outcomes, key=RankOutcome.sort_key)
    ranks = f"ranks {outcomes[0].rank}-{outcomes[-1].rank}"
    if returncode == 0 and worst.status == Status.OK:
        print(f"[node {node}] {ranks} ok; node 0 writes the run's summary in {run_dir.root}", flush=True)
        return 0
    what = " ".join(f"rank {worst.rank} {worst.status}: {worst.error} {worst.reason}".split())
    print(f"[node {node}] {ranks}: {what} (node 0 writes the run's summary in {run_dir.root})", flush=True)
    return 1

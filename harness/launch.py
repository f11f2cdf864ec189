"""Start the ranks of one run with torchrun, wait, and turn what happened into a summary.

torchrun runs in its own process group, so the parent can always stop every rank it started: on success
(stragglers), on failure, and on Ctrl-C. torchrun itself stops the surviving ranks when one fails. Its
output goes to `<run_dir>/launcher.log`, each rank's outcome to `<run_dir>/ranks/rank<R>.json`.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import results
from .warm_ops import extensions_dir

REPO = Path(__file__).resolve().parent.parent
# Worst first: the status of a failed run is the worst any rank reported.
# A rank that died without a report (killed) outranks one that failed because of it.
SEVERITY = {"oom": 0, "timeout": 1, "killed": 2, "failed": 2, "terminated": 4, "ok": 5}


def rank_env(cfg) -> dict:
    env = dict(os.environ)
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.parallelism.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # one core per rank: ranks that oversubscribe cores time each other, not the strategy
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.parallelism.nproc_per_node))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("WANDB_SILENT", "true")
    return env


def rendezvous_host() -> str:
    """SHARDBENCH_MASTER_ADDR, else under SLURM (submitit) the job's first host, else this machine."""
    if os.environ.get("SHARDBENCH_MASTER_ADDR"):
        return os.environ["SHARDBENCH_MASTER_ADDR"]
    if os.environ.get("SLURM_JOB_ID"):
        try:
            import submitit

            return submitit.JobEnvironment().hostnames[0]
        except Exception:  # noqa: BLE001 - not inside a submitit job: fall back to this machine
            pass
    return "127.0.0.1"


def torchrun_cmd(cfg, run_dir: Path, module: tuple[str, ...] = ()) -> list[str]:
    """torchrun for this config; it runs `python -m harness.worker <run_dir>`, or `module` (module and args)."""
    par = cfg.parallelism
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={par.nproc_per_node}",
           "--max-restarts=0", "--monitor-interval=0.2"]
    if par.nnodes == 1:
        cmd.append("--standalone")
    else:
        # multi-node: every node runs this with its own node rank; the first node hosts the rendezvous
        node_rank = os.environ.get("SHARDBENCH_NODE_RANK", os.environ.get("SLURM_NODEID", "0"))
        master = rendezvous_host()
        port = cfg.dist.master_port or 29500
        cmd += [f"--nnodes={par.nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={master}:{port}", f"--rdzv-id={run_dir.name}"]
    return cmd + ["-m", *(module or ("harness.worker", str(run_dir)))]


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs. Zombies do not count: killpg(pgid, 0) would count them,
    and under a PID 1 that does not reap orphans (containers) a rank torchrun left behind stays a zombie."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait_s
        while time.time() < deadline:
            proc.poll()  # reap torchrun itself once it has exited
            if not _group_alive(proc.pid):
                return
            time.sleep(0.1)


def exit_codes(log_text: str) -> dict[int, int]:
    """Per-rank exit codes from torchrun's failure report (`rank: R ... exitcode: C`)."""
    found = {}
    for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", log_text):
        found[int(m.group(1))] = int(m.group(2))
    return found


def failure_summary(identity: dict, run_dir: Path, world: int, returncode: int) -> dict:
    log = (run_dir / "launcher.log").read_text(errors="replace") if (run_dir / "launcher.log").exists() else ""
    codes = exit_codes(log)
    outcomes = []
    for rank in range(world):
        o = results.read_json(run_dir / "ranks" / f"rank{rank}.json")
        if o is None:
            code = codes.get(rank)
            how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            o = {"rank": rank, "status": "killed",
                 "reason": f"exited without a report ({how if code is not None else 'killed by a signal?'})"}
        outcomes.append(o)
    worst = min(outcomes, key=lambda o: (SEVERITY.get(o["status"], 2), is_peer_error(o)))
    status = worst["status"] if worst["status"] in ("oom", "timeout") else "failed"
    if worst["status"] == "ok":
        reason = f"launcher exited with code {returncode} after every rank reported ok"
    else:
        reason = f"rank {worst['rank']} {worst['status']}: {worst.get('error', '')} {worst.get('reason', '')}"
        others = [f"rank {o['rank']} {o['status']}" for o in outcomes if o is not worst]
        reason += f" ({', '.join(others)})" if others else ""
    params = next((o["params"] for o in outcomes if o.get("params")), None)  # counted by the ranks, if they got that far
    out = {**identity, "params": params, "status": status, "reason": " ".join(reason.split()),
           "figures": figures_reached(run_dir, worst), "ranks": outcomes}
    traceback = run_dir / "ranks" / f"rank{worst['rank']}.traceback.txt"
    if traceback.exists():
        out["traceback"] = str(traceback.relative_to(run_dir))
    return out


def figures_reached(run_dir: Path, worst: dict) -> dict:
    """A failed run's figures: the steps it completed (metrics.jsonl), its last loss, and what the rank
    that caused the failure had reached (memory high-water marks; for an OOM, the bytes over budget)."""
    steps = []
    if (run_dir / "metrics.jsonl").exists():
        for line in (run_dir / "metrics.jsonl").read_text(errors="replace").splitlines():
            try:
                steps.append(json.loads(line))
            except ValueError:  # a line torn by a kill: the steps before it still count
                break
    out = {"train/steps_completed": len(steps), **worst.get("reached", {})}
    if steps:
        out["loss/last_loss"] = steps[-1].get("loss/loss")
    return out


def is_peer_error(outcome: dict) -> bool:
    """A rank that failed because a peer went away is a symptom; the peer is the cause to report."""
    text = f"{outcome.get('reason', '')}".lower()
    return any(s in text for s in ("closed by peer", "reset by peer", "remote worker", "broken pipe",
                                   "from another rank"))


def wait_with_progress(proc: subprocess.Popen, cfg, run_dir: Path) -> int:
    """Wait for torchrun; on a terminal, show a progress bar fed by rank 0's metrics.jsonl (steps, tokens/s)."""
    if not sys.stdout.isatty():
        return proc.wait()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    metrics_path, offset = run_dir / "metrics.jsonl", 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[rate]}"))
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(f"{cfg.backend.name} {cfg.model.name}", total=cfg.train.steps, rate="starting")
        while proc.poll() is None:
            time.sleep(0.5)
            if not metrics_path.exists():
                continue
            with open(metrics_path) as f:
                f.seek(offset)
                chunk = f.read()
            lines = chunk.split("\n")
            offset += len(chunk) - len(lines[-1])  # keep a partly written last line for the next poll
            for line in lines[:-1]:
                record = json.loads(line)
                rate = f"{record['throughput/tokens_per_s']:,.0f} tok/s" + (" (warm-up)" if record["warmup"] else "")
                bar.update(task, completed=record["step"] + 1, rate=rate)
    return proc.returncode


def launch(cfg, run_dir: Path, identity: dict) -> dict:
    """Run the ranks to completion and return the run's summary (also written to summary.json)."""
    run_dir = Path(run_dir)
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    world = cfg.parallelism.nproc_per_node * cfg.parallelism.nnodes
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        return _launch(cfg, run_dir, identity, world)

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")  # a kill of the parent goes the Ctrl-C way: stop the ranks

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return _launch(cfg, run_dir, identity, world)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _launch(cfg, run_dir: Path, identity: dict, world: int) -> dict:
    with open(run_dir / "launcher.log", "w") as log:
        proc = subprocess.Popen(torchrun_cmd(cfg, run_dir), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=rank_env(cfg), start_new_session=True)
        try:
            returncode = wait_with_progress(proc, cfg, run_dir)
        except BaseException:  # Ctrl-C or a kill of the parent: no rank may outlive it
            _stop_group(proc, grace_s=3.0)  # a user who pressed Ctrl-C is waiting; results are atomic
            proc.wait()
            interrupted = {**identity, "status": "failed", "reason": "interrupted (SIGINT/SIGTERM) before the run ended",
                           "figures": {}}
            results.write_json(run_dir / "summary.json", interrupted)
            raise
        finally:
            _stop_group(proc, grace_s=2.0)
    summary = results.read_json(run_dir / "summary.json")
    if returncode == 0 and summary and summary.get("status") == "ok":
        return summary
    summary = failure_summary(identity, run_dir, world, returncode)
    results.write_json(run_dir / "summary.json", summary)
    return summary

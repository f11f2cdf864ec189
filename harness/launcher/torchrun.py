"""Start the ranks of one run with torchrun, wait, and turn what happened into a summary.

torchrun runs in its own process group, so the parent can always stop every rank it started: on success
(stragglers), on failure, and on Ctrl-C. torchrun itself stops the surviving ranks when one fails. Its
output goes to `<run_dir>/launcher.log`, each rank's outcome to `<run_dir>/ranks/rank<R>.json`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

from ..config import derive
from ..core import preemption
from ..core.paths import REPO, extensions_dir
from ..core.records import RunSummary
from ..core.rundir import RunDir, write_json
from .outcome import summarise
from .progress import wait_announcing, wait_with_progress
from .disk import _reserve, disk_full_reason

WORKER = "harness.runtime.worker"


def rank_env(cfg) -> dict:
    env = dict(os.environ)
    env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.parallelism.device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # one core per rank: ranks that oversubscribe cores time each other, not the strategy
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.parallelism.nproc_per_node))
    # Nothing in an eager run compiles. Left enabled, dynamo costs each DeepSpeed rank 1.8 s at setup all
    # the same: DeepSpeed's optimizer check imports its Muon module, whose torch.compile decorators load
    # inductor. A user who sets the variable keeps their value; train.compile=true and DeepCompile need dynamo.
    if not derive.compiles(cfg):
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("WANDB_SILENT", "true")
    return env


def launch_config(configs: list):
    """The config whose environment a launch of several cells takes: one that compiles if any does (an eager
    launch disables dynamo, which a compiled cell needs), else the first."""
    return next((cfg for cfg in configs if derive.compiles(cfg)), configs[0])


def slurm_cancel() -> str:
    """Inside a SLURM job a SIGTERM is SLURM's: scancel, the time limit, or preemption."""
    job = os.environ.get("SLURM_JOB_ID")
    return f" from SLURM: job {job} cancelled, out of time or preempted" if job else ""


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


def node_rank(cfg) -> int:
    """This launcher's node (launcher/nodes.py): SHARDBENCH_NODE_RANK, else SLURM's; 0 on a single node."""
    if cfg.parallelism.nnodes == 1:
        return 0
    return int(os.environ.get("SHARDBENCH_NODE_RANK", os.environ.get("SLURM_NODEID", "0")))


def rdzv_id(run_dir: Path) -> str:
    """One run's rendezvous id, the same on every node: SHARDBENCH_RDZV_ID, else SLURM's job id, else the run
    dir's name. The run-dir lock admits the nodes of this id and refuses any other launch."""
    return os.environ.get("SHARDBENCH_RDZV_ID") or os.environ.get("SLURM_JOB_ID") or Path(run_dir).name


def torchrun_cmd(cfg, run_dir: Path, module: tuple[str, ...] = ()) -> list[str]:
    """torchrun for this config; it runs `python -m harness.runtime.worker <run_dir>`, or `module` (module and
    args)."""
    par = cfg.parallelism
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={par.nproc_per_node}",
           f"--max-restarts={cfg.launch.max_restarts}", "--monitor-interval=0.2"]
    if par.nnodes == 1:
        cmd.append("--standalone")
    else:
        # multi-node: every node runs this with its own node rank; the first node hosts the rendezvous
        master = rendezvous_host()
        port = cfg.dist.master_port or 29500
        cmd += [f"--nnodes={par.nnodes}", f"--node-rank={node_rank(cfg)}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={master}:{port}", f"--rdzv-id={rdzv_id(run_dir)}",
                f"--rdzv-conf=join_timeout={cfg.dist.rendezvous_timeout_s}"]
    return cmd + ["-m", *(module or (WORKER, str(run_dir)))]


def die_with_parent(parent_pid: int, ignored: Optional[signal.Signals] = None):
    """A preexec for torchrun: the kernel sends it SIGTERM when the launcher dies, however it dies (SIGKILL, the
    OOM killer, a lost session), and torchrun then stops its ranks as on any SIGTERM (Linux PR_SET_PDEATHSIG;
    elsewhere a no-op, and the ranks' own parent watch in runtime/worker.py still ends them). torchrun, and the
    ranks until they handle it, ignore `ignored` (the preemption signal: by default it would kill them)."""

    def preexec() -> None:
        if ignored:
            signal.signal(ignored, signal.SIG_IGN)
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


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


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While the block runs, a SIGTERM of the parent goes the Ctrl-C way (KeyboardInterrupt), so that what it
    started is stopped and recorded. Signal handlers live in the main thread: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Preemption:
    """The preemption signal (train.preempt_signal, core/preemption.py) while the ranks run: noted, and repeated
    to torchrun's ranks every second until they end (SLURM signals them itself; a rank that was still setting
    up then ignored it). Once the run's row is written, `hand_over` gives the signal to whoever handled it
    before: inside a submitit job, submitit, which requeues the job (launcher/slurm.py) and exits."""

    def __init__(self, cfg):
        self.signal = preemption.signal_of(cfg.train.preempt_signal)
        self.received, self.previous = False, None

    @contextlib.contextmanager
    def forwarded_to(self, proc: subprocess.Popen):
        if not self.signal or threading.current_thread() is not threading.main_thread():
            yield
            return
        stop = threading.Event()

        def repeat() -> None:
            import psutil

            while not stop.is_set():
                try:
                    for rank in psutil.Process(proc.pid).children(recursive=True):
                        rank.send_signal(self.signal)
                except psutil.Error:
                    return
                stop.wait(1.0)

        def on_signal(signum, frame) -> None:
            if not self.received:
                self.received = True
                threading.Thread(target=repeat, name="preempt-forward", daemon=True).start()

        self.previous = signal.signal(self.signal, on_signal)
        try:
            yield
        finally:
            stop.set()
            signal.signal(self.signal, self.previous)

    def hand_over(self) -> None:
        if self.received and callable(self.previous):
            self.previous(self.signal, None)


def launch(cfg, run_dir: RunDir, notes: List[str], preempt: Preemption) -> dict:
    """Run the ranks to completion and return the run's summary (written to summary.json, with `notes`)."""
    run_dir.ranks.mkdir(parents=True, exist_ok=True)
    with sigterm_as_interrupt():  # a kill of the parent stops the ranks
        return _launch(cfg, run_dir, notes, preempt)


def _torchrun(cfg, run_dir: RunDir, log, preempt: Preemption) -> subprocess.Popen:
    return subprocess.Popen(torchrun_cmd(cfg, run_dir.root), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=rank_env(cfg), start_new_session=True,
                            preexec_fn=die_with_parent(os.getpid(), preempt.signal))


def _launch(cfg, run_dir: RunDir, notes: List[str], preempt: Preemption) -> dict:
    reserve = _reserve(run_dir)
    try:
        return _launch_and_summarise(cfg, run_dir, notes, reserve, preempt)
    finally:
        reserve.unlink(missing_ok=True)


def _launch_and_summarise(cfg, run_dir: RunDir, notes: List[str], reserve: Path, preempt: Preemption) -> dict:
    with open(run_dir.launcher_log, "w") as log:
        proc = _torchrun(cfg, run_dir, log, preempt)
        try:
            with preempt.forwarded_to(proc):
                returncode = wait_with_progress(proc, cfg, run_dir)
        except BaseException:  # Ctrl-C or a kill of the parent: no rank may outlive it
            _stop_group(proc, grace_s=3.0)  # a user who pressed Ctrl-C is waiting; results are atomic
            proc.wait()
            reserve.unlink(missing_ok=True)
            write_json(run_dir.summary, RunSummary.interrupted(derive.identity(cfg), slurm_cancel()).to_dict())
            raise
        finally:
            _stop_group(proc, grace_s=2.0)
    full = disk_full_reason(run_dir, cfg.paths.min_free_mib)
    reserve.unlink(missing_ok=True)  # the room for this run's summary
    return summarise(cfg, run_dir, returncode, notes, reason_prefix=full)


def launch_follower(cfg, run_dir: RunDir, node: int) -> int:
    """A multi-node follower's torchrun (launcher/nodes.py): its output in launcher.node<k>.log, nothing else
    written by this process; no rank outlives it. Returns torchrun's exit code."""
    preempt = Preemption(cfg)
    with open(run_dir.root / f"launcher.node{node}.log", "w") as log:
        proc = _torchrun(cfg, run_dir, log, preempt)
        try:
            with preempt.forwarded_to(proc):
                return wait_announcing(proc, cfg, run_dir)
        except BaseException:
            _stop_group(proc, grace_s=3.0)
            proc.wait()
            raise
        finally:
            _stop_group(proc, grace_s=2.0)

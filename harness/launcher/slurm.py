"""A SLURM sweep's wait for its allocations, said out loud and bounded (`hydra/launcher=slurm`).

hydra-submitit submits a sweep as a job array, then blocks on each job's result in turn, printing nothing
while SLURM keeps a job pending, however long. Here that wait (`AllocationWatch.before_result`, called before
each job's result is read) asks SLURM (`squeue`) about the job every few seconds: a job still pending after
30 s is announced with SLURM's state and reason, every minute; a job still pending `sweep.allocation_timeout_s`
after the sweep was submitted is cancelled (`scancel`) and recorded as a `timeout` row in its run dir, naming
the job and SLURM's reason, so the sweep ends with its table rather than a traceback. A running job is the
run itself, bounded by SLURM's time limit (`hydra.launcher.timeout_min`).

A job that SLURM signals ahead of preemption or its time limit saves a checkpoint and stops (core/preemption.py);
submitit then requeues it with the arguments `resumed` gives: the same run, with `train.resume=auto`.

The launcher class Hydra instantiates is in hydra_plugins/shardbench_slurm/ (Hydra takes launchers only from
that namespace); the behaviour is here.
"""
from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Optional

from ..config import derive
from ..core.records import RunSummary, one_line
from ..core.rundir import RunDir, write_json
from ..core.waiting import ANNOUNCE_AFTER_S, Announcer, stderr_line

POLL_S = 5.0


def queue_state(job_id: str) -> Optional[tuple[str, str]]:
    """SLURM's (state, reason) for a queued or running job; None once it has left the queue (or no squeue)."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out:
        return None
    state, _, reason = out.splitlines()[0].partition("|")
    return state, reason


class AllocationWatch:
    def __init__(self, launcher, bound_s: float, say: Callable[[str], None] = stderr_line, poll_s: float = POLL_S):
        self.launcher, self.bound_s, self.say, self.poll_s = launcher, bound_s, say, poll_s
        self.submitted = time.time()  # the array goes in right after the watch starts
        self.announcers: Dict[str, Announcer] = {}

    def before_result(self, job) -> Optional[list]:
        """Wait, announcing, while `job` is pending; None once it runs or ran (its result is then read as
        usual), or its timeout row (as hydra-submitit's result list) when it waited past the bound."""
        # a bound shorter than twice the usual first announcement is announced halfway to it: no wait ends
        # before it has said what it waits for
        announce = self.announcers.setdefault(job.job_id, Announcer(
            since=self.submitted, after_s=min(ANNOUNCE_AFTER_S, self.bound_s / 2)))
        while True:
            queued = queue_state(job.job_id)
            if queued is None or queued[0] != "PENDING":
                return None
            state, reason = queued
            if time.time() - self.submitted > self.bound_s:
                return [self.timed_out(job, reason)]
            if announce.due():
                self.say(announce.line(f"SLURM to allocate job {job.job_id} ({state}: {reason})",
                                       f"sweep.allocation_timeout_s={self.bound_s:g} s"))
            time.sleep(self.poll_s)

    def timed_out(self, job, reason: str):
        """Cancel the job and write its row where the run would have written it."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobReturn, JobStatus
        from omegaconf import OmegaConf, open_dict

        subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30)
        overrides, _, job_num = job.submission().args[:3]
        cfg = self.launcher.hydra_context.config_loader.load_sweep_config(self.launcher.config, list(overrides))
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.num = job_num
        # the run dir as the job would have resolved it: `hydra.sweep.subdir` reads the job's Hydra config
        sweep_cfg = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(cfg)
        try:
            run_dir = Path(OmegaConf.select(cfg, "hydra.sweep.dir")) / str(OmegaConf.select(cfg, "hydra.sweep.subdir"))
        finally:
            HydraConfig.instance().cfg = sweep_cfg
        waited = time.time() - self.submitted
        summary = RunSummary.timeout(derive.identity(cfg), (
            f"SLURM never allocated job {job.job_id} ({reason}) within sweep.allocation_timeout_s="
            f"{self.bound_s:g} s (waited {waited:.0f} s); the job was cancelled")).to_dict()
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(RunDir(run_dir).summary, summary)
        print(one_line(summary, run_dir), flush=True)
        return JobReturn(overrides=list(overrides), cfg=cfg, working_dir=str(run_dir),
                         task_name=cfg.hydra.job.name, status=JobStatus.COMPLETED, _return_value=summary)


def resumed(job_args: tuple) -> tuple:
    """hydra-submitit's job arguments (overrides first) for a requeued job: the same run, going on from the
    latest checkpoint in its run dir (a run dir's name leaves train.resume out: conf/config.yaml)."""
    overrides, *rest = job_args
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] != "train.resume"]
    return (kept + ["train.resume=auto"], *rest)


@contextmanager
def watched(launcher):
    """While a sweep's launch runs: each job's result is read only after its pending wait (above)."""
    import submitit

    watch = AllocationWatch(launcher, launcher.config.sweep.allocation_timeout_s)
    read_result = submitit.core.core.Job.results

    def results(job):
        return watch.before_result(job) or read_result(job)

    submitit.core.core.Job.results = results
    try:
        yield watch
    finally:
        submitit.core.core.Job.results = read_result

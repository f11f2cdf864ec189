"""A real SLURM: a one-machine cluster (tests/slurm/cluster.sh: Debian's slurm-wlm and munge, started as root)
takes a sweep through `hydra/launcher=slurm`, as a cluster would. Where SLURM cannot be installed or started
(no root, no package index) the test skips with the script's one-line reason; it never fakes a pass.

The cluster has two slurmd on this host (nodes n1 and n2, one core each), so a 2-node SLURM job forms here: the
harness's multi-node path (launcher/nodes.py) runs under SLURM's own node ids and job id."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, cli_command, extensions_dir

# ~30 s with the cluster up (installing slurm-wlm on a fresh machine adds ~15 s): a drill, run by
# `make test-drills` and CI; with it make test measured 9 min 35 s of pytest, too close to its 10 minutes
pytestmark = [pytest.mark.slow, pytest.mark.drill]
CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
# the CPU cluster has no GPUs and a core a node: one core a task, no GPU request
FAST = ["logger=none", "train.warmup_steps=2", "profile=parity", "train.measure_flops=false",
        "train.breakdown_steps=0"]
ON_THIS_CLUSTER = ["hydra/launcher=slurm", "hydra.launcher.partition=debug", "hydra.launcher.cpus_per_task=1",
                   "hydra.launcher.gpus_per_node=null", "hydra.launcher.timeout_min=10"]


@pytest.fixture(scope="module")
def slurm_env():
    proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip((proc.stderr.strip().splitlines() or ["slurm: the cluster would not start"])[-1])
    conf = proc.stdout.strip().splitlines()[-1].split("=", 1)[1]
    yield {**os.environ, "SLURM_CONF": conf, "TORCH_EXTENSIONS_DIR": extensions_dir()}
    subprocess.run([str(CLUSTER), "stop"], capture_output=True, timeout=60)


def slurm_env_of(run_dir: Path) -> dict:
    env = run_dir / "env.json"
    return json.loads(env.read_text())["env"] if env.exists() else {}


def job_of(run_dir: Path) -> str | None:
    return slurm_env_of(run_dir).get("SLURM_JOB_ID")


def rows_in_full(sweep: Path) -> str:
    """Each row's dir, status and whole reason, with any rank's faulthandler dump (a crash's every stack): a
    string, which pytest prints whole, where it cuts a dict's repr short."""
    out = []
    for summary in sorted(sweep.glob("*/summary.json")):
        row = json.loads(summary.read_text())
        out.append(f"{summary.parent.name}: {row['status']}: {row.get('reason', '')}")
        out += [f"{dump}:\n{dump.read_text()}" for dump in sorted(summary.parent.glob("ranks/*.fatal.txt"))]
    return "\n".join(out)


def test_a_sweep_runs_as_slurm_jobs_and_a_cancelled_job_is_a_failed_row(tmp_path, slurm_env):
    sweep = tmp_path / "sweeps" / "slurm"
    proc = subprocess.Popen([*cli_command(), "-m", "train.steps=5,4000", *FAST, f"paths.root={tmp_path}",
                             "sweep.name=slurm", *ON_THIS_CLUSTER], cwd=REPO, env=slurm_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        long_run = sweep / "logger=none,profile=parity,train.breakdown_steps=0,train.measure_flops=False,train.steps=4000,train.warmup_steps=2"
        deadline = time.time() + 240
        while time.time() < deadline and not ((long_run / "metrics.jsonl").exists() and job_of(long_run)):
            time.sleep(0.5)
        cancelled, seen = job_of(long_run), slurm_env_of(long_run)
        assert cancelled, list(sweep.glob("*"))
        # submitit submits a sweep as a job array: cancel this run's task, not the array
        task = f"{seen['SLURM_ARRAY_JOB_ID']}_{seen['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_JOB_ID" in seen else cancelled
        subprocess.run(["scancel", task], env=slurm_env, check=True, timeout=30)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]  # the sweep ended; the cancelled job is a row, not a crash
    rows = {json.loads(p.read_text())["status"]: (json.loads(p.read_text()), p.parent)
            for p in sweep.glob("*/summary.json")}
    assert set(rows) == {"ok", "failed"}, rows_in_full(sweep)
    ok, ok_dir = rows["ok"]
    failed, failed_dir = rows["failed"]
    assert failed_dir == long_run and f"SLURM: job {cancelled} cancelled" in failed["reason"], failed["reason"]
    jobs = [job_of(ok_dir), cancelled]
    assert all(jobs) and jobs[0] != jobs[1]  # each run was its own SLURM job, seen from inside it
    assert (sweep / ".submitit").is_dir() and "ok" in (sweep / "summary.md").read_text()
    # SLURM's own record of both (sacct reads the job-completion log of this accounting-less cluster)
    sacct = subprocess.run(["sacct", "--completion", "-j", ",".join(jobs), "-o", "JobID,State,ExitCode"],
                           env=slurm_env, capture_output=True, text=True, timeout=30)
    print(f"SLURM jobs {jobs}\n{sacct.stdout}")
    states = {line.split()[0]: line.split()[1] for line in sacct.stdout.splitlines()[2:] if len(line.split()) > 1}
    assert states.get(jobs[0]) == "COMPLETED" and states.get(cancelled) == "CANCELLED", sacct.stdout

    # a 2-node job: one task per node, node 0 owns the run dir, node 1 follows; the same losses as the 1-node run
    two = subprocess.run([*cli_command(), "-m", "parallelism.nnodes=2", "parallelism.nproc_per_node=1",
                          "train.steps=5", *FAST, f"paths.root={tmp_path}", "sweep.name=two", *ON_THIS_CLUSTER],
                         cwd=REPO, env=slurm_env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    (run_dir,) = [p.parent for p in (tmp_path / "sweeps" / "two").glob("*/summary.json")]
    summary = json.loads((run_dir / "summary.json").read_text())
    seen = slurm_env_of(run_dir)
    assert summary["status"] == "ok" and summary["world_size"] == 2 and seen["SLURM_NNODES"] == "2"
    assert (run_dir / "launcher.node1.log").exists()
    losses = [[json.loads(line)["loss/loss"] for line in (d / "metrics.jsonl").read_text().splitlines()]
              for d in (run_dir, ok_dir)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


def queued(job: str, env: dict) -> str:
    """The SLURM states of a job (one a line for an array's tasks); empty once it left the queue."""
    return subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True,
                          timeout=30).stdout.strip()


def test_a_job_slurm_never_allocates_is_announced_then_recorded_as_a_timeout_row(tmp_path, slurm_env):
    """Every slot of the cluster held by other jobs (its partition shares a core among 4 jobs, so an array of 16
    fills both nodes and queues the rest): the sweep's job pends; the sweep says so (after 30 s, or halfway to a
    shorter bound), cancels it at sweep.allocation_timeout_s and ends with its row, instead of waiting silently
    for ever."""
    blocker = subprocess.run(["sbatch", "--parsable", "--array=0-15", "-p", "debug", "-o", "/dev/null",
                              "--wrap", "sleep 600"], env=slurm_env, capture_output=True, text=True, timeout=30,
                             check=True).stdout.strip().split(";")[0]
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not {"RUNNING", "PENDING"} <= set(queued(blocker, slurm_env).split()):
            time.sleep(0.5)
        assert {"RUNNING", "PENDING"} <= set(queued(blocker, slurm_env).split())  # full, and a queue behind it
        started = time.time()
        proc = subprocess.run([*cli_command(), "-m", "train.steps=5", *FAST, f"paths.root={tmp_path}",
                               "sweep.name=pending", "sweep.allocation_timeout_s=16", *ON_THIS_CLUSTER], cwd=REPO,
                              env=slurm_env, capture_output=True, text=True, timeout=300)
        took = time.time() - started
    finally:
        subprocess.run(["scancel", blocker], env=slurm_env, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]  # the sweep ended with its table, not a traceback
    (summary_path,) = (tmp_path / "sweeps" / "pending").glob("*/summary.json")
    row = json.loads(summary_path.read_text())
    announced = [line for line in proc.stderr.splitlines() if "waiting for SLURM to allocate job" in line]
    print(f"{announced[0] if announced else '(no announcement)'}\nrow: {row['status']}: {row['reason']} "
          f"(sweep took {took:.0f} s)")
    assert announced and "(PENDING: " in announced[0] and "sweep.allocation_timeout_s=16 s" in announced[0]
    assert row["status"] == "timeout" and "SLURM never allocated job" in row["reason"], row
    job = row["reason"].split("job ")[1].split()[0]
    assert queued(job, slurm_env) == ""  # cancelled: it will not start later behind the sweep's back
    assert took < 90


def losses_of(run_dir: Path) -> dict:
    return {r["step"]: r["loss/loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_a_job_signalled_before_its_time_limit_saves_is_requeued_and_resumes_to_the_same_losses(tmp_path, slurm_env):
    """A job submitted with SLURM's --signal (submitit's USR2, hydra.launcher.signal_delay_s before the limit)
    gets USR2 in every process of its step after its 40th step: the signal SLURM sends at that time, sent now
    with `scancel --signal` (SLURM sends it up to 60 s early, so a timer-driven drill never knows which step it
    interrupts). The ranks agree on it at a step boundary, save there and stop; the row of that attempt says so;
    submitit requeues the job with train.resume=auto (a requeued job waits cred_expire=10 s here); the next
    attempt resumes from the checkpoint and finishes. The sweep's row is ok and reads "resumed from step k",
    and every step's loss equals an uninterrupted run's, bit for bit."""
    steps = 120
    common = [f"train.steps={steps}", "backend=fsdp", *FAST]
    sweep = tmp_path / "sweeps" / "preempt"
    proc = subprocess.Popen([*cli_command(), "-m", *common, f"paths.root={tmp_path}", "sweep.name=preempt",
                             *ON_THIS_CLUSTER, "hydra.launcher.signal_delay_s=90",
                             # submitit counts a signal within 10 minutes of a limit as a time-out
                             "hydra.launcher.max_num_timeout=1"],
                            cwd=REPO, env=slurm_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        run_dir = None
        while time.time() < deadline:
            found = [p.parent for p in sweep.glob("*/metrics.jsonl")]
            if found and len(losses_of(found[0])) >= 40 and job_of(found[0]):
                run_dir = found[0]
                break
            time.sleep(0.2)
        assert run_dir, list(sweep.glob("*/*"))
        seen = slurm_env_of(run_dir)
        task = (f"{seen['SLURM_ARRAY_JOB_ID']}_{seen['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_JOB_ID" in seen
                else seen["SLURM_JOB_ID"])
        subprocess.run(["scancel", "--signal=USR2", task], env=slurm_env, check=True, timeout=30)
        # the uninterrupted run, on this machine while SLURM holds the requeued job
        reference = subprocess.run([*cli_command(), *common, f"paths.root={tmp_path}",
                                    f"hydra.run.dir={tmp_path}/reference"], cwd=REPO,
                                   env={k: v for k, v in slurm_env.items() if not k.startswith("SLURM_J")},
                                   capture_output=True, text=True, timeout=300)
        assert reference.returncode == 0, reference.stderr[-3000:]
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    first = json.loads((run_dir / "attempts" / "1" / "summary.json").read_text())
    row = json.loads((run_dir / "summary.json").read_text())
    resumed_from = row["figures"]["checkpoint/resumed_from_step"]
    print(f"first attempt: {first['status']}: {first['reason']}\nfinal attempt: {row['status']}, resumed from "
          f"step {resumed_from}; SLURM restarts: {slurm_env_of(run_dir).get('SLURM_RESTART_COUNT')}")
    assert first["status"] == "failed" and first["reason"].startswith("preempted: SIGUSR2 arrived"), first
    assert first["figures"]["train/steps_completed"] == resumed_from >= 40
    assert row["status"] == "ok" and f"resumed from step {resumed_from:.0f}" in " ".join(row["notes"])
    table = (sweep / "summary.md").read_text()  # the sweep's row
    assert "| resumed from step |" in table.splitlines()[0] and f"| {resumed_from:.0f} |" in table.splitlines()[2]
    assert slurm_env_of(run_dir).get("SLURM_RESTART_COUNT") == "1"  # SLURM's own count: requeued once
    assert "resume: auto" in (run_dir / "config.yaml").read_text()  # submitit requeued it with train.resume=auto
    trained = {**losses_of(run_dir / "attempts" / "1"), **losses_of(run_dir)}
    assert trained == losses_of(tmp_path / "reference")  # every step, bit for bit

"""Faults outside the ranks: W&B that cannot be reached, and a disk with no room. Real runs, real sockets,
a real full filesystem (a 1 MiB tmpfs); and a NaN loss that a run trains on, as a cell of the two-rank launch."""
from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest

from conftest import REPO, cli, cli_command

SECRET = "0123456789abcdef0123456789abcdef01234567"  # a well-formed W&B key that no server accepts


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A real, small filesystem at `path` for the test's life (mounting needs root: skip otherwise)."""
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root; tests/test_cli.py covers the free-space rule with "
                    "paths.min_free_mib")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(path) -> None:
    """Write zeros until the filesystem refuses (ENOSPC), as a sweep's logs and checkpoints would."""
    with pytest.raises(OSError, match="No space left"), open(path, "wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


@pytest.mark.slow
@pytest.mark.drill  # an environment fault drill (19 s): make test-drills and CI, to keep make test under 10 min
@pytest.mark.parametrize("case, env, says", [
    # port 9 (discard) on localhost refuses the connection: W&B's server is down or unreachable
    ("unreachable", {"WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_API_KEY": SECRET}, "CommError"),
    # online mode asked for, but no API key anywhere (an empty home: no netrc)
    ("no API key", {"WANDB_API_KEY": "", "HOME": "{tmp}/home"}, "No API key configured"),
])
def test_wandb_failure_still_trains_and_writes_local_results_with_a_warning(tmp_path, case, env, says):
    (tmp_path / "home").mkdir()
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    # one rank: only rank 0 talks to W&B, and a rank's imports are most of a run's cost
    proc = cli("logger.mode=online", "logger.init_timeout_s=5", "train.profile_memory=false", "train.steps=4", "train.warmup_steps=1",
               "parallelism.nproc_per_node=1",
               "train.measure_flops=false", f"paths.root={tmp_path}", "hydra.run.dir=${paths.root}/runs/wandb-down",
               env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "wandb-down"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    # the user is told, on the terminal and in the summary, why the run is not online
    warning = next(w for w in summary["warnings"] if w.startswith("W&B unavailable (online), local results only"))
    assert says in warning and f"shardbench: warning: {warning}" in proc.stderr
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []


def test_a_full_disk_is_refused_before_any_rank_starts(tmp_path):
    with tmpfs(tmp_path / "full", "1m") as full:
        # fill it, as a sweep's logs and checkpoints would: the next write fails with ENOSPC
        fill(full / "filler")
        started = time.time()
        proc = cli(f"paths.root={full}", "logger=none")
        elapsed = time.time() - started
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1].startswith(
            f"shardbench: invalid config: paths.root={full}: only 0 MiB free"), proc.stderr
        assert "Traceback" not in proc.stderr and elapsed < 10
        assert [p.name for p in full.rglob("*")] == ["filler"]  # nothing was created, no rank started


@pytest.mark.slow
def test_a_nan_loss_with_on_nonfinite_continue_trains_on_and_counts_the_steps(nan_runs):
    # a cell of the two-rank launch (conftest.two_rank_sweeps): fault.kind=nan on rank 1 at step 3 of 6
    _, records, run_dir = nan_runs["ddp"]
    summary = json.loads((run_dir / "summary.json").read_text())  # as written: strict JSON
    assert summary["status"] == "ok", summary.get("reason")
    # NaN poisons the weights through the gradient all-reduce: steps 3, 4 and 5 are non-finite, and are
    # written as JSON null (strict JSON), not NaN
    assert [r["loss/loss"] is None for r in records] == [False, False, False, True, True, True]
    assert "NaN" not in (run_dir / "metrics.jsonl").read_text()
    assert summary["figures"]["loss/nonfinite_steps"] == 3 and summary["figures"]["loss/final_loss"] is None


@pytest.mark.slow
@pytest.mark.drill  # an environment fault drill (22 s): make test-drills and CI, to keep make test under 10 min
def test_a_disk_that_fills_during_a_sweep_fails_that_run_and_damages_nothing_earlier(tmp_path):
    with tmpfs(tmp_path / "disk", "8m") as disk:
        sweep_dir = disk / "sweeps" / "fill"
        proc = subprocess.Popen(
            [*cli_command(), "-m", "backend=ddp,fsdp,fsdp_grad_op", "train.steps=100", "train.warmup_steps=1",
             "logger=none", "train.measure_flops=false", f"paths.root={disk}", "paths.min_free_mib=1",
             "sweep.name=fill"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        fsdp = None
        while time.time() < deadline and fsdp is None:  # fill the disk once the second run is training
            fsdp = next((p for p in sweep_dir.glob("backend=fsdp,*/metrics.jsonl") if p.stat().st_size), None)
            time.sleep(0.1)
        ddp_summary = next(sweep_dir.glob("backend=ddp,*/summary.json"))
        ddp_before = ddp_summary.read_bytes()
        fill(disk / "filler")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]  # the sweep went on to its end
        assert "Traceback" not in err
        summary = json.loads((fsdp.parent / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["reason"].startswith("disk full:"), summary["reason"]
        assert ddp_summary.read_bytes() == ddp_before  # the earlier result is intact, byte for byte
        assert "[invalid] fsdp_grad_op" in out and "only 0 MiB free" in out  # the next run is a row, not a crash
        (disk / "filler").unlink()
        rebuilt = subprocess.run([*cli_command("report"), str(sweep_dir)], cwd=REPO, capture_output=True,
                                 text=True)
        assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
        table = (sweep_dir / "summary.md").read_text()
        assert "| ddp |" in table and "disk full" in table


@pytest.mark.slow
@pytest.mark.drill
def test_a_save_that_fills_the_disk_fails_naming_it_and_the_previous_checkpoint_resumes(tmp_path):
    """A real 16 MiB filesystem, filled (all but 128 KiB) once the checkpoint of step 3 is complete: the save of
    step 6 hits ENOSPC. The row says `disk full while saving step 6`, step 3's checkpoint is intact, and once
    there is room train.resume=auto goes on from it."""
    from harness.core.checkpoint_dirs import MARKER, damage, step_dir
    from harness.core.spawn import train_command

    with tmpfs(tmp_path / "disk", "16m") as disk:
        run_dir = disk / "runs" / "save"
        run = ("backend=ddp", "logger=none", "train.steps=12", "train.warmup_steps=1", "train.checkpoint_every=3",
               "train.measure_flops=false", "train.profile_memory=false", "train.breakdown_steps=0",
               "train.count_collectives=false", f"paths.root={disk}", "paths.min_free_mib=1")
        # rank 0 works 0.25 s more a step, so that the disk fills between two saves
        proc = subprocess.Popen(train_command(*run, "fault.kind=slow", "fault.slow_s=0.25", run_dir=run_dir),
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = step_dir(run_dir / "checkpoints", 3)
        deadline = time.time() + 120
        while time.time() < deadline and not (first / MARKER).exists():
            time.sleep(0.05)
        filler = disk / "filler"
        fill(filler)
        with open(filler, "r+b") as f:  # leave room for the metrics' lines, not for a checkpoint
            f.truncate(filler.stat().st_size - 128 * 1024)
        out, err = proc.communicate(timeout=300)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and "disk full while saving step 6" in summary["reason"], \
            summary["reason"] + err[-2000:]
        assert damage(first) is None and not (step_dir(run_dir / "checkpoints", 6) / MARKER).exists()
        filler.unlink()
        resumed = subprocess.run(train_command(*run, "train.resume=auto", run_dir=run_dir), cwd=REPO,
                                 capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        figures = json.loads((run_dir / "summary.json").read_text())["figures"]
        assert figures["checkpoint/resumed_from_step"] == 3

"""A save killed half-way leaves the previous checkpoint usable. Each checkpoint format once (FSDP2's DCP, saved
asynchronously; DeepSpeed ZeRO-2's own files): a real run saves every 2 steps and SIGKILLs rank 1 in the middle of
the save after step 4 (fault.kind=kill_in_save: its files written, the save not yet marked complete). The same
command again with train.resume=auto, in the same run dir, resumes from step 2 and trains steps 2 to 5, and the
steps both attempts ran have the same losses."""
from __future__ import annotations

import json
import subprocess

import pytest

from conftest import REPO
from harness.core.checkpoint_dirs import MARKER, latest, step_dir, step_of
from harness.core.spawn import command_argv, train_command

pytestmark = [pytest.mark.slow, pytest.mark.drill]
RUN = ("logger=none", "train.steps=6", "train.warmup_steps=1", "train.checkpoint_every=2", "train.measure_flops=false",
       "train.breakdown_steps=0", "train.profile_memory=false")


def losses(path) -> dict:
    return {r["step"]: r["loss/loss"] for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.parametrize("backend, extra", [("fsdp", ["train.checkpoint_async=true"]), ("ds_zero2", [])])
def test_a_save_killed_half_way_leaves_the_previous_checkpoint_and_auto_resumes_from_it(tmp_path, backend, extra):
    run_dir = tmp_path / backend

    def train(*overrides):
        return subprocess.run(train_command(f"backend={backend}", *RUN, *extra, *overrides, run_dir=run_dir),
                              cwd=REPO, capture_output=True, text=True, timeout=300)

    killed = train("fault.kind=kill_in_save", "fault.rank=1", "fault.step=4")
    assert killed.returncode != 0 and json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    checkpoints = run_dir / "checkpoints"
    assert (step_dir(checkpoints, 2) / MARKER).is_file()
    assert step_dir(checkpoints, 4).is_dir() and not (step_dir(checkpoints, 4) / MARKER).exists()  # half-written

    resumed = train("train.resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["figures"]["checkpoint/resumed_from_step"] == 2
    first, again = losses(run_dir / "attempts" / "1" / "metrics.jsonl"), losses(run_dir / "metrics.jsonl")
    assert sorted(again) == [2, 3, 4, 5] and {0, 1, 2, 3} <= set(first)
    assert [again[s] for s in (2, 3)] == pytest.approx([first[s] for s in (2, 3)], rel=1e-6, abs=0)
    # the run saved again on its way: the half-written step 4 was written over, and completed
    assert (step_dir(checkpoints, 4) / MARKER).is_file() and (step_dir(checkpoints, 6) / MARKER).is_file()


def test_a_rerun_never_overwrites_checkpoints_refuses_keeps_them_on_fresh_and_goes_on_with_auto(tmp_path):
    """A walkthrough re-ran a checkpointed run without train.resume=auto: it trained from step 0 and replaced the
    earlier step_<k> checkpoints in place. Now the same command is refused in one line naming both ways on;
    train.resume=fresh moves the checkpoints under attempts/ before training; train.resume=auto goes on."""
    run_dir = tmp_path / "ddp"

    def train(*overrides):
        return subprocess.run(train_command("backend=ddp", *RUN, *overrides, run_dir=run_dir), cwd=REPO,
                              capture_output=True, text=True, timeout=300)

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert train().returncode == 0
    checkpoints = run_dir / "checkpoints"
    before = files(checkpoints)
    assert (step_dir(checkpoints, 4) / MARKER).is_file() and before

    again = train()
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert again.returncode == 2 and len(lines) == 1, again.stderr[-1500:]
    assert "would overwrite" in lines[0] and "train.resume=auto" in lines[0] and "train.resume=fresh" in lines[0]
    assert files(checkpoints) == before  # not a byte changed
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "invalid"
    assert json.loads((run_dir / "attempts" / "1" / "summary.json").read_text())["status"] == "ok"  # kept

    fresh = train("train.resume=fresh")
    assert fresh.returncode == 0, fresh.stderr[-1500:]
    (moved,) = [p for p in (run_dir / "attempts").glob("*/checkpoints")]
    assert files(moved) == before and (step_dir(checkpoints, 4) / MARKER).is_file()

    auto = train("train.resume=auto", "train.steps=8")
    assert auto.returncode == 0, auto.stderr[-1500:]
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["figures"]["checkpoint/resumed_from_step"] == 6


def test_a_truncated_or_altered_checkpoint_is_named_before_any_rank_loads_it_and_auto_falls_back(tmp_path):
    """complete.json lists each file's size and digest. A checkpoint named by path whose file was truncated or
    altered is refused in one line naming the file; train.resume=auto passes over a damaged newest checkpoint to
    the previous intact one, and says so."""
    from harness.core.checkpoint_dirs import damage, read_marker

    run_dir = tmp_path / "ddp"

    def train(*overrides):
        return subprocess.run(train_command("backend=ddp", *RUN, *overrides, run_dir=run_dir), cwd=REPO,
                              capture_output=True, text=True, timeout=300)

    assert train().returncode == 0
    checkpoints = run_dir / "checkpoints"
    newest, previous = step_dir(checkpoints, 6), step_dir(checkpoints, 4)
    assert damage(newest) is None and set(read_marker(newest)["files"]) == {
        f.relative_to(newest).as_posix() for f in newest.rglob("*") if f.is_file() and f.name != MARKER}
    victim = max((f for f in newest.rglob("*") if f.is_file() and f.name != MARKER), key=lambda f: f.stat().st_size)
    victim.write_bytes(victim.read_bytes()[:-100])  # truncated
    altered = max((f for f in previous.rglob("*") if f.is_file() and f.name != MARKER), key=lambda f: f.stat().st_size)
    data = bytearray(altered.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one bit pattern flipped, the size unchanged
    altered.write_bytes(bytes(data))

    named = train(f"train.resume={newest}", "train.steps=8")
    lines = [line for line in named.stderr.splitlines() if line.strip()]
    assert named.returncode == 2 and len(lines) == 1 and victim.name in lines[0] and "truncated" in lines[0], lines
    named = train(f"train.resume={previous}", "train.steps=8")
    assert named.returncode == 2 and "altered since it was written" in named.stderr, named.stderr[-800:]

    auto = train("train.resume=auto", "train.steps=8")  # step 6 truncated, step 4 altered: step 2 is intact
    assert auto.returncode == 0, auto.stderr[-1500:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["figures"]["checkpoint/resumed_from_step"] == 2
    passed = [n for n in summary["notes"] if "train.resume=auto passed over" in n]
    assert len(passed) == 2 and f"train.resume=auto: resuming from {step_dir(checkpoints, 2)}" in summary["notes"]
    assert "step_0000006" in passed[0] and "truncated" in passed[0] and "altered" in passed[1]


def test_an_elastic_restart_goes_on_from_the_latest_checkpoint_records_itself_and_ends_with_unbroken_losses(tmp_path):
    """launch.max_restarts=1 (torchrun's --max-restarts): rank 1 SIGKILLs itself at step 5, torchelastic starts
    the group again, and it goes on from the step-3 checkpoint. The row records the restart (from which step, the
    cause, the steps redone, the time lost); metrics.jsonl holds each step once, the first attempt's steps 3-4 set
    aside; and every loss equals an uninterrupted run's, exactly (same seed, same data order)."""
    run = (*RUN, "train.steps=8", "train.checkpoint_every=3")  # the later value of a key wins

    def train(name, *overrides):
        done = subprocess.run(train_command("backend=ddp", *run, *overrides, run_dir=tmp_path / name), cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads((tmp_path / name / "summary.json").read_text())

    summary = train("restarted", "fault.kind=kill", "fault.rank=1", "fault.step=5", "launch.max_restarts=1")
    [restart] = summary["restarts"]
    assert summary["status"] == "ok" and summary["figures"]["launch/restarts"] == 1
    assert restart["resumed_from_step"] == 3 and restart["failed_at_step"] == 5 and restart["redone_steps"] == 2
    assert restart["cause"] == "fault.kind=kill on rank 1 at step 5" and 0 < restart["time_lost_s"] < 120
    restarted = losses(tmp_path / "restarted" / "metrics.jsonl")
    assert sorted(restarted) == list(range(8))
    assert sorted(losses(tmp_path / "restarted" / "restarts" / "1.metrics.jsonl")) == [3, 4]
    train("uninterrupted")
    assert restarted == losses(tmp_path / "uninterrupted" / "metrics.jsonl")


def test_resume_auto_in_the_default_run_dir_goes_on_in_the_unfinished_run_and_says_so(tmp_path):
    """After a run stopped, the line it prints says to add train.resume=auto. Without a named run dir, each run
    gets a new timestamped one: auto must find the newest unfinished run of the same config, go on there from
    its checkpoint, and say so in one line; with nothing to resume it says that too (issue 74)."""
    base = ("backend=ddp", *RUN, f"paths.root={tmp_path}")

    def train(*overrides):
        return subprocess.run(command_argv("train", *base, *overrides), cwd=REPO, capture_output=True, text=True,
                              timeout=300)

    fresh = train("train.resume=auto", "train.steps=3", "train.checkpoint_every=3")  # another config: not resumed
    assert fresh.returncode == 0 and "train.resume=auto: no unfinished run of this configuration" in fresh.stderr
    killed = train("fault.kind=kill", "fault.step=4")
    assert killed.returncode != 0
    first = max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert json.loads((first / "summary.json").read_text())["status"] == "failed"
    kept = latest(first / "checkpoints")
    auto = train("train.resume=auto", "train.checkpoint_keep=1")  # how many stay is not what the run is
    assert auto.returncode == 0, auto.stderr[-1500:]
    assert f"train.resume=auto: going on in {first}" in auto.stderr
    assert f"train.resume=auto: resuming from {kept}" in auto.stderr, auto.stderr
    summary = json.loads((first / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["figures"]["checkpoint/resumed_from_step"] == step_of(kept)
    assert len(list((tmp_path / "runs").iterdir())) == 2  # no new dir for the resumed run
    # train.checkpoint_keep=1: once step 6 was complete, the older ones went
    assert [p.name for p in (first / "checkpoints").iterdir()] == ["step_0000006"]
    assert summary["figures"]["checkpoint/deleted"] == step_of(kept) // 2

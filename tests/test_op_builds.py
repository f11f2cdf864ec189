"""DeepSpeed's JIT op builds never hang a later run (launcher/op_builds.py, shardbench warm-ops, launcher/ops.py).

In-process (make test): a lock nobody holds is stale and removed with one line; a lock a live process holds is
waited for visibly, then the wait ends when it goes, or at its bound with the op and the setting named; an op
counts as built only with shardbench's marker for these versions. Drills (make test-drills, CI), on real
builds of the shm comm op (which every DeepSpeed run needs): one SIGTERMed, which leaves nothing behind; one
SIGKILLed, after which a ds_zero1 run clears its stale lock, rebuilds and trains; during that rebuild another
run starts, waits visibly and uses it."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness.config.compose import compose
from harness.config.derive import jit_ops
from harness.launcher import op_builds
from harness.core.paths import extensions_dir
from harness.core.rundir import RunDir
from harness.core.waiting import WaitTimedOut, announced, wait_for
from harness.launcher.progress import Waits

# A process that holds a file open (as torch's FileBaton holds its lock while it builds) until the file goes.
HOLDER = ("import os, sys, time\nfd = os.open(sys.argv[1], os.O_CREAT | os.O_RDONLY)\nprint('held', flush=True)\n"
          "while os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n")


@pytest.fixture
def ext(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def holding(path: Path) -> subprocess.Popen:
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_nobody_holds_is_stale_and_removed_with_its_partial_build(ext):
    op = op_builds.op_dir("cpu_adam")
    op.mkdir()
    (op / "lock").touch()
    (op / "cpu_adam.o").write_bytes(b"half")  # what a killed compile leaves
    said = []
    assert op_builds.clear_stale("cpu_adam", said.append)
    assert not op.exists()
    assert len(said) == 1 and "removed a stale build lock of DeepSpeed's cpu_adam" in said[0], said
    assert not op_builds.clear_stale("cpu_adam", said.append) and len(said) == 1  # nothing left to clear


def test_a_lock_a_live_process_holds_is_waited_for_visibly_then_the_turn_is_ours(ext):
    lock = op_builds.op_dir("cpu_adam") / "lock"
    proc = holding(lock)
    said = []
    try:
        assert op_builds.lock_holders(lock) == [proc.pid]
        assert not op_builds.clear_stale("cpu_adam", said.append)  # live: never removed

        def release_soon(line):
            said.append(line)
            lock.unlink()  # the build ends: torch's FileBaton removes its lock

        lease = op_builds.take_turn("cpu_adam", bound_s=30, say=release_soon)
    finally:
        proc.wait(timeout=10)
    try:
        assert len(said) == 1 and f"waiting for another process (pid {proc.pid}) building cpu_adam since" in said[0]
        assert "ops.build_timeout_s=30 s" in said[0]
        # the lease is ours: another shardbench build of the op waits for it, naming this process
        with pytest.raises(WaitTimedOut, match=rf"another process \(pid {os.getpid()}\) building cpu_adam"):
            op_builds.take_turn("cpu_adam", bound_s=0.3, say=said.append)
    finally:
        lease.release()


def test_a_live_build_that_never_ends_times_out_naming_the_op_and_the_setting(ext):
    lock = op_builds.op_dir("deepspeed_shm_comm") / "lock"
    proc = holding(lock)
    try:
        with pytest.raises(WaitTimedOut) as err:
            op_builds.take_turn("deepspeed_shm_comm", bound_s=1.0, say=lambda line: None)
    finally:
        lock.unlink()
        proc.wait(timeout=10)
    assert "building deepspeed_shm_comm" in str(err.value) and "ops.build_timeout_s=1 s" in str(err.value)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_warm_ops_stopped_by_a_signal_says_so_and_leaves_nothing_behind(ext, sig):
    """warm_ops waiting its turn (this test holds the op's build lease) is stopped by each signal a closed
    terminal, Ctrl-C or a scheduler sends: it exits 128+N with one line, and neither its lease nor a partial
    build is left (a real build interrupted mid-compile is the drills' case)."""
    from harness.core.runlock import RunLock, holder

    lease = RunLock(ext, name=op_builds.lease_name("cpu_adam")).acquire()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "harness", "warm-ops", "--only", "cpu_adam"], cwd=REPO,
                                env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert "waiting for another process" in proc.stdout.readline()
        proc.send_signal(sig)
        out = proc.communicate(timeout=30)[0]
    finally:
        lease.release()
    assert proc.returncode == 128 + sig, out
    assert f"{sig.name} while building DeepSpeed's cpu_adam op" in out, out
    assert holder(ext, op_builds.lease_name("cpu_adam")) is None and not op_builds.op_dir("cpu_adam").exists()


def test_built_means_marked_for_these_versions_with_no_lock(ext):
    op = op_builds.op_dir("cpu_adam")
    op.mkdir()
    (op / "cpu_adam.so").write_bytes(b"")
    assert not op_builds.is_built("cpu_adam")  # an unmarked .so may be a half-linked one
    op_builds.write_marker("cpu_adam", loaded=True, seconds=1.0)
    assert op_builds.is_built("cpu_adam")
    (op / "lock").touch()
    assert not op_builds.is_built("cpu_adam")
    (op / "lock").unlink()
    marker = json.loads((op / op_builds.MARKER).read_text())
    (op / op_builds.MARKER).write_text(json.dumps({**marker, "deepspeed": "0.0.1"}))
    assert not op_builds.is_built("cpu_adam")  # built against another DeepSpeed


def test_the_ops_a_run_needs_follow_its_backend():
    assert jit_ops(compose(["backend=ddp"])) == []
    assert jit_ops(compose(["backend=ds_zero2"])) == ["deepspeed_shm_comm"]
    assert jit_ops(compose(["backend=ds_zero3_offload"])) == ["cpu_adam", "deepspeed_shm_comm"]


def test_the_advisors_replays_have_their_ops_built_first_in_the_parent_or_keep_the_roofline(ext, tmp_path,
                                                                                            monkeypatch):
    """A CPU plan replays its candidates on real tensors: the ops they load are built before any replay starts,
    in one build for all (not silently inside a replay, as CPU Adam was for the offload candidates of the default
    dry run in a fresh clone); where that build fails, the candidates needing it are not replayed."""
    from harness.config.derive import identity
    from harness.core.records import RunSummary
    from harness.launcher import ops
    from harness.studies.advise.step_times import ops_first

    configs = {b: compose([f"backend={b}", f"paths.root={tmp_path}"]) for b in ("ddp", "ds_zero2", "ds_zero3_offload")}
    asked = []
    monkeypatch.setattr(ops, "_build", lambda cfg, run_dir, env, missing, log_name: asked.append(missing))
    replays = dict(configs)
    assert ops_first(configs["ddp"], replays) == "" and replays == configs
    assert [sorted(m) for m in asked] == [["cpu_adam", "deepspeed_shm_comm"]]  # none built in `ext`: both, once
    failed = RunSummary.failed(identity(configs["ddp"]), "the JIT ops were not ready: no C++ compiler")
    monkeypatch.setattr(ops, "_build", lambda cfg, run_dir, env, missing, log_name: failed)
    said = ops_first(configs["ddp"], replays)
    assert list(replays) == ["ddp"]
    assert said == "2 not replayed, their ops not built (the JIT ops were not ready: no C++ compiler): at the " \
                   "roofline lower bound"


def test_a_wait_is_announced_with_its_start_and_bound_then_ends_at_the_bound():
    said, calls = [], []
    found = wait_for(lambda: (calls.append(1), "ready" if len(calls) > 3 else None)[1], "the thing", 30, "x.bound_s",
                     say=said.append, poll_s=0.01, after_s=0.0)
    assert found == "ready" and len(said) == 1 and said[0].startswith("shardbench: waiting for the thing since ")
    assert said[0].endswith("(waited 0 s; gives up after x.bound_s=30 s)")
    with pytest.raises(WaitTimedOut, match=r"gave up waiting for the thing after \d+ s \(x.bound_s=0.2 s\)"):
        wait_for(lambda: None, "the thing", 0.2, "x.bound_s", say=said.append, poll_s=0.01)


def test_the_parent_announces_a_rank_wait_that_lasts(tmp_path):
    run_dir = RunDir(tmp_path)
    run_dir.ranks.mkdir()
    said = []
    waits = Waits(compose([]), run_dir, say=said.append)
    waits.start.since -= 60  # the ranks have been starting for a minute
    waits.poll()
    assert len(said) == 1 and "waiting for the ranks to start" in said[0]
    with announced(run_dir.rank_wait(0), "W&B to start its offline run", "logger.init_timeout_s=60 s"):
        waits.poll()
        assert len(said) == 1  # just begun: not yet worth a line
        wait = json.loads(run_dir.rank_wait(0).read_text())
        run_dir.rank_wait(0).write_text(json.dumps({**wait, "since": wait["since"] - 31}))
        waits.poll()
        waits.poll()  # announced once, not every poll
    assert not run_dir.rank_wait(0).exists()
    assert len(said) == 2 and "W&B to start its offline run (rank 0)" in said[1]
    assert "gives up after logger.init_timeout_s=60 s" in said[1]


@pytest.mark.drill  # the launcher waiting on a real run (3 s): make test-drills and CI, for make test's 5 minutes
def test_a_run_whose_op_is_never_ready_ends_as_timeout_before_any_rank_starts(tmp_path):
    """Another process holds the shm comm op's build and never finishes: the run waits ops.build_timeout_s,
    visibly, then ends `timeout` naming the op; no rank started. A real CLI run without torch (about 3 s)."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    holder = holding(lock)
    run_dir = tmp_path / "runs" / "zero2"
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", "train", "backend=ds_zero2", "logger=none",
                               "ops.build_timeout_s=2", f"hydra.run.dir={run_dir}", f"paths.root={tmp_path / 'runs'}"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    finally:
        lock.unlink()
        holder.wait(timeout=10)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"waiting for another process (pid {holder.pid}) building deepspeed_shm_comm since" in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "timeout", summary
    assert "gave up waiting for another process" in summary["reason"] and "ops.build_timeout_s=2 s" in summary["reason"]
    assert not (run_dir / "ranks").exists() or not any((run_dir / "ranks").iterdir())  # no rank ever started
    assert "gave up waiting" in (run_dir / "ops.log").read_text()


# ---------------------------------------------------------------- drills: real builds of the shm comm op, real runs
# the op every DeepSpeed run needs, and the quicker of the two to build (31 s here against cpu_adam's 47 s)
OP = "deepspeed_shm_comm"
RUN = ["backend=ds_zero1", "train.steps=3", "train.warmup_steps=1", "logger=none",
       "train.profile_memory=false", "train.breakdown_steps=0", "train.measure_flops=false"]
RUN_BOUND_S = 420  # a 3-step run (about 10 s here) plus a rebuild of the op (31-75 s here), with room


def fresh_extensions(tmp_path: Path) -> dict:
    """An extensions dir with every op but OP already built (copied from the clone's cache), so that a drill
    pays one build; the env that points a process at it."""
    ext = tmp_path / "torch_extensions"
    ext.mkdir()
    for built in Path(extensions_dir()).iterdir():
        if built.is_dir() and built.name != OP:
            shutil.copytree(built, ext / built.name, symlinks=True)
    return {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "PYTHONUNBUFFERED": "1"}


def start_warm_ops(env: dict, log: Path) -> subprocess.Popen:
    """Its output to a file: the compilers of a SIGKILLed build outlive it and would hold a pipe open."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "harness", "warm-ops"], cwd=REPO, env=env, text=True,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def until_compiling(env: dict, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    """Return once torch holds the op's lock and its compilers run (the build is under way)."""
    op = Path(env["TORCH_EXTENSIONS_DIR"]) / OP
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if (op / "lock").exists() and (op / "build.ninja").exists():
            time.sleep(5)  # well into the compile
            return
        time.sleep(0.2)
    raise AssertionError(f"warm_ops never started compiling {OP} (exit {proc.poll()})")


def start_train(env: dict, run_dir: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "harness", "train", *RUN, f"hydra.run.dir={run_dir}",
                                 f"paths.root={run_dir.parent}"], cwd=REPO, env=env, text=True,
                                stdout=subprocess.DEVNULL, stderr=err)


def finished(proc: subprocess.Popen, log: Path) -> str:
    proc.wait(timeout=RUN_BOUND_S + 60)
    return log.read_text()


@pytest.mark.drill
def test_stopped_builds_never_hang_a_run_and_a_run_during_a_build_waits_and_uses_it(tmp_path):
    """One real build for all of it (each costs ~40 s of compiling): a first build SIGTERMed, which cleans up; a
    second SIGKILLed, which leaves its lock; a run that clears that stale lock and rebuilds; and, during that
    rebuild, a second run that waits visibly and uses what the first built."""
    env = fresh_extensions(tmp_path)
    op = Path(env["TORCH_EXTENSIONS_DIR"]) / OP
    stopped = start_warm_ops(env, tmp_path / "stopped.log")
    until_compiling(env, stopped)
    stopped.send_signal(signal.SIGTERM)
    stopped.wait(timeout=60)
    out = (tmp_path / "stopped.log").read_text()
    # it cleans up after itself: no lock, no partial build, no compiler left
    assert stopped.returncode == 128 + signal.SIGTERM, out
    assert f"SIGTERM while building DeepSpeed's {OP} op" in out and not op.exists(), out
    assert not op_builds.leftovers(op.parent)

    killed = start_warm_ops(env, tmp_path / "killed.log")
    until_compiling(env, killed)
    assert "stale" not in (tmp_path / "killed.log").read_text()  # the SIGTERMed build left nothing to clear
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    # nothing ran on its way out: the lock and the partial build stay for the next run to find stale
    assert (op / "lock").exists() and not (op / op_builds.MARKER).exists()

    started = time.time()
    first = start_train(env, tmp_path / "runs" / "first", tmp_path / "first.log")
    until_compiling(env, first, timeout_s=RUN_BOUND_S)
    second, second_started = start_train(env, tmp_path / "runs" / "second", tmp_path / "second.log"), time.time()
    first_err = finished(first, tmp_path / "first.log")
    first_s = time.time() - started
    second_err = finished(second, tmp_path / "second.log")
    print(f"after a SIGKILLed build the next ds_zero1 run took {first_s:.0f} s, rebuild included; a run started "
          f"during that rebuild waited visibly and took {time.time() - second_started:.0f} s")
    assert first.returncode == 0, first_err[-3000:]
    assert f"removed a stale build lock of DeepSpeed's {OP}" in first_err, first_err[-3000:]
    assert f"building DeepSpeed's {OP} op" in first_err
    assert (op / op_builds.MARKER).exists()  # marked finished only by the build that loaded it
    # its usual time (11 s here on a warm cache) plus the rebuild, which the marker records
    rebuild_s = json.loads((op / op_builds.MARKER).read_text())["build_s"]
    assert first_s < rebuild_s + 60, (first_s, rebuild_s)
    assert json.loads((tmp_path / "runs" / "first" / "summary.json").read_text())["status"] == "ok"

    assert second.returncode == 0, second_err[-3000:]
    assert re.search(rf"waiting for another process \(pid \d+\) building {OP} since", second_err), second_err
    assert f"{OP} op was built by another process; using it" in second_err, second_err
    assert f"building DeepSpeed's {OP} op" not in second_err  # it compiled nothing itself

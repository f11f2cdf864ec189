"""A replay process started before its configs are known (launcher/started_early.py), as the advisor's GPU dry run
starts it before its search (issue 73's 15 seconds): what it counts is what a replay started late counts, a batch
it cannot take runs as a process of its own, and a process that dies ends its batches as failed, not waited on."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from harness.config.compose import compose
from harness.launcher.replays import MODULE, replay_env, replay_work
from harness.launcher.started_early import StartedEarly
from harness.studies.predict.counted_shapes import at_depth


def _configs():
    cfg = compose(["model=tiny_llama", "backend=fsdp", "parallelism.nproc_per_node=2", "parallelism.seq_len=64"])
    return {f"d{d}": at_depth(cfg, d) for d in (1, 2)}


@pytest.mark.slow
def test_a_replay_started_before_its_configs_counts_what_one_started_after_them_counts(tmp_path):
    """Two batches (1 and 2 blocks, on fake tensors) handed to one early process, each replayed in a child forked
    from it at once: every op and collective equals a replay forked from this test's process, and the Python lines
    are within 5% (they differ by up to 1% from one process to the next, as tests/test_fake_replay.py says)."""
    from forked_ranks import ForkedPopen

    configs = _configs()
    late = replay_work(configs, tmp_path / "late", jobs=1, popen=ForkedPopen, fake=True)
    with StartedEarly(replay_env(configs["d1"])) as early:
        handed = replay_work(configs, tmp_path / "early", jobs=2, popen=early.popen, fake=True)
        assert early.handed == 2  # both batches went to the early process, neither was started anew
    for name in configs:
        assert handed[name]["ok"] and late[name]["ok"], (handed[name].get("error"), late[name].get("error"))
        assert handed[name]["work"]["ops"] == late[name]["work"]["ops"]
        assert handed[name]["work"]["collectives"] == late[name]["work"]["collectives"]
        for phase, lines in late[name]["work"]["lines"].items():  # within 5%, as test_fake_replay holds lines
            assert abs(handed[name]["work"]["lines"][phase] - lines) <= 0.05 * lines, (name, phase)


@pytest.mark.slow
def test_deepspeed_loaded_early_replays_on_real_tensors_what_a_late_replay_counts(tmp_path):
    """A CPU plan's process (the advisor's search replays its candidates on real tensors) loads DeepSpeed and asks
    py-cpuinfo before forking (early.py, DeepSpeedFamily.preload_replays): ZeRO-2 with its optimizer offloaded
    (CPU Adam, which asks py-cpuinfo) and ZeRO-3 count the ops and collectives a replay forked from this test
    counts, and DeepSpeed's messages on stdout do not break the protocol."""
    from forked_ranks import ForkedPopen

    configs = {b: compose(["model=tiny_llama", f"backend={b}", "parallelism.nproc_per_node=2", "parallelism.seq_len=64",
                           "train.steps=2", "train.warmup_steps=1"]) for b in ("ds_zero2_offload", "ds_zero3")}
    late = replay_work(configs, tmp_path / "late", jobs=1, popen=ForkedPopen)
    with StartedEarly(replay_env(configs["ds_zero3"]), preload=["deepspeed"]) as early:
        handed = replay_work(configs, tmp_path / "early", jobs=2, popen=early.popen)
        assert early.handed == 2
    def by_op(work):  # each op's calls, FLOPs and bytes; not its cold bytes, which follow the allocator's addresses
        out = Counter()
        for phase, kind, op, dtype, flops, nbytes, _, _, n in work["ops"]:
            out[(phase, kind, op, dtype)] += n
            out[(phase, kind, op, dtype, "flops")] += flops * n
            out[(phase, kind, op, dtype, "bytes")] += nbytes * n
        return out

    for name in configs:
        assert handed[name]["ok"] and late[name]["ok"], (handed[name].get("error"), late[name].get("error"))
        assert by_op(handed[name]["work"]) == by_op(late[name]["work"]), name
        assert handed[name]["work"]["collectives"] == late[name]["work"]["collectives"], name


def test_a_batch_whose_environment_at_import_differs_runs_as_its_own_process(tmp_path):
    env = replay_env(_configs()["d1"])
    with StartedEarly(env) as early:
        other = {**env, "OMP_NUM_THREADS": "2"}  # read as torch imports: the early process cannot take it
        proc = early.popen([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"], env=other,
                           stdout=subprocess.PIPE, text=True)
        assert isinstance(proc, subprocess.Popen) and proc.communicate()[0].strip() == "2"
        assert early.handed == 0


def test_an_early_process_that_dies_ends_its_batches_as_failed(tmp_path):
    env = replay_env(_configs()["d1"])
    with StartedEarly(env) as early:
        handle = early.popen([sys.executable, "-m", MODULE, str(tmp_path), "--fake"], env=env)
        early.proc.kill()
        assert handle.wait() != 0 and handle.poll() == handle.returncode


def test_a_process_gone_before_its_first_batch_hands_it_to_a_process_of_its_own(tmp_path):
    env = replay_env(_configs()["d1"])
    with StartedEarly(env) as early:
        early.proc.kill()
        early.proc.wait()
        proc = early.popen([sys.executable, "-c", "print('own')"], env=env, stdout=subprocess.PIPE, text=True)
        assert isinstance(proc, subprocess.Popen) and proc.communicate()[0].strip() == "own"

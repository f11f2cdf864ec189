"""The collective benchmark reports bandwidth exactly as nccl-tests defines it, from 4 real gloo ranks over every
rank and over the two levels of 2 nodes of 2: in make test the ranks are forked from the test process
(tests/forked_ranks.py: the same worker code, without 4 ranks' imports, ~6 s here), and the whole command, torchrun
and all, runs with the drills."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from harness.studies.timing import busbw, collectives
from harness.theory.time import CommTable


@pytest.mark.parametrize("n, factors", [
    (2, {"all_reduce": 1.0, "reduce_scatter": 0.5, "all_gather": 0.5, "broadcast": 1.0}),
    (8, {"all_reduce": 1.75, "reduce_scatter": 0.875, "all_gather": 0.875, "broadcast": 1.0}),
])
def test_bus_bandwidth_follows_nccl_tests(n, factors):
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and
    # all-gather, 1 for broadcast; algbw = size / time
    for op, factor in factors.items():
        got = busbw.bandwidths(op, 1_000_000_000, 0.5, n)
        assert got["algbw_gbps"] == pytest.approx(2.0)
        assert got["busbw_gbps"] == pytest.approx(2.0 * factor)
    # reduce-scatter then all-gather moves what all-reduce moves
    assert busbw.bus_factor("reduce_scatter+all_gather", n) == busbw.bus_factor("all_reduce", n)
    with pytest.raises(ValueError):
        busbw.bus_factor("all_to_all", n)


def test_sizes_run_from_1kib_in_powers_of_four():
    assert busbw.sizes(256)[0] == 1024 and busbw.sizes(256)[-1] == 256 * 2**20
    assert all(b == 4 * a for a, b in zip(busbw.sizes(256), busbw.sizes(256)[1:]))


LEVELS = {"world": (4, 2), "intra_node": (2, 1), "inter_node": (2, 2)}  # level: (ranks, nodes it spans)


def check_rows(out, rows) -> None:
    assert {(r["level"], r["op"], r["size_bytes"]) for r in rows} == {
        (level, op, s) for level in LEVELS for op in busbw.OPS for s in (1024, 4096)}
    for r in rows:
        assert (r["ranks"], r["nnodes"]) == LEVELS[r["level"]] and r["time_s"] > 0 and r["device"] == "cpu"
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * busbw.bus_factor(r["op"], r["ranks"]))
    assert (out / "collectives.png").stat().st_size > 5000 and "busbw" in (out / "collectives.md").read_text()
    # the time model prices a collective from the rows of its own group size and level
    table = CommTable(rows, "cpu", 4)
    assert table.measured
    for level, (ranks, nodes) in LEVELS.items():
        row = next(r for r in rows if r["level"] == level and r["op"] == "all_gather" and r["size_bytes"] == 4096)
        assert table.seconds("all_gather", 4096, ranks, nodes > 1) == pytest.approx(row["time_s"])


def test_4_gloo_ranks_report_every_op_size_and_level_and_the_time_model_reads_each_level(tmp_path):
    # 4 ranks taken as 2 nodes of 2: every op over the world, over each node's pair, and over the pairs that
    # take one rank from each node; two sizes, 3 timed iterations each (what is tested is the bookkeeping)
    from forked_ranks import run_ranks
    from harness.config.compose import compose
    from harness.studies.timing import collectives_worker

    run_ranks(collectives_worker.run, 4, tmp_path, 0.00390625, "cpu", 2, 3)
    rows = json.loads((tmp_path / "collectives.json").read_text())
    collectives.report(rows, tmp_path, compose(["logger=none", "parallelism.nproc_per_node=4"]), "forked")
    check_rows(tmp_path, rows)


@pytest.mark.drill
def test_the_collectives_command_runs_4_ranks_under_torchrun_and_reports_them(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "collectives", "--max-mib", "0.00390625", "--iters", "3",
                           "--out", str(tmp_path), "--ranks-per-node", "2", "parallelism.nproc_per_node=4",
                           "logger=none"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    check_rows(tmp_path, json.loads((tmp_path / "collectives.json").read_text()))

"""The real strategy code at a world of 64, on fake tensors over a fake process group
(harness/runtime/simulate/traced.py), against the memory and communication model (`make scale-check`'s cheap cell):
llama_1b under FSDP2 in bf16, full shard and HSDP (8 nodes of 8), and a backend that cannot be traced, tried beside
it, with its cause."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from harness.config.compose import compose
from harness.runtime import models
from harness.studies.predict import scale_check

# with the drills (make test-drills, CI's second stage): a study's grid end to end, 5 cells traced at 64 ranks in 3
# processes (~30 s alone, ~75 s beside make test's launches), which kept make test over its 5 minutes
pytestmark = [pytest.mark.slow, pytest.mark.drill]
CELL = ["--models", "llama_1b", "--wide", "", "--worlds", "64", "--backends", "fsdp,fsdp_hsdp", "--probe-backends", "ddp",
        "--precisions", "bf16", "--checkpointing", "off", "--tp-grid", "llama_1b:64:2:selective_op_half", "--jobs", "2",
        "--cp-grid", "none", "--ep-grid", "none"]  # the long-sequence and MoE grids are minutes a cell


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale_check")
    proc = subprocess.run([sys.executable, "-m", "harness", "scale-check", *CELL, "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    rows = json.loads((out / "scale_check.json").read_text())
    return proc, out, {r["backend"] + (f"-tp{r['tp']}" if r.get("tp", 1) > 1 else "")
                       + (f"-{r['policy']}" if r.get("policy", "none") != "none" else ""): r for r in rows}


def test_fsdp2_at_64_ranks_allocates_and_sends_what_theory_says(grid):
    proc, out, rows = grid
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = rows["fsdp"]
    assert r["ok"] and r["world"] == 64, r.get("error")
    # every state is sharded 64 ways: 4 bytes of fp32 parameter, 4 of gradient and 8 of Adam state per parameter
    params = models.param_count(compose(["model=llama_1b"]).model)["total"]
    assert abs(sum(r["states_traced"].values()) - 16 * params / 64) <= 0.01 * 16 * params / 64, r["states_traced"]
    assert abs(r["states_error_pct"]) <= scale_check.THRESHOLDS["states"]
    assert abs(r["peak_error_pct"]) <= scale_check.THRESHOLDS["peak"], (r["peak_traced"], r["peak_terms_predicted"])
    assert abs(r["bytes_error_pct"]) <= scale_check.THRESHOLDS["bytes"], (r["collectives_traced"],
                                                                          r["collectives_predicted"])
    # each of the 16 blocks is gathered for its forward and again for its backward, the root once: over the
    # whole world, as full sharding does
    gathers = sum(c["count"] for c in r["collectives_traced"] if c["op"] == "all_gather")
    assert gathers == 2 * 16 + 1 and {c["group"] for c in r["collectives_traced"]} == {64}, r["collectives_traced"]
    assert "| llama_1b | fsdp | 64 | 1 | bf16 | off |" in (out / "scale_check.md").read_text()
    # the caching allocator replayed over the traced step (theory/allocator.py): the log saw what the tracker
    # counted, and the blocks handed out and the segments reserved lie above it
    held = r["allocator_traced"]
    assert held["live"] == r["peak_traced"]["total"] <= held["allocated"] <= held["reserved"], held


def test_hsdp_at_64_ranks_shards_inside_the_node_and_sends_only_the_gradient_shards_across(grid):
    proc, out, rows = grid
    r = rows["fsdp_hsdp"]
    assert r["ok"] and r["world"] == 64, r.get("error")
    # the states are sharded over a node's 8 ranks, not 64
    params = models.param_count(compose(["model=llama_1b"]).model)["total"]
    assert abs(sum(r["states_traced"].values()) - 16 * params / 8) <= 0.01 * 16 * params / 8, r["states_traced"]
    for what in ("states", "peak", "bytes"):
        assert abs(r[f"{what}_error_pct"]) <= scale_check.THRESHOLDS[what], (what, r[f"{what}_error_pct"])
    # gathers and reduce-scatters in the node's group of 8; across nodes, the replicas' all-reduce of each
    # gradient shard (groups of 8 ranks a node apart), as the theory splits them
    assert r["inter_node_bytes"] == pytest.approx(r["inter_node_bytes_predicted"], rel=0.01)
    assert r["inter_node_bytes"] < r["bytes_per_step"] / 5
    assert {c["group"] for c in r["collectives_traced"] if c["op"] == "all_gather"} == {8}


def test_a_backend_that_cannot_be_traced_is_a_row_with_its_cause(grid):
    _, out, rows = grid
    r = rows["ddp"]
    # DistributedDataParallel's construction reads its parameters' data (its shape check across ranks)
    assert not r["ok"] and "data is not allocated" in r["error"] and "ddp/strategy.py" in r["where"], r
    assert f"not traced: {r['error']}" in (out / "scale_check.md").read_text()


def test_a_second_run_reuses_the_cells_already_traced(grid):
    _, out, rows = grid
    before = (out / "cells.jsonl").read_text()
    cells = [scale_check.cell_overrides("llama_1b", b, 64, "bf16", False, []) for b in ("fsdp", "ddp")]
    again = scale_check.run_grid(cells, out)  # in this process: no worker is started for a cell already there
    assert (out / "cells.jsonl").read_text() == before
    assert [r["backend"] for r in again] == ["fsdp", "ddp"] and again[0]["peak_bytes"] == rows["fsdp"]["peak_bytes"]


def test_fsdp2_and_ddp_with_tensor_parallelism_at_64_ranks_hold_send_and_peak_as_theory_says(grid):
    # dp 32 x tp 2 inside nodes of 8: each rank holds its shard of the model (the projections, the embedding and
    # the output layer halved, the norms whole), sends the tensor-parallel collectives of every block inside its
    # node and FSDP2's (or replicate's) over the data-parallel ranks across nodes
    _, out, rows = grid
    for backend in ("fsdp-tp2", "ddp-tp2"):
        r = rows[backend]
        assert r["ok"] and r["world"] == 64 and r["tp"] == 2, r.get("error")
        for what in ("states", "peak", "bytes"):
            assert abs(r[f"{what}_error_pct"]) <= scale_check.THRESHOLDS[what], (backend, what, r[f"{what}_error_pct"])
        assert r["intra_node_bytes"] == pytest.approx(r["intra_node_bytes_predicted"], rel=0.01)
        assert r["inter_node_bytes"] == pytest.approx(r["inter_node_bytes_predicted"], rel=0.01)
        tp_groups = {c["group"] for c in r["collectives_traced"] if c["size_bytes"] == 4 * 2048 * 2048 * 2}
        assert tp_groups == {2}, r["collectives_traced"]  # b·s·h in bf16: the tensor-parallel group's
    assert "| llama_1b | fsdp | 64 | 2 | bf16 | off |" in (out / "scale_check.md").read_text()


def test_selective_checkpointing_under_tensor_parallelism_at_64_ranks_peaks_and_sends_as_theory_says(grid):
    # issue 73: torchtitan's policy at dp 32 x tp 2: a rank keeps its heads' and columns' share of the saved
    # matmuls and the rowwise partial sums whole, and its recompute reissues the block's tensor-parallel
    # collectives (the bytes)
    _, out, rows = grid
    for backend in ("fsdp-tp2", "ddp-tp2"):
        r, plain = rows[f"{backend}-selective_op_half"], rows[backend]
        assert r["ok"] and r["tp"] == 2, r.get("error")
        for what in ("states", "peak", "bytes"):
            assert abs(r[f"{what}_error_pct"]) <= scale_check.THRESHOLDS[what], (backend, what, r[f"{what}_error_pct"])
        assert r["peak_bytes"] < plain["peak_bytes"] and r["intra_node_bytes"] > plain["intra_node_bytes"]
    assert "| llama_1b | fsdp | 64 | 2 | bf16 | selective_op_half |" in (out / "scale_check.md").read_text()

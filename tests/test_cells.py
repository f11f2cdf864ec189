"""Cells of one launch (launcher/cells.py): a cell may resume what an earlier cell saved; when a cell fails, its
launch ends there and the cells after it go on in a new one; a cell that crashed natively runs once more."""
from __future__ import annotations

import json
import os

import pytest

from conftest import extensions_dir

FAST = ["logger=none", "train.steps=4", "train.warmup_steps=1", "profile=parity", "train.measure_flops=false",
        "train.breakdown_steps=0", "train.profile_memory=false"]


@pytest.mark.slow
@pytest.mark.drill  # launcher behaviour, about 40 s: four launches of five cells
def test_a_cell_resumes_an_earlier_cells_save_and_a_failed_cell_costs_only_its_row(tmp_path):
    # on a GPU the llama_1b sweep's cells after a refused one read "killed ... (killed by a signal?)", which
    # sends a user looking for a kill that never happened; and in CI one rank's heap corruption inside torch's
    # ring attention (gloo, CPU) once ended a 4-rank launch with 18 cells still to run
    from harness.launcher.cells import run_cells

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    saves = tmp_path / "first" / "checkpoints"
    # neither checkpoint exists when the launch starts: each resuming cell checks its own when it starts
    out = run_cells(tmp_path, [("first", ["train.checkpoint_every=2"]),
                               ("resumes", [f"train.resume={saves / 'step_0000002'}"]),
                               ("breaks", [f"train.resume={saves / 'step_0000003'}"]),  # never saved
                               ("crashes", ["fault.kind=segfault", "fault.rank=1", "fault.step=1"]),
                               ("after", [])],
                    [*FAST, "backend=ddp", f"paths.root={tmp_path}"], report=False)
    assert out["first"]["status"] == "ok" and out["resumes"]["status"] == "ok", (out["first"], out["resumes"])
    losses = {cell: [json.loads(line)["loss/loss"] for line in (tmp_path / cell / "metrics.jsonl").open()]
              for cell in ("first", "resumes")}
    assert len(losses["resumes"]) == 2 and losses["resumes"] == pytest.approx(losses["first"][2:], rel=1e-6)
    assert out["breaks"]["status"] != "ok", out["breaks"]
    assert "no complete checkpoint at" in out["breaks"]["reason"] and "step_0000003" in out["breaks"]["reason"]
    assert "earlier_attempts" not in out["breaks"]  # a Python failure is the row's: not run again
    # a native crash is run once more, from scratch, its first attempt kept; this one comes back, so it fails
    crashed = out["crashes"]
    assert crashed["status"] != "ok" and crashed["figures"]["launch/cell_reruns"] == 1, crashed
    assert crashed["reason"].count("SIGSEGV") == 2 or crashed["reason"].count("Segmentation fault") == 2, crashed
    first_attempt = tmp_path / "crashes" / crashed["earlier_attempts"][0]["dir"]
    assert (first_attempt / "ranks" / "rank1.fatal.txt").exists() and (first_attempt / "summary.json").exists()
    # the cells after a failed one ran, each launch's log kept
    assert out["after"]["status"] == "ok", out["after"]
    assert [p.name for p in sorted(tmp_path.glob("launcher*.log"))] == [
        "launcher.2.log", "launcher.3.log", "launcher.4.log", "launcher.log"]


def test_a_cell_whose_every_rank_left_no_outcome_is_reached_and_crashed_if_one_left_its_dump(tmp_path):
    # CI's crash (stop 92): every rank of cp/gqa/fsdp_selective died without an outcome file, the aborted one with
    # its faulthandler dump; read as "never started", the launch would have stopped there with every later cell
    from harness.config.compose import compose
    from harness.core.rundir import RunDir
    from harness.launcher.cells import _crashed, _reached

    cfg, cell = compose(["logger=none"]), RunDir(tmp_path / "cell")
    assert not _reached(cell, cfg) and not _crashed(cell, cfg)  # a cell its launch never started
    cell.ranks.mkdir(parents=True)
    cell.rank_fatal(0).write_text("")  # opened at the cell's start, empty: a rank SIGKILLed, not a crash
    assert _reached(cell, cfg) and not _crashed(cell, cfg)
    cell.rank_fatal(1).write_text("Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n")
    assert _reached(cell, cfg) and _crashed(cell, cfg)

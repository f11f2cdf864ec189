"""Cells of one launch (launcher/cells.py): a cell may resume what an earlier cell saved; when a cell fails, the
launch ends there, and the rows say so."""
from __future__ import annotations

import json
import os

import pytest

from conftest import extensions_dir

FAST = ["logger=none", "train.steps=4", "train.warmup_steps=1", "profile=parity", "train.measure_flops=false",
        "train.breakdown_steps=0", "train.profile_memory=false"]


@pytest.mark.slow
@pytest.mark.drill  # launcher behaviour, about 15 s: one launch of four cells
def test_a_cell_resumes_an_earlier_cells_save_and_a_failed_cell_ends_the_launch(tmp_path):
    # on a GPU the llama_1b sweep's cells after a refused one read "killed ... (killed by a signal?)", which
    # sends a user looking for a kill that never happened
    from harness.launcher.cells import run_cells

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    saves = tmp_path / "first" / "checkpoints"
    # neither checkpoint exists when the launch starts: each resuming cell checks its own when it starts
    out = run_cells(tmp_path, [("first", ["train.checkpoint_every=2"]),
                               ("resumes", [f"train.resume={saves / 'step_0000002'}"]),
                               ("breaks", [f"train.resume={saves / 'step_0000003'}"]),  # never saved
                               ("after", [])],
                    [*FAST, "backend=ddp", f"paths.root={tmp_path}"], report=False)
    assert out["first"]["status"] == "ok" and out["resumes"]["status"] == "ok", (out["first"], out["resumes"])
    losses = {cell: [json.loads(line)["loss/loss"] for line in (tmp_path / cell / "metrics.jsonl").open()]
              for cell in ("first", "resumes")}
    assert len(losses["resumes"]) == 2 and losses["resumes"] == pytest.approx(losses["first"][2:], rel=1e-6)
    assert out["breaks"]["status"] != "ok", out["breaks"]
    assert "no complete checkpoint at" in out["breaks"]["reason"] and "step_0000003" in out["breaks"]["reason"]
    assert out["after"]["status"] != "ok"
    assert out["after"]["reason"].startswith("not run: cell breaks failed first, which ends the launch"), out["after"]

"""Cells of one launch (launcher/cells.py) when a cell fails: the launch ends there, and the rows say so."""
from __future__ import annotations

import os

import pytest

from conftest import extensions_dir

FAST = ["logger=none", "train.steps=4", "train.warmup_steps=1", "profile=parity", "train.measure_flops=false",
        "train.breakdown_steps=0", "train.profile_memory=false"]


@pytest.mark.slow
@pytest.mark.drill  # launcher behaviour, about 12 s: one launch of three cells
def test_a_failed_cell_ends_the_launch_and_the_cells_after_it_name_it(tmp_path):
    # on a GPU the llama_1b sweep's cells after a refused one read "killed ... (killed by a signal?)", which
    # sends a user looking for a kill that never happened
    from harness.launcher.cells import run_cells

    os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
    out = run_cells(tmp_path, [("first", []), ("breaks", ["fault.kind=raise", "fault.step=2"]), ("after", [])],
                    [*FAST, "backend=ddp", f"paths.root={tmp_path}"], report=False)
    assert out["first"]["status"] == "ok", out["first"]
    assert out["breaks"]["status"] != "ok" and not out["breaks"]["reason"].startswith("not run"), out["breaks"]
    assert out["after"]["status"] != "ok"
    assert out["after"]["reason"].startswith("not run: cell breaks failed first, which ends the launch"), out["after"]

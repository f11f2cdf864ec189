"""The published-runs study (experiments/published/): every row names its source and card, and the theory's
figures for a row are what its config predicts; our counted FLOPs reproduce a source's stated MFU."""
from __future__ import annotations

import yaml

from harness.studies.predict import published


def test_the_rows_come_from_three_sources_with_their_cards_and_figures():
    spec = yaml.safe_load(published.ROWS.read_text())
    rows = spec["rows"]
    assert len(rows) >= 12 and len({r["source"] for r in rows}) >= 3
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"] in spec["sources"] and r["card"] in published.CARDS, r["id"]
        assert r["tokens_per_s_per_gpu"] > 0 and r["overrides"], r["id"]


def test_a_row_is_predicted_from_its_config_and_its_flops_match_the_sources_mfu():
    # llm-foundry's MPT-1B on 8 H100 at micro-batch 14, seq 2048: 45,455 tokens/s a GPU at 41.82% MFU by its
    # own formula; our FlopCounterMode count at that rate over the H100's 989 TFLOP/s must say the same
    (row,) = [r for r in yaml.safe_load(published.ROWS.read_text())["rows"] if r["id"] == "foundry-1b-8"]
    out = published.predict_row(row)
    assert abs(out["counted_mfu_pct"] / row["mfu_pct"] - 1) < 0.01, out["counted_mfu_pct"]
    # compute-bound at 8 GPUs: the roofline lies above what ran, by about (measured ÷ datasheet matmul rate) / MFU;
    # with no GPU measurement committed it is the datasheet's peak, 1/MFU
    at = published.card_rates("h100_80gb")["tflops"] / published.CARDS["h100_80gb"]["tflops"]
    assert 0.9 * at / 0.418 < out["roofline_over_published"] < 1.05 * at / 0.418
    assert out["mesh"] == "dp 8" and out["gpus"] == 8 and out["predicted_peak_gib"] > 1
    lines = published.table([out])
    assert lines[2].startswith("| foundry-1b-8 | llm_foundry_h100, H100 80GB BF16, 1b | H100 SXM 80GB | 8 |")

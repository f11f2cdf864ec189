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


def test_the_local_readme_copy_keeps_the_advisors_section_when_the_table_is_rewritten(tmp_path, monkeypatch):
    """`make advise-field` writes its section into the README's copy beside advisor.md; `make published`, run
    after it, rewrote the copy from the committed README and dropped that section. It now rewrites the copy from
    itself, as advise-field does for this table."""
    import json

    from harness.studies.advise import field

    monkeypatch.delenv("SHARDBENCH_SNAPSHOT", raising=False)
    from harness.core.paths import REPO

    committed = json.loads((REPO / "results" / "published" / "published.json").read_text())
    kinds = committed["memory_kinds"]
    # the copy, from the committed README
    published.write(committed["rows"][:2], tmp_path, committed["sources"], kinds, [])
    text = (tmp_path / "README.md").read_text()
    start = text.index(field.MARKERS[0]) + len(field.MARKERS[0])
    mine = text[:start] + "\nthe advisor's local table\n" + text[text.index(field.MARKERS[1]):]
    (tmp_path / "README.md").write_text(mine)
    published.write(committed["rows"][:3], tmp_path, committed["sources"], kinds, [])
    again = (tmp_path / "README.md").read_text()
    assert "the advisor's local table" in again
    table = again[again.index(published.MARKERS[0]):again.index(published.MARKERS[1])]
    assert all(r["id"] in table for r in committed["rows"][:3]), "the table is the new one"


def test_the_mpt_stand_in_has_the_parameter_count_llm_foundry_states():
    # llm-foundry's tables state each MPT's NumParams; the GPT-2 block that stands in for MPT (biases, a learned
    # position table of max_seq_len rows, the 50,368-token vocabulary, tied embeddings) must have exactly that many,
    # at two sizes and two sequence lengths (the position table grows with the sequence: MPT ran without ALiBi here)
    rows = {r["id"]: r for r in yaml.safe_load(published.ROWS.read_text())["rows"]}
    for name in ("foundry-a100-125m", "foundry-13b-8-4k"):
        out = published.predict_row(rows[name])
        assert out["model_params"] == rows[name]["params"], (name, out["model_params"])
    line = published.params_line([out, {**out, "id": "off", "model_params": out["model_params"] + 1}])[-1]
    assert "1 of the 2 rows" in line and "off +0.000%" in line

"""The advisor against the field (harness/studies/advise/field.py): each published row's source config is found
among the advisor's candidates with the theory published.py prints for it, and each outcome of the table is the
one its definition names."""
from __future__ import annotations

import pytest

from harness.studies.advise import field
from harness.studies.advise.search import GIB, Candidate, Plan

# a published row's shape at a size this machine plans in seconds: 2 GPUs of one node, an H100
ROW = {"id": "small", "source": "s", "table": "t", "card": "h100_80gb", "nodes": 1, "gpus_per_node": 2,
       "overrides": ["model=small_llama", "parallelism.micro_batch=2", "parallelism.seq_len=512",
                     "train.activation_checkpointing=full"],
       "tokens_per_s_per_gpu": 1000.0}


def test_the_source_is_the_searched_candidate_with_the_theory_the_published_table_prints():
    from harness.studies.predict import published

    p = field.plan_for(ROW)
    assert p.global_batch == 4 and p.world == 2  # micro-batch 2 on 2 data-parallel ranks, held fixed
    assert p.budget_bytes == 80 * GIB  # the card's memory: its datasheet's GB are binary, as HBM is built
    mine = field.source_candidate(p, ROW)
    assert mine is not None and mine.name == "fsdp-mb2-ckpton" and mine.grad_accum == 1
    # the advisor's figure for the source's config is the one `make published` prints for the row
    assert mine.predicted_peak_bytes / GIB == pytest.approx(published.predict_row(ROW)["predicted_peak_gib"], rel=1e-9)
    out = field.verdict(p, ROW)
    assert out["outcome"] in field.AGREE + ("beaten",) and out["source"] == mine.name
    # a row the search cannot hold: tensor parallelism over 16 ranks is no mesh of 2 GPUs
    wider = {**ROW, "overrides": [*ROW["overrides"], "parallelism.tp=16"]}
    assert field.source_candidate(p, wider) is None


def test_a_row_that_ran_the_ring_is_the_ring_candidate_not_ulysses_on_its_mesh():
    # the search sets Ulysses beside the ring on each FSDP2 context-parallel mesh (issue 71): what torchtitan ran is
    # the ring, named so by the mesh's words
    ring_row = {**ROW, "overrides": ["model=llama3_1_8b", "parallelism.micro_batch=1", "parallelism.seq_len=32768",
                                     "train.activation_checkpointing=full", "train.precision=bf16", "parallelism.cp=2"]}
    p = field.plan_for(ring_row)
    mine = field.source_candidate(p, ring_row)
    assert mine.name == "fsdp-cp2-mb1-ckpton" and mine.mesh == "dp 1 x cp 2 (ring)"
    assert any(c.name == "fsdp-cp2-ulysses-mb1-ckpton" and c.mesh == "dp 1 x cp 2 (Ulysses)" for c in p.candidates)


def candidate(name_mb: int, tokens: float, peak_gib: float, fits: bool = True) -> Candidate:
    return Candidate("fsdp", name_mb, 1, False, [], policy="none", predicted_tokens_per_s=tokens,
                     predicted_peak_bytes=peak_gib * GIB, predicted_step_s=1 / tokens, fits=fits)


def plan_of(*candidates: Candidate) -> Plan:
    return Plan([], int(80 * GIB), 0.1, 8, 8, "m", "bf16", "cuda", "", candidates=list(candidates))


ROW_MB2 = {**ROW, "overrides": ["model=small_llama", "parallelism.micro_batch=2",
                                "train.activation_checkpointing=none"]}


@pytest.mark.parametrize("others, band, outcome", [
    ([candidate(1, 900, 20)], None, "on the frontier"),  # slower at a lower peak: a point of its own
    ([candidate(1, 1200, 20)], None, "beaten"),  # faster at a lower peak, and no band to tie it
    ([candidate(1, 1200, 20)], (0.5, 2.0, "a wide band"), "in the band"),  # ... inside a band twice as wide
    ([candidate(4, 1000, 20)], None, "in the band"),  # as fast, only lower in memory
])
def test_each_outcome_is_the_one_its_definition_names(monkeypatch, others, band, outcome):
    monkeypatch.setattr(field.advise_frontier, "band", lambda p: band)
    mine = candidate(2, 1000, 40)
    out = field.verdict(plan_of(mine, *others), ROW_MB2)
    assert out["outcome"] == outcome and out["source"] == mine.name
    assert (outcome in field.AGREE) == (outcome != "beaten")
    if outcome == "beaten":
        assert out["sentence"].startswith("fsdp-mb1-ckptoff") and "20.0% faster" in out["sentence"]


def test_a_source_predicted_not_to_fit_is_told_from_the_margin(monkeypatch):
    monkeypatch.setattr(field.advise_frontier, "band", lambda p: None)
    under = field.verdict(plan_of(candidate(2, 1000, 76, fits=False)), ROW_MB2)  # 76 GiB + 10% > 80 GiB
    over = field.verdict(plan_of(candidate(2, 1000, 81, fits=False)), ROW_MB2)
    assert (under["outcome"], over["outcome"]) == ("inside the margin", "over the card")
    missing = field.verdict(plan_of(candidate(1, 1000, 20)), ROW_MB2)
    assert missing["outcome"] == "not searched"
    lines = field.table([under, over, missing])
    assert lines[-1].startswith("Agreement: 0 of 3 rows (0%)")


def test_a_row_id_it_does_not_have_is_refused_in_one_line_before_anything_is_written(tmp_path, capsys):
    from harness import commands

    code = commands.main(["advise-field", "--only", "tt-8b-8-fsdp,tt-nope", f"--out={tmp_path}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and lines == ["advise-field: invalid input: --only tt-8b-8-fsdp,tt-nope: no row tt-nope in "
                                   f"{field.ROWS}"], lines
    assert not list(tmp_path.iterdir())  # no empty table written over a good one

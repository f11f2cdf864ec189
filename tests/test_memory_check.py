"""The memory model against measured peaks (harness/studies/memory/check.py): every backend on a fraction of
tiny_llama, tiny_gpt2, tiny_qwen2 (from its config.json), tiny_mistral (likewise) x fp32, bf16 x the activation-
checkpointing policies none, full, every_2, selective_op (memory_check.matrix's Latin square: each backend runs
each model once and each policy once, the precision alternating; 4 cells a backend, 2 gloo ranks,
profile=parity) in one launch; a states-dominated shape at 2 ranks (the two-rank launch's cells); with the drills,
the four policies on an activation-dominated shape, where they are 2-3x apart (8 s of make test's 5 minutes), and
the states-dominated shape at 4 ranks, where the backends' peaks rank as theory ranks them (a compiled cell:
tests/test_compile.py)."""
from __future__ import annotations

import pytest

from conftest import BACKENDS, STATES_BACKENDS, STATES_REPEATS
from harness.config import recompute
from harness.studies.memory import check as memory_check

pytestmark = pytest.mark.slow
REPEATS = STATES_REPEATS  # profiled steps per cell: the lowest per rank (gloo can hold a buffer a phase late)
DRILL_REPEATS = 5  # the 4-rank states-dominated cells (a drill): 4 ranks on 2 cores hold buffers late more often


POLICIES = ["none", "full", "every_2", "selective_op"]
# make memory-check's activation-dominated shape at a quarter of its tokens (2 x 256 a rank), where the
# policies are still 2x apart: the cells cost a quarter of the compute and profiling
SHAPE = [o for o in memory_check.ACTIVATION_DOMINATED if not o.startswith(("parallelism.seq_len", "parallelism.micro"))]
SHAPE += ["parallelism.seq_len=256", "parallelism.micro_batch=2"]
# the policies apart (memory_check.ACTIVATION_DOMINATED): FSDP2 in bf16 on tiny_llama, DDP's autocast on tiny_gpt2
# (and torchtitan's selective_op_half, which the matrix's Latin square of four policies leaves out)
POLICY_CELLS = [[f"backend={b}", f"model={m}", f"train.precision={p}", *SHAPE,
                 *recompute.overrides(c)] for b, m, p in (("fsdp", "tiny_llama", "bf16"), ("ddp", "tiny_gpt2", "bf16"))
                for c in [*POLICIES, "selective_op_half"]]


# gradient accumulation both ways (parallelism.grad_sync): FSDP2 keeping every gradient unsharded until the last
# micro-batch, or reduce-scattering each micro-batch into the sharded ones (torchtitan's way); in fp32, where the
# gradients are the largest share of the peak, and in bf16 with full checkpointing. Cells of the matrix's launch
ACCUMULATION_CELLS = [["backend=fsdp", f"model={m}", f"train.precision={p}", *recompute.overrides(c),
                       "parallelism.grad_accum=2", f"parallelism.grad_sync={sync}"]
                      for m, p, c in (("tiny_llama", "fp32", "none"), ("tiny_gpt2", "bf16", "full"))
                      for sync in ("last", "every")]


@pytest.fixture(scope="module")
def memory_launch(tmp_path_factory):
    cells = memory_check.matrix(BACKENDS, ["tiny_llama", "tiny_gpt2", "tiny_qwen2", "tiny_mistral"],
                                ["fp32", "bf16"], POLICIES, half=True)
    rows = memory_check.run_cells(cells + ACCUMULATION_CELLS, ["profile=parity"], REPEATS,
                                  tmp_path_factory.mktemp("memory_check"))
    print(memory_check.render(rows, 10, "tests/test_memory_check.py"))
    return rows


@pytest.fixture(scope="module")
def matrix(memory_launch):
    return [r for r in memory_launch if "grad_sync" not in r["name"]]


@pytest.fixture(scope="module")
def accumulation(memory_launch):
    return [r for r in memory_launch if "grad_sync" in r["name"]]


@pytest.fixture(scope="module")
def policy_cells(tmp_path_factory):
    rows = memory_check.run_cells(POLICY_CELLS, ["profile=parity"], REPEATS, tmp_path_factory.mktemp("policies"))
    print(memory_check.render(rows, 10, "tests/test_memory_check.py (activation-dominated)"))
    return rows


def test_each_backend_runs_each_policy_once(matrix):
    for backend in BACKENDS:
        assert sorted(r["checkpointing"] for r in matrix if r["backend"] == backend) == sorted(POLICIES), backend


@pytest.mark.drill
def test_on_an_activation_dominated_shape_each_policy_is_within_10_percent_and_they_rank_as_predicted(policy_cells):
    """What a user trades: none keeps most, every_2 about half the blocks, selective_op the matmuls' and
    attention's outputs, selective_op_half every other matmul's, full the blocks' inputs (under 60% of none's
    peak here, states included); each measured peak within 10% of its prediction."""
    rows = policy_cells
    assert all("error_pct" in r for r in rows), [r.get("refused") for r in rows]
    misses = [(r["name"], round(r["error_pct"], 1)) for r in rows if memory_check.missed(r, 10)]
    assert not misses, misses
    for backend in ("fsdp", "ddp"):
        peaks = {r["checkpointing"]: r["measured_bytes"] for r in rows if r["backend"] == backend}
        assert peaks["none"] > max(peaks["every_2"], peaks["selective_op"]) > peaks["full"], (backend, peaks)
        assert peaks["selective_op"] > peaks["selective_op_half"] > peaks["full"], (backend, peaks)
        assert peaks["full"] < 0.6 * peaks["none"], (backend, peaks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_measured_peak_is_within_10_percent_of_the_predicted_peak(matrix, backend):
    mine = [r for r in matrix if r["backend"] == backend]
    assert len(mine) == 4 and all("error_pct" in r for r in mine), [r.get("refused") for r in mine]
    # On gloo a collective's buffer can outlive the collective into a later phase (its worker thread lets go of
    # it when it moves on, or frees it where the profiler does not look), in some launches and not others;
    # runtime/measure/late_frees.py counts such buffers at their last use (collective_frees, lost_frees), and the
    # lowest of the profiled steps drops most of the rest. Where one is left
    # (seen: ZeRO-2, bf16 with checkpointing, +10.2% in about one launch in three; with lost_frees, FSDP2 on
    # tiny_llama, bf16, every_2: +12.1% in one launch of four, +1.3% less the buffer), the peak less that one
    # buffer, as theory/peak.after_backward_buffers sizes it, must be within the 10%
    misses = [(r["name"], round(r["error_pct"], 1)) for r in mine if memory_check.missed(r, 10)]
    assert not misses, misses


@pytest.mark.parametrize("backend", BACKENDS)
def test_unaccounted_bytes_after_backward_are_under_5_percent_or_named(matrix, backend):
    # the closure check: what is live right after backward beyond the model states and named buffers is
    # small, or it is a mechanism theory/peak.after_backward_buffers names with its size
    for r in (r for r in matrix if r["backend"] == backend):
        assert abs(r["unaccounted_pct"]) <= 5 or r["unaccounted_named"], (r["name"], r["unaccounted_pct"])


@pytest.fixture(scope="module")
def states_dominated(tmp_path_factory):
    # the 5 backends' cells at 4 ranks, as make memory-check --states-dominated runs them, in a launch of their own
    # with the drills: 4 ranks on 2 cores beside another process (make test's second worker) made gloo free late
    # enough to miss. REPEATS profiled steps, the lowest per rank: a gloo buffer held a phase late (up to 2.4 MiB
    # on one step's ZeRO-2 peak) is set aside where it could swap two peaks (the ZeRO-1/ZeRO-2 assertion). With two
    # steps, ZeRO-3's peak here was +9.5 to +11.5% of its prediction in 6 launches and +17.0% in one (28.86 MiB
    # against 24.67 predicted: two such buffers left), which failed the 10% rule in CI on 2026-11-25; with three,
    # +20.4% once in a fresh clone's CI on 2026-11-27 (and within 10% on the re-run): five here, the drills' own
    cells = [[*memory_check.STATES_DOMINATED, *c] for c in memory_check.states_dominated_cells(list(STATES_BACKENDS))]
    rows = memory_check.run_cells(cells, ["profile=parity"], DRILL_REPEATS, tmp_path_factory.mktemp("states_dominated"))
    print(memory_check.render(rows, 10, "tests/test_memory_check.py (states-dominated)"))
    assert all("error_pct" in r for r in rows), [r.get("refused") for r in rows]
    return {r["backend"]: r for r in rows}


@pytest.mark.drill
def test_on_a_states_dominated_shape_the_peaks_rank_as_theory_ranks_them(states_dominated):
    peak = {b: r["measured_bytes"] for b, r in states_dominated.items()}
    predicted = {b: r["predicted_bytes"] for b, r in states_dominated.items()}
    # the ZeRO paper's order, measured: sharding more of the states lowers the peak. Theory (make estimate with
    # these overrides): fsdp 22, ds_zero3 26, ds_zero2 33, ds_zero1 39, ddp 50 MB a rank
    assert peak["fsdp"] < peak["ds_zero2"] and peak["ds_zero3"] < peak["ds_zero2"], peak
    assert peak["ds_zero1"] < peak["ddp"] and peak["ds_zero2"] < peak["ddp"], peak
    # ZeRO-2 against ZeRO-1: at most level once the one buffer gloo may hold a phase late is set aside. Their
    # peaks are 2.1 MiB apart at best here (the theory says 5.3), and that late buffer swapped them in CI at
    # 8de5b66 (35.67 against 35.36 MiB), so the peak cannot tell them apart on this shape; their model states
    # (below) and each one's own prediction (make memory-check) do
    held = states_dominated["ds_zero2"]["held_bytes"]
    assert peak["ds_zero2"] - held < peak["ds_zero1"], (peak, held)
    # and every pair the theory separates by more than 20% comes out in the theory's order. Not 10%: FSDP2 and
    # ZeRO-3 are 10% apart in theory (22.2 and 24.7 MiB) and 3% measured (25.3 and 26.1), where gloo's reduce-
    # scatter clone released a phase late (2.8 MiB) can swap them; their order held in every run so far but is
    # not a claim
    for a in peak:
        for b in peak:
            if predicted[a] < 0.8 * predicted[b]:
                assert peak[a] < peak[b], (a, b, peak, predicted)
    # the model states themselves, the paper's quantity, measured. In fp32 DeepSpeed's ZeRO-1 keeps only its
    # gradient partition once the boundary's reduce is done, as ZeRO-2 does: both 25,104,132 B a rank when the
    # states are counted, as the theory's device states say (make estimate: 0.024 GB each)
    states = {b: r["states_bytes"] for b, r in states_dominated.items()}
    assert states["fsdp"] <= states["ds_zero3"] < states["ds_zero2"] <= states["ds_zero1"] < states["ddp"], states


@pytest.mark.drill
def test_on_a_states_dominated_shape_each_peak_is_within_10_percent_of_its_prediction(states_dominated):
    # the rule of the matrix above, at 4 ranks where the states dominate: FSDP2's worst moment is a block's
    # gradients complete (all of them unsharded) beside the previous block's reduce-scatter input, which the
    # fake-process-group trace puts at 22.33 MiB against 22.22 predicted; real gloo ranks measured 25.3-25.7,
    # one reduce-scatter clone (2.8 MiB) above it, released a phase late
    misses = [(b, round(r["error_pct"], 1)) for b, r in states_dominated.items() if memory_check.missed(r, 10)]
    assert not misses, misses


def test_at_2_ranks_too_each_states_dominated_peak_is_within_10_percent_and_the_order_is_theorys(states_two_ranks):
    # issue 48 found FSDP2 19.7% over its prediction on this shape at 2 ranks (the committed check ran 4 only):
    # the same cells at 2 ranks, in the two-rank launch. Measured at 2 ranks on 2026-11-26: every backend within
    # 5.3%, fsdp +1.0% (results/memory_check/states_dominated_2ranks/memory_check.md)
    rows = {summary["backend"]: memory_check.row_of_run(f"states/{b}", [], run_dir)
            for b, (summary, _, run_dir) in states_two_ranks.items() if summary["status"] == "ok"}
    print(memory_check.render(list(rows.values()), 10, "tests/test_memory_check.py (states-dominated, 2 ranks)"))
    assert sorted(rows) == sorted(STATES_BACKENDS), {b: s["reason"] for b, (s, _, _) in states_two_ranks.items()}
    misses = [(b, round(r["error_pct"], 1)) for b, r in rows.items() if memory_check.missed(r, 10)]
    assert not misses, misses
    peak = {b: r["measured_bytes"] for b, r in rows.items()}
    predicted = {b: r["predicted_bytes"] for b, r in rows.items()}
    for a in peak:
        for b in peak:
            if predicted[a] < 0.8 * predicted[b]:
                assert peak[a] < peak[b], (a, b, peak, predicted)


def test_gradient_accumulation_is_within_10_percent_both_ways(accumulation):
    """parallelism.grad_sync=last holds every gradient unsharded (fp32) from the first micro-batch to the last,
    and no shard until the last micro-batch's reduce-scatters; =every holds the sharded ones from the first, and a
    block's unsharded ones at a time. Each peak within 10% of its prediction (gloo's late buffer set aside, as
    for the matrix). At 2 ranks the two are predicted 0.13 MiB apart in fp32, less than one of gloo's late
    block buffers (0.18 MiB), so their order is held where it is wide, in the advisor's plans (tests/test_advise.py)."""
    assert len(accumulation) == len(ACCUMULATION_CELLS) and all("error_pct" in r for r in accumulation), \
        [r.get("refused") for r in accumulation]
    # tiny_gpt2 in bf16 with full checkpointing under grad_sync=every holds up to 7 buffers of 100 KB late, each
    # alive at the after-backward marker: +8.3% to +34.7% raw over 27 launches of the cell alone (3 of 5 over
    # 10% at febd681, where make test-launches failed on it once), within 5% once what was unreleased at the
    # marker is set aside, as the tp, cp and ep cells hold their peaks; a miss is over 10% both ways
    misses = [(r["name"], round(r["error_pct"], 1), round(r["error_less_unreleased_pct"], 1)) for r in accumulation
              if memory_check.missed(r, 10) and abs(r["error_less_unreleased_pct"]) > 10]
    assert not misses, misses

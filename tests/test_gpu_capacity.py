"""`make gpu-capacity` on CPU: the billion-parameter ladder, the theory's boundary (the card or the host's RAM),
the two probes it picks, a call cut by its time budget, and the real search on an emulated card."""
from __future__ import annotations

import json
import time

import pytest

from harness.config.compose import compose
from harness.runtime import models
from harness.studies.capacity import gpu as gpu_capacity
from harness.studies.capacity.report import measured_table, seeds_comparison

GIB = 2**30


def test_gpu_ladder_climbs_from_1b_past_20b_in_1_5x_steps():
    rungs = gpu_capacity.gpu_ladder()
    counts = [models.param_count(compose(r).model)["total"] for r in rungs]
    assert 0.9e9 < counts[0] < 1.1e9 and counts[-1] > 20e9
    assert all(1.3 < b / a < 1.7 for a, b in zip(counts, counts[1:])), counts
    for r in rungs:  # Llama shapes: head size 128, a real vocabulary, room for seq 2048
        cfg = compose(r).model
        assert cfg.hidden_size == 128 * cfg.num_heads and cfg.vocab_size == 32000 and cfg.max_positions >= 2048


def rung(device_gib, host_gib, name="r"):
    return {"name": name, "params": int(device_gib * 1e9), "device_bytes": device_gib * GIB,
            "host_bytes": host_gib * GIB}


def test_predicted_boundary_names_the_bound_that_stops_it():
    ladder = [rung(10, 20), rung(20, 40), rung(40, 80), rung(80, 160)]
    assert gpu_capacity.predicted_boundary(ladder, 50 * GIB, 1000 * GIB, 0.1) == (2, "device")  # 44 fits, 88 not
    assert gpu_capacity.predicted_boundary(ladder, 100 * GIB, 60 * GIB, 0.1) == (1, "host")  # 80 GiB of host states
    assert gpu_capacity.predicted_boundary(ladder, 5 * GIB, 1000 * GIB, 0.1) == (-1, "device")
    assert gpu_capacity.predicted_boundary(ladder, 1000 * GIB, 1000 * GIB, 0.1) == (3, "ladder")
    # the headroom counts: 40 GiB predicted does not fit 42 GiB with 10% on top
    assert gpu_capacity.predicted_boundary(ladder, 42 * GIB, 1000 * GIB, 0.1) == (1, "device")
    assert gpu_capacity.predicted_boundary(ladder, 42 * GIB, 1000 * GIB, 0.0) == (2, "device")


def test_a_call_out_of_time_starts_no_probe_and_says_so(tmp_path):
    ladder = [rung(1, 0, "a"), rung(2, 0, "b")]
    row = gpu_capacity.search_backend("ddp", [["model=tiny_llama", "model.name=a"]] * 2, ladder, 0, [], [], tmp_path,
                                      deadline=time.monotonic())
    assert row["probes"] == [] and not row["finished"] and not row["resolved"]
    assert not (tmp_path / "probes").exists()
    result = {"rows": {"ddp": {"backend": "ddp", "predicted": ladder, "guess": 0, "bound": "device", **row}},
              "card_bytes": 4 * GIB, "host_bytes": 64 * GIB, "predict_only": False}
    assert "not settled: the call's time ran out" in "\n".join(measured_table(result))


def test_theory_finds_the_offload_backends_bound_by_the_hosts_ram(tmp_path):
    # an H100's 78 GiB beside this GPU machine's 128 GiB of host RAM, then a host with RAM to spare
    args = ["--predict-only", "--card-gib", "78", "--backends", "ddp,fsdp_offload", "--rungs", "8", "--out", str(tmp_path)]
    assert gpu_capacity.main([*args, "--host-gib", "128", "--label", "card a"]) == 0
    small = json.loads((tmp_path / "card-a" / "capacity_predicted.json").read_text())["rows"]
    assert small["ddp"]["bound"] == "device" and small["fsdp_offload"]["bound"] == "host"
    ddp, offload = (small[b]["predicted"][small[b]["guess"]] for b in ("ddp", "fsdp_offload"))
    assert 1e9 < ddp["params"] < 78 * GIB / 16  # DDP's 16 bytes a parameter, and activations, on the card
    assert offload["params"] > 2 * ddp["params"] and offload["host_bytes"] * 1.1 <= 128 * GIB
    report = (tmp_path / "card-a" / "capacity_predicted.md").read_text()
    assert "the host's RAM bounds it: 16 B a parameter" in report
    assert gpu_capacity.main([*args, "--host-gib", "4096", "--label", "card b"]) == 0
    large = json.loads((tmp_path / "card-b" / "capacity_predicted.json").read_text())["rows"]
    assert large["fsdp_offload"]["guess"] > small["fsdp_offload"]["guess"]
    assert large["fsdp_offload"]["guess"] == small["fsdp_offload"]["card_only_guess"]


# with the drills (make test-drills, CI's second stage): the search end to end, two real probes and a rerun
# (~30 s alone, ~55 s beside make test's launches); the theory's side of the search stays in make test above
@pytest.mark.drill
def test_real_search_on_an_emulated_card_probes_the_theory_boundary_and_the_rung_above(tmp_path):
    # 40 MiB, one rank: theory puts DDP's boundary at 1.69M parameters (33.5 MiB; 2.55M needs 49.7). Two real
    # probes: the boundary trains, the rung above runs out of memory, and the peak is the theory's within 10%
    args = ["--cpu", "--budget-mib", "40", "--rungs", "16", "--backends", "ddp", "--out", str(tmp_path)]
    assert gpu_capacity.main(args) == 0
    folder = tmp_path / "cpu-emulating-40-mib"
    row = json.loads((folder / "capacity.json").read_text())["rows"]["ddp"]
    assert [p["status"] for p in row["probes"]] == ["ok", "oom"]
    assert [p["rung"] for p in row["probes"]] == [row["guess"], row["guess"] + 1]
    assert row["largest"] == row["guess"] and row["smallest_failed"] == row["guess"] + 1 and row["resolved"]
    top = row["probes"][0]
    assert abs(top["device_peak_bytes"] / top["device_bytes"] - 1) < 0.10
    assert top["step_s"] > 0 and top["setup_s"] > 0 and top["host_peak_bytes"] > 0
    table = (folder / "capacity.md").read_text()
    assert "| ddp | ladder_h256_l2: 1.69M | ladder_h224_l4: 2.55M (oom) |" in table and "theory right" in table
    assert (folder / "capacity.png").stat().st_size > 0
    # a second call (as the GPU's second 9-minute call) finds the finished probes again and keeps one row
    started = time.monotonic()
    assert gpu_capacity.main(args) == 0
    again = json.loads((folder / "capacity.json").read_text())
    assert all(p["reused"] for p in again["rows"]["ddp"]["probes"]) and time.monotonic() - started < 30
    assert len(again["commands"]) == 1
    assert "- ddp: 1.69M (measured)." in "\n".join(seeds_comparison(again))

"""`make gpu-check`'s parts that need no GPU: the refusal on a machine without one, and the checks, table and
results over run dirs in the shape of a CUDA run's summary.json (the allocator figures, MFU against the
datasheet), as the H100 runs of results/gpu/nvidia-h100-80gb-hbm3/ wrote them."""
from __future__ import annotations

import json

import pytest

from harness.reporting.collect import collect
from harness.studies.gpu import check as gpu_check

GIB = 2**30


def summary(backend: str, model: str, first_loss: float = 10.9, mfu: float = 41.0, peak_gib: float = 20.0,
            predicted_gib: float = 19.5, status: str = "ok", reason: str = "") -> dict:
    figures = {"loss/first_loss": first_loss, "loss/final_loss": first_loss - 1, "flops/mfu_pct": mfu,
               "throughput/tokens_per_s": 50_000.0, "memory/peak_allocated_bytes_max": peak_gib * GIB,
               "memory/peak_reserved_bytes_max": (peak_gib + 1) * GIB, "memory/tensor_peak_bytes_max": peak_gib * GIB,
               "memory/tensor_peak_predicted_bytes": predicted_gib * GIB} if status == "ok" else {}
    return {"status": status, "reason": reason, "backend": backend, "model": model, "world_size": 1,
            "precision": "bf16", "figures": figures}


def write_runs(root, runs: dict) -> list:
    """Run dirs (summary.json each) under root/<sweep>/<backend>, then the rows reporting.collect reads."""
    for (sweep, backend), s in runs.items():
        (root / sweep / backend).mkdir(parents=True, exist_ok=True)
        (root / sweep / backend / "summary.json").write_text(json.dumps(s))
    return [r for sweep in sorted({k[0] for k in runs}) for r in collect(root / sweep)]


def good(root):
    runs = {("gpu_gpt2", b): summary(b, "gpt2_124m", first_loss=10.95 + 0.01 * i)
            for i, b in enumerate(gpu_check.sweep_backends("gpu_gpt2"))}
    runs.update({("gpu_llama", b): summary(b, "llama_1b", first_loss=11.9) for b in gpu_check.sweep_backends("gpu_llama")})
    return runs


OOM = {"status": "oom", "reason": "rank 0 oom: OutOfMemoryError CUDA out of memory (injected)"}


def test_every_check_passes_on_a_good_run_set(tmp_path):
    results = gpu_check.check(write_runs(tmp_path, good(tmp_path)), OOM)
    assert results and all(r["ok"] for r in results), [r for r in results if not r["ok"]]
    assert {"every run ok", "the injected OOM reads oom", "llama_1b: first losses agree within 2%"} <= \
        {r["check"] for r in results}
    text = gpu_check.render(results, write_runs(tmp_path, good(tmp_path)), "NVIDIA H100 80GB HBM3", {"torch": "2.11"})
    assert "| gpt2_124m | ds_zero2_offload | ok |" in text and "**no**" not in text


@pytest.mark.parametrize("spoil, failing", [
    (lambda runs: runs.update({("gpu_llama", "fsdp"): summary("fsdp", "llama_1b", status="failed",
                                                               reason="rank 0 failed: RuntimeError boom")}),
     "every run ok"),
    (lambda runs: runs.update({("gpu_llama", "ds_zero3"): summary("ds_zero3", "llama_1b", first_loss=200.0)}),
     "llama_1b: first losses agree within 2%"),
    (lambda runs: runs.update({("gpu_gpt2", "ddp"): summary("ddp", "gpt2_124m", mfu=130.0)}),
     "gpt2_124m/ddp: MFU in (0, 100]"),
    (lambda runs: runs.update({("gpu_gpt2", "fsdp"): summary("fsdp", "gpt2_124m", peak_gib=30.0)}),
     "gpt2_124m/fsdp: allocator peak within 10% of predicted"),
])
def test_each_check_catches_what_it_is_for(tmp_path, spoil, failing):
    runs = good(tmp_path)
    spoil(runs)
    results = {r["check"]: r for r in gpu_check.check(write_runs(tmp_path, runs), OOM)}
    assert not results[failing]["ok"], results[failing]
    assert sum(not r["ok"] for r in results.values()) == 1


def test_an_oom_that_did_not_happen_fails_its_check(tmp_path):
    rows = write_runs(tmp_path, good(tmp_path))
    for oom in (None, {"status": "ok"}, {"status": "failed", "reason": "rank 0 failed: boom"}):
        results = {r["check"]: r["ok"] for r in gpu_check.check(rows, oom)}
        assert results["the injected OOM reads oom"] is False


def test_on_a_machine_without_cuda_it_refuses_in_one_line(capsys):
    # the command's own main under its one-line wrapper (the command table runs it so: harness/commands.py), in this process: a subprocess
    # cost 1.6 s of imports
    from harness.config.command_line import one_line

    assert one_line("gpu-check", lambda: gpu_check.main([])) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "gpu-check: no CUDA device (torch.cuda.is_available() is False); run it on a GPU machine"


def test_report_only_writes_the_results_from_runs_already_there(tmp_path):
    # how runs from several 10-minute commands become one check (docs/gpu.md)
    runs = tmp_path / "runs"
    write_runs(runs, good(runs))
    (runs / "oom").mkdir()
    (runs / "oom" / "summary.json").write_text(json.dumps(OOM))
    (runs / "env.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}))
    code = gpu_check.main(["--report-only", f"--runs={runs}", f"--out={tmp_path / 'out'}"])
    out = tmp_path / "out" / "nvidia-h100-80gb-hbm3"
    assert code == 0 and json.loads((out / "check.json").read_text())["oom"]["status"] == "oom"
    assert "| llama_1b | fsdp | ok |" in (out / "check.md").read_text()
    assert (out / "gpu_gpt2_summary.csv").read_text().count("gpt2_124m") == len(gpu_check.sweep_backends("gpu_gpt2"))


def test_the_time_table_sets_each_part_beside_its_prediction_and_counts_those_within_30_pct(tmp_path):
    from harness.studies.gpu import time_model as gpu_time

    runs = good(tmp_path)
    f = runs[("gpu_gpt2", "ddp")]["figures"]
    for part, measured, predicted in (("forward", 10e-3, 9e-3), ("backward", 20e-3, 10e-3), ("optimizer", 2e-3, 2e-3),
                                      ("other", 1e-3, 1.2e-3)):
        f.update({f"time/{part}_s": measured, f"time/{part}_predicted_s": predicted,
                  f"time/{part}_host_predicted_s": predicted / 2, f"time/{part}_arithmetic_predicted_s": predicted})
    f.update({"time/comm_exposed_s": 0.0, "time/comm_exposed_predicted_s": 0.0, "time/profiled_step_s": 33e-3,
              "time/step_predicted_s": 22.2e-3, "throughput/step_time_p50_s": 30e-3})
    text = gpu_time.render(write_runs(tmp_path, runs), "NVIDIA H200", "results/device_costs/cuda.json")
    assert "**3 of 4 parts within 30%** over 1 runs." in text  # backward's +100% is the miss
    assert "| gpt2_124m/ddp | backward | 20.00 | 10.00 | +100% | 5.00 | 10.00 |" in text
    assert "| gpt2_124m/ddp | timed step (p50, no profiler) | 30.00 | 22.20 | +35% |" in text
    assert "comm_exposed" not in text  # nothing predicted to wait: no row
    assert "Runs without a prediction: " in text  # every other backend had none


def test_chosen_backends_run_in_the_order_given_and_offload_never_on_llama_1b():
    only = ["fsdp", "ds_zero3_offload", "ddp"]
    assert gpu_check.sweep_backends("gpu_gpt2", only) == only
    assert gpu_check.sweep_backends("gpu_llama", only) == ["fsdp", "ddp"]

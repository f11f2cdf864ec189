"""Theory against measurement: predicted model-state bytes match what every backend really holds, the paper's
worked example comes out, and DeepSpeed's own estimators agree where they model the same thing."""
from __future__ import annotations


import pytest
from omegaconf import OmegaConf

from conftest import BACKENDS, REPO
from harness.core.components import totals
from harness.theory import memory as mm
from harness.config.mesh import Mesh
from harness.theory.shape import Shape

GB = 1e9


def backend(name):
    return OmegaConf.load(REPO / "conf" / "backend" / f"{name}.yaml")


def merged(name):
    """A backend group file over the schema's defaults, as Hydra composes it."""
    from harness.config.schema import BackendConfig

    return OmegaConf.merge(OmegaConf.structured(BackendConfig), backend(name))


def test_paper_worked_example():
    # ZeRO paper, figure 1: 7.5B parameters, N = 64, mixed-precision Adam (K = 12)
    s = Shape(params=7_500_000_000, mesh=Mesh(per_node=64), precision="bf16")
    got = [round(mm.paper_bytes(stage, s) / GB, 1) for stage in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]


def test_paper_formula_is_the_layout_where_they_coincide():
    # FSDP2 keeps exactly 16Ψ/N (the paper's ZeRO-3) and DDP 16Ψ, in any precision
    for precision in ("fp32", "bf16"):
        s = Shape(params=1_000_000, mesh=Mesh(per_node=8), precision=precision)
        assert totals(mm.layout(merged("fsdp"), s))["total"] == pytest.approx(16e6 / 8)
        assert totals(mm.layout(merged("ddp"), s))["total"] == pytest.approx(16e6)


def _deepspeed_params(model_name):
    """Total and largest-layer parameters as DeepSpeed itself counts them, on a meta-device model."""
    from deepspeed.runtime.zero.stage3 import model_to_params

    from harness.config.schema import ModelConfig
    from harness.runtime import models

    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "conf" / "model" / f"{model_name}.yaml"))
    model = models.build(cfg, device="meta")
    return model_to_params(model)


@pytest.mark.parametrize("model_name", ["tiny_llama", "llama_7b"])
def test_deepspeed_estimators_agree_where_they_model_the_same_thing(model_name):
    total, largest = _deepspeed_params(model_name)
    n = 8
    s = Shape(params=total, mesh=Mesh(per_node=n), precision="bf16", largest_param=largest)

    def ours(name):
        return totals(mm.layout(merged(name), s))

    # ZeRO-2: DeepSpeed counts 2Ψ + 18Ψ/N, i.e. a 16-bit gradient partition (2Ψ/N) besides the fp32 one.
    # With grad_accum_dtype=fp32 (which the harness sets under bf16) gradients are reduced straight into
    # the fp32 partition and no 16-bit partition is kept, as measured: ours is DeepSpeed's less 2Ψ/N.
    ds = mm.framework_estimate(merged("ds_zero2"), s)
    assert ours("ds_zero2")["device"] == pytest.approx(ds["gpu"] - 2 * total / n, rel=1e-6)
    # ZeRO-2 offload: both put only the 16-bit parameters on the device
    ds = mm.framework_estimate(merged("ds_zero2_offload"), s)
    assert ours("ds_zero2_offload")["device"] == pytest.approx(ds["gpu"], rel=1e-6)
    # ZeRO-3: DeepSpeed adds 4 x largest layer, the gathered working set, which is transient rather than
    # a model state; what is left is the same 18Ψ/N (16-bit shard, fp32 grad, master, m, v).
    ds = mm.framework_estimate(merged("ds_zero3"), s)
    assert ds["gathered"] == 4 * largest
    assert ours("ds_zero3")["device"] == pytest.approx(ds["gpu"] - ds["gathered"], rel=1e-6)
    ds = mm.framework_estimate(merged("ds_zero3_offload"), s)
    assert ours("ds_zero3_offload")["device"] == 0 and ds["gpu"] == ds["gathered"]
    # DeepSpeed's host figures are per node with a 1.5x buffer factor: a sizing rule, not a layout, so the
    # host side is not compared.


def _measured_vs_predicted(runs, name, uneven: bool = False):
    """Every rank's states within 5% of the theory's; with `uneven`, no rank above it and the most-loaded one
    within it (FSDP1 under LoRA: AdamW's states sit on the ranks whose flat slices hold the adapters)."""
    summary = runs[name][0]
    assert summary["status"] == "ok", summary.get("reason")
    f = summary["figures"]
    for part in ("total", "device", "host"):
        predicted = f[f"memory/model_states_{part}_predicted_bytes" if part != "total"
                      else "memory/model_states_predicted_bytes"]
        held = [rank["model_states"][part] for rank in summary["per_rank"]]
        for states in held if not uneven else [max(held)]:
            assert states == pytest.approx(predicted, rel=0.05, abs=1), (name, part, held, predicted)
        assert max(held) <= predicted * 1.05 + 1, (name, part, held, predicted)
    assert abs(f["memory/model_states_error_pct"]) < 5
    assert f["memory/model_states_paper_bytes"] > 0 and f["comm/predicted_bytes_per_step"] > 0
    # every tensor the strategy holds is in a component: DeepSpeed's per-class tables name every attribute of
    # ZeRO-1/2, BF16_Optimizer (ZeRO-1 in bf16) and ZeRO-3 that held a tensor, so nothing is unclassified
    assert f["memory/model_states_unclassified_bytes_max"] == 0, summary["per_rank"][0]["unclassified"]
    assert not summary.get("warnings"), summary["warnings"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_measured_model_states_match_prediction_fp32(fp32_runs, name):
    _measured_vs_predicted(fp32_runs, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_measured_model_states_match_prediction_bf16(bf16_runs, name):
    _measured_vs_predicted(bf16_runs, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ds_zero3", "ds_zero3_offload"])
def test_zero3_buffers_match_prediction(fp32_runs, name):
    f = fp32_runs[name][0]["figures"]
    assert f["memory/model_states_buffers_bytes_max"] == pytest.approx(f["memory/buffers_predicted_bytes"], rel=0.05)


def test_estimate_cli_prints_every_backend_and_the_paper_figures(capsys):
    from harness.studies.predict.estimate import main

    assert main(["--params", "7.5e9", "--world", "64", "train.precision=bf16"]) == 0
    out = capsys.readouterr().out
    for name in BACKENDS:
        assert name in out
    for figure in ("120.000", "31.406", "16.641", "1.875"):
        assert figure in out
    assert "step ms" not in out  # the time model only when asked: its calibration is seconds
    assert "64 ranks (32 node(s) of 2)" in out  # --world's nodes, of the preset's ranks per node (it said 1 of 2)


def test_estimate_leaves_out_in_one_line_a_backend_a_run_would_refuse(capsys):
    """parallelism.grad_sync=every, which ZeRO-1 refuses (it reduces at DeepSpeed's accumulation boundary only):
    its rows were printed as if it ran; now it has none and one line says why, and the backends that take it keep
    theirs (FSDP2 reduce-scatters every micro-batch, ZeRO-2 reduces every micro-batch as it always does)."""
    from harness.studies.predict.estimate import main

    assert main(["model=tiny_llama", "parallelism.grad_sync=every", "parallelism.grad_accum=2",
                 "--backends", "ds_zero1,ds_zero2,fsdp"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("│ ")]
    assert not any(line.startswith("│ ds_zero1 ") for line in table)
    assert any(line.startswith("│ ds_zero2 ") for line in table) and any(line.startswith("│ fsdp ") for line in table)
    assert "left out, as a run would be refused: ds_zero1: parallelism.grad_sync=every: DeepSpeed ZeRO-1" in out


def test_estimate_prices_each_backends_step_with_the_time_model_when_asked(capsys):
    from harness.studies.predict.estimate import main

    assert main(["model=tiny_llama", "--time"]) == 0
    out = capsys.readouterr().out
    assert "step ms" in out and "tokens/s" in out and "step ms, tokens/s: the time model (theory/time.py)" in out
    assert all(name in out for name in BACKENDS)


def test_a_gpu_shape_here_is_priced_at_the_last_lent_gpus_measured_rates_with_its_error_band(capsys):
    # a walkthrough read 156k tokens/s for 8B on 8 H100s, a roofline at the datasheet's peak, as a prediction
    import json

    from harness.studies.predict.estimate import main

    measured = json.loads((REPO / "results" / "device_costs" / "cuda.json").read_text())
    assert main(["model=llama_7b", "parallelism=gpu8", "train.precision=bf16", "--backends", "fsdp", "--time"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"FLOPs / {measured['worlds']['1']['matmul_tflops']['bf16']:.3g} TFLOP/s" in out
    assert f"measured on an {measured['machine']} on {measured['measured']}" in out
    assert "On the last GPU check the measured steps took" in out and "make gpu-axes" in out


def test_estimate_says_its_budget_in_both_units_and_fits_with_the_advisors_margin(capsys):
    from harness.studies.predict.estimate import GIB, fits, main

    assert fits(72 * GIB, 80) and not fits(73 * GIB, 80)  # 10% headroom: a peak of 73 GiB does not fit 80 GiB
    assert main(["model=llama_7b", "parallelism=gpu8", "train.precision=bf16", "--device-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert "peak GiB" in out and "the budget of 80 GiB (85.9 GB) per rank" in out and "10% headroom" in out


def test_a_compiled_shape_is_estimated_and_advised_with_what_its_compiled_blocks_keep(monkeypatch):
    # `shardbench estimate` and the advisor priced a compiled run's activations as eager's count; the runs'
    # own prediction reads what AOTAutograd's partition of each block keeps. The three must say the same peak.
    # Nothing is traced here (seconds a shape: the compile drill's cells and the memory check trace): what a block
    # keeps and what its backward holds are given, far under eager's count, and must reach all three
    from harness.runtime.compiled import compiled_activations, compiled_backward
    monkeypatch.setattr(compiled_activations, "_kept", lambda *args: {"per_token": 100.0, "per_block": 0.0})
    monkeypatch.setattr(compiled_backward, "backward_peak", lambda cfg, regime, policy: 2.0**20)
    from harness.config.compose import compose
    from harness.config.derive import world_size
    from harness.studies.advise import search as advise
    from harness.studies.predict import estimate
    from harness.studies.predict.rates import rates_for
    from harness.theory.predict import predict

    shape = ["model=tiny_llama", "parallelism=gpu8", "train.precision=bf16", "parallelism.seq_len=512",
             "train.activation_checkpointing=selective_op"]
    (eager,) = estimate.rows(shape, names=["fsdp"])
    (compiled,) = estimate.rows([*shape, "train.compile=true"], names=["fsdp"])
    cfg = compose([*shape, "train.compile=true", "backend=fsdp"])
    counts = compiled_activations.counts_for(cfg)
    assert set(counts["compiled_kept"]) == {"plain", "checkpointed"}
    assert counts["compiled_kept"]["checkpointed"] == {"per_token": 100.0, "per_block": 0.0, "backward_peak": 2**20}
    run = predict(cfg, world_size(cfg), counts)["memory/tensor_peak_predicted_bytes"]
    assert compiled["peak_bytes"] == run and compiled["peak_bytes"] < eager["peak_bytes"]
    candidate = advise.candidate(cfg, "fsdp", [], {k: v for k, v in counts.items() if k != "compiled_kept"}, 0.0,
                                 rates_for(cfg, world_size(cfg)), 2**40, 0.1)
    assert candidate.predicted_peak_bytes == predict(cfg, world_size(cfg), counts)["memory/device_peak_predicted_bytes"]


@pytest.mark.parametrize("backend, split", [("ds_zero2", False), ("ds_zero3", True), ("ddp", None)])
def test_each_backend_asks_for_the_trace_its_engine_compiles(monkeypatch, backend, split):
    # DeepSpeed's engine compiles the whole module (ZeRO-3 split at every submodule's hook), at the run's own
    # length; DDP and FSDP compile each block. Which trace a config asks for, without tracing (seconds each), and
    # which generated backward is read: each block's (DDP), the whole module's (ZeRO-1/2, whose one backward holds
    # every block), none under ZeRO-3's split module, whose checkpointed blocks recompute eagerly
    from harness.config.compose import compose
    from harness.runtime.compiled import compiled_activations, compiled_backward

    asked, read = [], []
    monkeypatch.setattr(compiled_activations, "_kept_module", lambda *args: asked.append(("module", *args)) or {})
    monkeypatch.setattr(compiled_activations, "_kept", lambda *args: asked.append(("blocks", *args)) or {})
    monkeypatch.setattr(compiled_backward, "backward_peak", lambda cfg, regime, policy: read.append(policy) or 1.0)
    monkeypatch.setattr(compiled_backward, "module_backward_peak",
                        lambda cfg, regime: read.append("module") or {"peak": 2.0, "kept": 1.0})
    cfg = compose(["model=tiny_llama", f"backend={backend}", "train.compile=true", "parallelism.seq_len=96",
                   "train.activation_checkpointing=every_2"])
    kept = compiled_activations.kept(cfg, "fp32")
    policies = sorted(a[3] for a in asked)
    assert policies == ["full", "none"]  # every_k's checkpointed blocks are fully checkpointed ones
    assert {a[0] for a in asked} == {"blocks" if split is None else "module"}
    if split is None:
        assert sorted(read) == ["full", "none"] and set(kept) == {"plain", "checkpointed"}
        assert kept["checkpointed"]["backward_peak"] == 1.0
    else:
        assert {a[4:] for a in asked} == {(split, 96)}
    if split is False:
        assert read == ["module"] and (kept["module_backward_peak"], kept["module_kept"]) == (2.0, 1.0)
    if split is True:
        assert read == [] and kept["eager_recompute"]


KINDS = ("params", "grads", "optimizer", "activations", "temporaries", "unattributed")


def _peak_by_kind(runs, name, within_pct):
    """`within_pct`: the band the measured peak must fall in, as error % against the predicted peak."""
    summary = runs[name][0]
    f = summary["figures"]
    peak = f["memory/tensor_peak_bytes_max"]
    kinds = {k: f[f"memory/tensor_peak_{k}_bytes"] for k in KINDS}
    print(f"PEAK {name:17} {peak / 2**20:9.3f} pred {f['memory/tensor_peak_predicted_bytes'] / 2**20:9.3f} "
          f"err {f['memory/tensor_peak_error_pct']:+6.1f}% unacc {f['memory/unaccounted_pct']:+6.1f}% "
          + " ".join(f"{k}={v / 2**20:.3f}" for k, v in kinds.items()))
    # the kinds are a split of the peak, and the peak holds at least every model state the rank keeps
    assert sum(kinds.values()) == peak
    assert peak >= f["memory/model_states_total_bytes_max"] * 0.99
    # the table's peak is the tensor peak on CPU, never process RSS (which can be lower: DeepSpeed's native
    # 5e8-element reduce bucket is allocated but never all touched, so the kernel never maps it)
    assert f["memory/peak_mem_bytes"] == peak
    # the closure check is reported on every backend; where it is over 5% the summary says so
    assert f["memory/unaccounted_pct"] is not None
    assert abs(f["memory/unaccounted_pct"]) <= 5 or any("unaccounted" in n for n in summary.get("notes", [])), name
    low, high = within_pct
    assert low <= f["memory/tensor_peak_error_pct"] <= high, f["memory/tensor_peak_error_pct"]


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_peak_tensor_memory_by_kind_fp32(fp32_runs, name):
    # grad_accum 2 on 3 ranks (parity), the peak replayed from the step's allocations (train.peak_by_kind=false).
    # Measured against theory/peak.py: DDP, ZeRO-2 and both offloads within 1.2%, ZeRO-1 +3%, FSDP2 -4% to +9%,
    # ZeRO-3 +13% (its gathers and gloo's worker thread free a phase late in some launches). Reported, not tuned:
    # the band holds every backend to that spread; make memory-check holds the 10% on the plain grid
    _peak_by_kind(fp32_runs, name, (-10, 25))


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_peak_tensor_memory_by_kind_bf16(bf16_runs, name):
    # The native profile, as a user runs it: every backend measured within 0.1% of theory/peak.py (DeepSpeed's
    # native 5e8-element reduce bucket is most of its peak); the band leaves room for gloo's late frees
    _peak_by_kind(bf16_runs, name, (-5, 10))


def test_deepspeed_is_told_its_accelerator_so_that_the_tools_print_no_warning_of_their_own():
    # `shardbench estimate` and `shardbench advise` printed DeepSpeed's "Setting accelerator to CPU. If you have GPU
    # ..." in the middle of their tables: DS_ACCELERATOR (DeepSpeed's own override) names the one it would pick
    import os
    import subprocess
    import sys

    code = ("from harness.backends.deepspeed.accelerator import settle; settle(); "
            "from deepspeed.accelerator import get_accelerator; print(get_accelerator()._name)")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert quiet.stdout.strip() == "cpu" and "Setting accelerator" not in quiet.stderr, quiet.stderr[-500:]
    from harness.backends.deepspeed.accelerator import settle

    os.environ["DS_ACCELERATOR"], before = "mine", os.environ.get("DS_ACCELERATOR")
    try:
        settle()
        assert os.environ["DS_ACCELERATOR"] == "mine"  # a user's own choice is kept
    finally:
        os.environ.pop("DS_ACCELERATOR") if before is None else os.environ.update(DS_ACCELERATOR=before)


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_a_gpt2_block_keeps_what_the_theory_counts_for_its_gelu(activation):
    """What one GPT-2 block's autograd graph saves for backward, per token, storage by storage, is the theory's
    count: the unfused tanh GELU (GPT-2's) and the exact one (model.activation=gelu, as MPT's), whose difference
    is three MLP-wide tensors a token (36 GiB on llm-foundry's MPT-7B row at micro-batch 6)."""
    import torch

    from harness.config.compose import compose
    from harness.runtime import models
    from harness.theory import activations

    cfg = compose(["model=tiny_gpt2", "model.intermediate_size=512",
                   *([f"model.activation={activation}"] if activation else [])])
    block = models.blocks(models.build(cfg.model))[0]
    tokens, kept = 64, {}

    def pack(t):
        # parameters are states, not activations; a storage saved twice is kept once
        if not isinstance(t, torch.nn.Parameter):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(1, tokens, cfg.model.hidden_size, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    out = out[0] if isinstance(out, tuple) else out
    predicted = activations.block_bytes_per_token(cfg.model, "fp32")
    # the block's own input is counted as kept (the residual stream), the attention mask and positions are not
    assert sum(kept.values()) / tokens == pytest.approx(predicted, rel=0.01), (sum(kept.values()) / tokens, predicted)
    assert out.shape == x.shape

"""Where the step time goes: the measured breakdown (runtime/measure/time_profile.py) on the fixture sweeps' runs, and
the theory of communication and time (theory/communication.py, theory/time.py) against the ZeRO paper."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from conftest import BACKENDS
from harness.theory.communication import collectives, comm_per_step
from harness.config.mesh import Mesh
from harness.theory.shape import Shape
from harness.theory.time import PARTS, CommTable, Rates, predict_parts

MEASURED = [f"time/{part}_s" for part in PARTS]


def _check_breakdown(summary: dict) -> None:
    f = summary["figures"]
    parts = [f[k] for k in MEASURED]
    # every part is a duration; `other` may dip a clock tick below zero, no more
    assert min(parts[:-1]) >= 0 and parts[-1] > -1e-4, dict(zip(MEASURED, parts))
    assert sum(parts) == pytest.approx(f["time/profiled_step_s"], rel=1e-9)
    # the breakdown describes the timed steps: its step within 10% of that rank's timed steps
    assert abs(f["time/breakdown_vs_step_pct"]) < 10, f["time/breakdown_vs_step_pct"]
    assert f["time/comm_total_s"] >= f["time/comm_exposed_s"] > 0
    for rank in summary["per_rank"]:  # every rank measured its own
        assert rank["time_breakdown"]["step"] > 0


@pytest.mark.parametrize("name", BACKENDS)
def test_step_parts_sum_to_the_timed_step_fp32(fp32_runs, name):
    summary, _, _ = fp32_runs[name]
    _check_breakdown(summary)
    # the fp32 sweep counts FLOPs, so the time model stands beside every part
    f = summary["figures"]
    assert all(f"time/{part}_predicted_s" in f for part in PARTS)
    assert f["time/step_predicted_s"] == pytest.approx(sum(f[f"time/{p}_predicted_s"] for p in PARTS))


@pytest.mark.parametrize("name", BACKENDS)
def test_step_parts_sum_to_the_timed_step_bf16(bf16_runs, name):
    _check_breakdown(bf16_runs[name][0])


def test_more_communication_per_flop_shows_as_more_exposed_time(fp32_runs, bf16_runs):
    """Same model, same FLOPs: ZeRO-3 and FSDP gather parameters in forward and again in backward where DDP
    all-reduces gradients once. Predicted on the fp32 sweep (parity: every ZeRO-3 tensor sharded), they send
    more bytes and spend longer communicating; measured on the bf16 sweep (2 ranks, native: as a user runs it),
    each backend's exposed communication is there and inside its step. On an idle machine the exposed seconds
    were several times DDP's (one run: DDP 2.6 ms, FSDP 10.0, ZeRO-3 27.6; the demo's report shows them)."""
    measured = {name: bf16_runs[name][0]["figures"] for name in ("ddp", "ds_zero3", "fsdp")}
    predicted = {name: fp32_runs[name][0]["figures"] for name in ("ddp", "ds_zero3", "fsdp")}
    # measured: each backend's exposed seconds are there and inside its step. Their order (ZeRO-3 about 10x DDP's
    # on an idle machine) is the demo's and the benchmark's to show, not a unit test's: make test runs this sweep
    # on one worker while the other loads the same 2 cores, and a rank descheduled mid-step shows as exposed
    # waiting in every backend alike (one such run: DDP 31.8 ms, ZeRO-3 31.3). The predicted order stays below
    for name, figures in measured.items():
        assert 0 < figures["time/comm_exposed_s"] <= figures["throughput/step_time_p50_s"] * 1.5, (name, figures)
    for sharded in ("ds_zero3", "fsdp"):
        assert predicted[sharded]["comm/predicted_bytes_per_step"] > predicted["ddp"]["comm/predicted_bytes_per_step"]
        assert predicted[sharded]["time/comm_total_predicted_s"] > predicted["ddp"]["time/comm_total_predicted_s"]


def _backend(family, stage=0, reshard=True):
    return OmegaConf.create({"family": family, "zero_stage": stage, "reshard_after_forward": reshard,
                             "offload_optimizer": False})


PSI, BLOCK, LAYERS = 1_000_000, 150_000, 4
SIZES = (100_000,) + (50_000,) * 16 + (100_000,)  # tensors summing to PSI


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_move_the_zero_papers_volume(world):
    """Summed over every collective of the step (the loss and grad-norm scalars aside), each rank sends
    the ZeRO paper's volume with ring collectives: 2Ψ for DDP and ZeRO-1/2, 3Ψ for ZeRO-3 and FSDP (in
    the parity settings, where every tensor is sharded and one bucket holds the model)."""
    ring = (world - 1) / world
    s = Shape(params=PSI, mesh=Mesh(per_node=world), precision="fp32", bucket_elements=PSI, block_params=BLOCK, blocks=LAYERS,
              root_reshards=True, tensor_sizes=SIZES, persistence_threshold=0)
    scalars = 2 * ring * 4 * 2  # the loss and the grad norm all-reduces, 4 B each
    for backend, elements in ((_backend("ddp"), 2), (_backend("deepspeed", 1), 2), (_backend("deepspeed", 2), 2),
                              (_backend("deepspeed", 3), 3), (_backend("fsdp"), 3)):
        sent = comm_per_step(backend, s)["bytes"]
        scalar = scalars / 2 if backend.family == "ddp" else scalars
        assert sent - scalar == pytest.approx(elements * ring * 4 * PSI), backend.family
    # DeepSpeed 0.19 all-reduces ZeRO-1/2's gradient buckets by default (use_multi_rank_bucket_allreduce) and
    # then all-gathers the parameters: 3Ψ, half again the paper's 2Ψ (measured: make hybrid's ZeRO-2 bytes)
    for stage in (1, 2):
        sent = comm_per_step(_backend("deepspeed", stage), dataclasses.replace(s, grad_all_reduce=True))["bytes"]
        assert sent - scalars == pytest.approx(3 * ring * 4 * PSI)


def test_native_ddp_buckets_and_zero3_persistence_shape_the_list():
    """DDP's native 25 MiB buckets split a 10M-parameter model's 40 MB of gradients in two; ZeRO-3 leaves
    tensors at or under its persistence threshold out of the gathers, and does not gather again in backward what
    it kept within its reuse distance; FSDP2's native root is gathered once."""
    s = Shape(params=10_000_000, mesh=Mesh(per_node=2), precision="fp32", grad_copy=True, bucket_elements=10_000_000)
    reduces = [c for c in collectives(_backend("ddp"), s) if c.size_bytes > 4]
    assert sum(c.count for c in reduces) == 2 and sum(c.count * c.size_bytes for c in reduces) == 40_000_000
    z3 = Shape(params=PSI, mesh=Mesh(per_node=2), precision="bf16", bucket_elements=PSI, tensor_sizes=SIZES,
               persistence_threshold=50_000, overlap_comm=True)
    gathers = [c for c in collectives(_backend("deepspeed", 3), z3) if c.op == "all_gather"]
    # the two tensors over the threshold, gathered one by one in forward, and again (outside any reuse
    # distance: 0 here) in backward
    assert sorted(c.size_bytes for c in gathers)[:2] == [2 * 100_000, 2 * 100_000]
    assert sum(c.count * c.size_bytes for c in gathers) == 2 * 2 * 200_000
    kept = Shape(**{**z3.__dict__, "max_reuse_distance": 10**9})  # DeepSpeed's default: the model stays gathered
    assert sum(c.count * c.size_bytes for c in collectives(_backend("deepspeed", 3), kept) if c.op == "all_gather") \
        == 2 * 200_000
    fs = Shape(params=PSI, mesh=Mesh(per_node=2), precision="bf16", block_params=BLOCK, blocks=LAYERS, root_reshards=False)
    root = PSI - LAYERS * BLOCK
    assert sum(c.count for c in collectives(_backend("fsdp"), fs) if c.size_bytes == 2 * root) == 1


def test_overlap_rules():
    """DDP hides its all-reduce behind backward except the last bucket; ZeRO-1/2 without overlap_comm
    expose everything; doubling compute shrinks DDP's exposed time and leaves ZeRO-2's."""
    s = Shape(params=PSI, mesh=Mesh(per_node=2), precision="fp32", bucket_elements=PSI // 4, block_params=BLOCK, blocks=LAYERS)
    rates = Rates(tflops=1.0, mem_gbps=10.0, comm=CommTable([], "cpu", 2))
    one_bucket = rates.comm.seconds("all_reduce", PSI)  # PSI / 4 elements of 4 B
    slow, fast = (predict_parts(_backend("ddp"), s, flops, rates) for flops in (1e10, 1e8))
    assert slow["comm_exposed"] == pytest.approx(one_bucket + rates.comm.seconds("all_reduce", 4))
    assert fast["comm_exposed"] > slow["comm_exposed"]
    z2 = [predict_parts(_backend("deepspeed", 2), s, flops, rates) for flops in (1e10, 1e8)]
    assert z2[0]["comm_exposed"] == pytest.approx(z2[0]["comm_total"]) == pytest.approx(z2[1]["comm_exposed"])


def test_comm_table_interpolates_measured_sizes_and_states_its_default():
    rows = [{"op": "all_gather", "size_bytes": 1024, "time_s": 1e-4, "ranks": 2},
            {"op": "all_gather", "size_bytes": 4096, "time_s": 4e-4, "ranks": 2},
            {"op": "all_gather", "size_bytes": 1024, "time_s": 9.0, "ranks": 3}]  # another world size: unused
    table = CommTable(rows, "cpu", 2)
    assert table.seconds("all_gather", 2048) == pytest.approx(2e-4)  # linear in log-log between the two
    assert table.seconds("all_gather", 16384) == pytest.approx(16e-4)  # the last slope, extended
    assert table.seconds("all_gather", 10) == pytest.approx(1e-4)  # below the smallest: latency-bound
    assert "measured" in table.source and "default" in CommTable([], "cpu", 2).source


def test_every_backend_sends_the_bytes_the_model_predicts(fp32_runs, bf16_runs):
    """The bytes each rank sends in one step, counted from every c10d collective (runtime/measure/collective_count.py),
    against theory/communication.py's list, on both sweeps: 3 ranks, fp32, parity, 2 micro-batches (tiny_llama)
    and 2 ranks, bf16, native (tiny_gpt2). Among what this holds: DeepSpeed 0.19 all-reduces ZeRO-1/2's
    gradient buckets (half again the paper's volume), and ZeRO-3 gathers its persistent parameters after each
    step (all of tiny_gpt2's under the native threshold) instead of in forward."""
    for sweep in (fp32_runs, bf16_runs):
        for backend, (summary, _, _) in sweep.items():
            f = summary["figures"]
            assert abs(f["comm/bytes_error_pct"]) < 1, (backend, f["comm/measured_bytes_per_step"],
                                                        f["comm/predicted_bytes_per_step"])


def test_an_offloaded_optimizer_is_priced_on_the_host_and_its_link_not_as_the_device_steps():
    """A walkthrough found fsdp_offload priced exactly as fsdp on 8 H100s (553.09 ms each), so the advisor tied
    them. Under offload the host steps AdamW over the rank's fp32 shard (its bytes at the host's memory rate) and
    the copies cross the host link: FSDP2 the fp32 shard before each all-gather (2 with resharding) and the fp32
    gradient shard back, DeepSpeed the fp32 gradients down and the updated 16-bit parameters up. On a CPU run
    FSDP2's copies are the host tensors themselves."""
    from harness.config.compose import compose
    from harness.runtime import models
    from harness.theory.shape import shape_of
    from harness.theory.time import DEFAULT_HOST_LINK_GBPS, DEFAULT_HOST_MEMORY_GBPS

    gpu = Rates(tflops=989.0, mem_gbps=3350.0, comm=CommTable([], "cuda", 8), device="cuda",
                source="an H100 SXM's datasheet peaks")
    parts, local = {}, {}
    for backend in ("fsdp", "fsdp_offload", "ds_zero3", "ds_zero3_offload"):
        cfg = compose([f"backend={backend}", "model=llama_1b", "parallelism=gpu8", "train.precision=bf16"])
        s = shape_of(cfg, 8, models.param_count(cfg.model, cfg.workload))
        parts[backend], local[backend] = predict_parts(cfg.backend, s, 1e15, gpu), s.params / 8
    gb = 1e9
    assert parts["fsdp"]["optimizer"] == pytest.approx(40 * local["fsdp"] / (3350 * gb))
    assert parts["fsdp_offload"]["optimizer"] == pytest.approx(
        40 * local["fsdp"] / (DEFAULT_HOST_MEMORY_GBPS * gb) + 12 * local["fsdp"] / (DEFAULT_HOST_LINK_GBPS * gb))
    assert parts["ds_zero3_offload"]["optimizer"] == pytest.approx(
        46 * local["ds_zero3"] / (DEFAULT_HOST_MEMORY_GBPS * gb) + 6 * local["ds_zero3"] / (DEFAULT_HOST_LINK_GBPS * gb))
    assert parts["fsdp_offload"]["step"] > parts["fsdp"]["step"]  # no tie for the advisor to break by name
    cpu = Rates(tflops=1.0, mem_gbps=10.0, comm=CommTable([], "cpu", 2))
    cfg = compose(["backend=fsdp_offload", "model=tiny_llama"])
    s = shape_of(cfg, 2, models.param_count(cfg.model, cfg.workload))
    assert predict_parts(cfg.backend, s, 1e9, cpu)["optimizer"] == pytest.approx(40 * s.params / 2 / (10 * gb))

"""The step-time model: what a step's work is counted as (runtime/measure/work_count.py), the mirror process group that
lets a run nobody started be counted (runtime/simulate/mirror_group.py, runtime/simulate/replay.py), and how the work
is priced (theory/op_costs.py, theory/time.CommTable). In-process, but for the replays of three fixture runs, whose
counted work must be the real runs' own."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist

from harness.runtime.simulate import mirror_group
from harness.runtime.measure import time_profile, work_count
from harness.theory.calibration import calibrate
from harness.theory.op_costs import (DeviceCosts, HostCosts, HOST_TERMS, gaps_before, predict_counted, priced_phases,
                                     work_totals)
from harness.theory.time import CommTable


def step_of(model, optimizer, x):
    with time_profile.phase("step"):
        with time_profile.phase("forward"):
            loss = model(x).sum()
        with time_profile.phase("backward"):
            loss.backward()
        with time_profile.phase("optimizer"), torch.no_grad():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def test_a_step_is_counted_by_phase_kind_flops_and_bytes():
    torch.manual_seed(0)
    model, x = torch.nn.Linear(8, 4, bias=False), torch.randn(2, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    work = work_count.count(lambda: step_of(model, optimizer, x), mirror_group.CallLog()).to_dict()
    rows = [dict(zip(("phase", "kind", "op", "dtype", "flops", "nbytes", "elements", "cold", "count"), r))
            for r in work["ops"]]
    forward_mm = [r for r in rows if r["phase"] == "forward" and r["op"] == "aten::mm"]
    # the forward's matmul: recorded by autograd, 2 x 2 x 8 x 4 FLOPs, its operands and result in bytes
    assert forward_mm == [{**forward_mm[0], "kind": "graph", "flops": 2 * 2 * 8 * 4, "count": 1,
                           "nbytes": 4 * (2 * 8 + 8 * 4 + 2 * 4), "elements": 2 * 4}]
    assert forward_mm[0]["cold"] == [forward_mm[0]["nbytes"]] * 3  # nothing touched before: every byte is cold
    # autograd's engine runs the backward's ops, but for the loss's seed gradient, made before it starts
    backward = {(r["kind"], r["op"]) for r in rows if r["phase"] == "backward" and r["kind"] != "view"}
    assert {kind for kind, _ in backward} == {"engine", "graph"}
    assert [op for kind, op in backward if kind == "graph"] == ["aten::ones_like"]
    # no autograd in the step (torch.optim marks it with a profiler range of its own)
    assert {r["kind"] for r in rows if r["phase"] == "optimizer"} <= {"compute", "view", "alloc", "marker"}
    totals = work_totals(work)
    assert totals["forward"]["flops"] == 128 and totals["backward"]["flops"] == 128  # dW only: x needs no grad
    assert all(totals[p]["lines"] > 0 for p in ("forward", "backward", "optimizer"))
    assert totals["other"]["marker"] > 0  # the phases' own profiler ranges belong to the enclosing step


def test_bytes_touched_again_soon_are_warm():
    t = torch.ones(1024)
    counter = work_count.OpCounter()
    first = counter.cold_bytes([t])
    again = counter.cold_bytes([t])
    assert first == (4096, 4096, 4096) and again == (0, 0, 0)
    counter.cold_bytes([torch.ones(2 << 20 >> 2)])  # 2 MiB of other traffic
    assert counter.cold_bytes([t]) == (4096, 0, 0)  # past 1 MiB of reuse distance, within 4 and 16


@pytest.fixture
def mirror_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group(mirror_group.NAME, store=FakeStore(), rank=0, world_size=4)
    yield
    dist.destroy_process_group()


def test_the_mirror_group_answers_as_if_every_peer_held_this_ranks_tensors(mirror_world):
    log = mirror_group.CallLog()
    with log, time_profile.phase("step"), time_profile.phase("backward"):
        x = torch.ones(8)
        dist.all_reduce(x)
        assert torch.equal(x, torch.full((8,), 4.0))  # a sum over 4 mirrored peers
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        assert torch.equal(x, torch.full((8,), 4.0))
        out = torch.empty(32)
        dist.all_gather_into_tensor(out, torch.arange(8.0))
        assert torch.equal(out, torch.arange(8.0).repeat(4))
        shard = torch.empty(2)
        dist.reduce_scatter_tensor(shard, torch.arange(8.0))
        assert torch.equal(shard, torch.tensor([0.0, 4.0]))  # rank 0's chunk, 4 times over
    rows = {(r["op"], r["size_bytes"], r["phase"]): r["count"] for r in log.rows()}
    assert rows == {("all_reduce", 32, "backward"): 2, ("all_gather", 128, "backward"): 1,
                    ("reduce_scatter", 32, "backward"): 1}


def costs(host=None, rows=(), cores=2, **kw) -> DeviceCosts:
    return DeviceCosts(matmul_tflops={"fp32": 1e-3}, copy_gbps=1.0, elementwise={"fp32": 1e9, "bf16": 1e8}, host=host,
                       comm=CommTable(list(rows), "cpu", 2), cores=cores, **kw)


def work(ops=(), lines=None, collectives=()) -> dict:
    return {"ops": [list(o) for o in ops], "lines": lines or {}, "collectives": list(collectives)}


def test_pricing_adds_host_and_roofline_on_cpu():
    host = HostCosts(**{t: 0.0 for t in HOST_TERMS} | {"graph": 1e-5, "line": 1e-7, "collective": 1e-4})
    w = work([("forward", "graph", "aten::mm", "float32", 2_000_000, 1_000, 100, [1_000] * 3, 3),  # matmul-bound
              ("backward", "engine", "aten::add", "float32", 0, 4_000_000, 10, [4_000_000] * 3, 1),  # memory-bound
              ("backward", "engine", "aten::mul", "bfloat16", 0, 600, 100_000, [600] * 3, 1)],  # elementwise-bound
             lines={"forward": 100},
             collectives=[{"op": "all_reduce", "size_bytes": 4, "group": 2, "phase": "forward", "count": 2}])
    phases = priced_phases(w, costs(host))
    # 3 ops: 3 x 10 µs of host, 3 x 2 ms of matmul at 1 GFLOP/s; 100 lines at 0.1 µs; 2 collectives' host side
    assert phases["forward"]["host"] == pytest.approx(3e-5 + 2e-4)
    assert phases["forward"]["arithmetic"] == pytest.approx(6e-3) and phases["forward"]["lines"] == pytest.approx(1e-5)
    assert phases["forward"]["total"] == pytest.approx(3e-5 + 2e-4 + 6e-3 + 1e-5)
    assert phases["backward"]["memory"] == pytest.approx(4e-3)  # 4 MB at 1 GB/s, no cache curve: all cold
    # 100,000 bf16 results at 1e8 a second: their arithmetic, not their 600 bytes, sets the pace
    assert phases["backward"]["arithmetic"] == pytest.approx(1e-3)
    on_gpu = priced_phases(w, costs(host, device="cuda"))
    assert on_gpu["forward"]["total"] == pytest.approx(6e-3)  # the host launches while the device runs


def test_on_cuda_a_phase_is_its_kernels_and_the_device_waits_where_the_host_is_behind():
    """The host launches while the device runs: a phase's part is its kernels' time (each at least the shortest
    kernel's), and `other` is the device waiting on the host, phase by phase, plus the kernels between phases."""
    from omegaconf import OmegaConf
    from harness.config.mesh import Mesh
    from harness.theory.shape import Shape

    host = HostCosts(**{t: 0.0 for t in HOST_TERMS} | {"compute": 1e-5, "graph": 1e-5, "engine": 1e-5})
    c = costs(host, device="cuda", kernel_s=2e-6,
              matmul_curve={"fp32": [[1e6, 1e-3], [1e9, 1e-2]]})  # 1 GFLOP/s at 1 MFLOP, 10 at 1 GFLOP
    w = work([("forward", "graph", "aten::add", "float32", 0, 8, 2, [8] * 3, 100),  # 100 tiny kernels: host-bound
              ("backward", "engine", "aten::mm", "float32", 10**9, 8, 2, [8] * 3, 1),  # one 0.1 s matmul
              ("optimizer", "compute", "aten::_local_scalar_dense", "float32", 0, 8, 1, [8] * 3, 1),  # a sync
              ("other", "compute", "aten::add", "float32", 0, 8, 2, [8] * 3, 1)])
    phases = priced_phases(w, c)
    assert phases["forward"]["arithmetic"] == pytest.approx(100 * 2e-6)  # the floor: 2 µs each, not ~0
    assert phases["backward"]["arithmetic"] == pytest.approx(1e9 / 1e10)  # the curve's rate at its size
    assert c.matmul_rate("fp32", 10**7.5) == pytest.approx(5.5e-3)  # halfway on a log scale
    out = predict_counted(OmegaConf.create({"family": "ddp"}), Shape(params=100, mesh=Mesh(per_node=1), precision="fp32"), w, c)
    assert out["forward"] == pytest.approx(2e-4) and out["backward"] == pytest.approx(0.1)
    # 1 ms of forward launches (the device idles 0.8 ms of it) and the last one's kernel, the matmul's 100 ms,
    # the sync's kernel, which the host waits for, then 10 µs of host before the last kernel and that kernel
    step = 1e-3 + 2e-6 + 0.1 + 2e-6 + 1e-5 + 2e-6
    assert out["step"] == pytest.approx(step)
    assert out["other"] == pytest.approx(step - 2e-4 - 0.1 - 2e-6)


def test_cached_bytes_are_priced_at_the_copy_of_their_size():
    c = costs(copy_gbps_by_size=[(1 << 16, 8.0), (1 << 20, 8.0), (1 << 22, 8.0), (1 << 26, 1.0)])
    c.copy_gbps = 1.0
    assert c.cache_bytes() == 1 << 22  # the largest copy at least twice the largest's rate
    warm = work([("optimizer", "compute", "aten::add_", "float32", 0, 1 << 20, 1, [1 << 20, 0, 0], 1)])
    cold = work([("optimizer", "compute", "aten::add_", "float32", 0, 1 << 20, 1, [1 << 20, 1 << 20, 1 << 20], 1)])
    t_warm, t_cold = (priced_phases(w, c)["optimizer"]["memory"] for w in (warm, cold))
    assert t_cold == pytest.approx((1 << 20) / 1e9) and t_warm == pytest.approx(t_cold / 8)


def test_other_runs_cold_after_an_optimizer_that_streamed_more_than_the_caches_hold():
    """`other` runs its ops and lines once a step: after an optimizer whose cold bytes exceed the caches, every
    one of them pays the cold start (theory/cold_start.py); after one the caches hold, none does; never on CUDA,
    and not where no cache size was measured."""
    from harness.theory.cold_start import ColdStart

    host = HostCosts(**{t: 0.0 for t in HOST_TERMS} | {"compute": 1e-5, "line": 1e-7})
    c = costs(host, copy_gbps_by_size=[(1 << 16, 8.0), (1 << 22, 8.0), (1 << 26, 1.0)])  # a 4 MiB cache
    c.cold_start = ColdStart(op=5e-6, line=1e-7)
    other = [("other", "compute", "aten::add_", "float32", 0, 8, 2, [8] * 3, 3),
             ("other", "view", "aten::slice", "", 0, 0, 0, [0] * 3, 2)]

    def after(streamed: int) -> dict:
        optimizer = ("optimizer", "compute", "aten::_foreach_add_", "float32", 0, streamed, 1, [streamed] * 3, 1)
        return work([optimizer, *other], lines={"other": 100},
                    collectives=[{"op": "all_reduce", "size_bytes": 4, "group": 2, "phase": "other", "count": 1}])

    flushed = priced_phases(after(8 << 20), c)["other"]
    assert flushed["cold"] == pytest.approx(6 * 5e-6 + 100 * 1e-7)  # 5 ops, a collective, 100 lines: all cold
    assert flushed["total"] == pytest.approx(sum(flushed[t] for t in ("host", "lines", "cold", "arithmetic", "memory")))
    assert priced_phases(after(2 << 20), c)["other"]["cold"] == 0.0  # the caches held the optimizer's bytes
    on_gpu, no_curve = costs(host, device="cuda", copy_gbps_by_size=c.copy_gbps_by_size), costs(host)
    on_gpu.cold_start = no_curve.cold_start = c.cold_start
    assert priced_phases(after(8 << 20), on_gpu)["other"]["cold"] == 0.0
    assert priced_phases(after(8 << 20), no_curve)["other"]["cold"] == 0.0


def test_collectives_are_priced_after_the_host_work_before_them_and_exposed_without_a_spare_core():
    rows = [{"op": "all_reduce", "ranks": 2, "size_bytes": 4, "gap_s": gap, "time_s": t, "busy": True}
            for gap, t in ((1e-4, 1e-3), (1e-2, 3e-3))]
    c = costs(HostCosts(**{t: 0.0 for t in HOST_TERMS} | {"line": 1e-6}), rows)
    w = work(lines={"forward": 1000, "optimizer": 0, "other": 10},  # 1 ms, then 10 µs
             collectives=[{"op": "all_reduce", "size_bytes": 4, "group": 2, "phase": "forward", "count": 1},
                          {"op": "all_reduce", "size_bytes": 4, "group": 2, "phase": "other", "count": 1}])
    parts = {p: t["total"] for p, t in priced_phases(w, c).items()}
    assert gaps_before(w, parts) == pytest.approx({"forward": 1e-3, "other": 1e-5})
    # 1 ms is halfway between the measured gaps on a log scale; 10 µs is below them: the smallest's time
    from omegaconf import OmegaConf
    from harness.config.mesh import Mesh
    from harness.theory.shape import Shape
    out = predict_counted(OmegaConf.create({"family": "ddp"}), Shape(params=100, mesh=Mesh(per_node=2), precision="fp32"), w, c)
    assert out["comm_total"] == pytest.approx(2e-3 + 1e-3)
    assert out["comm_exposed"] == pytest.approx(out["comm_total"])  # 2 ranks, 2 cores: nothing hides
    assert out["step"] == pytest.approx(sum(out[p] for p in ("forward", "backward", "optimizer", "other",
                                                             "comm_exposed")))


def test_calibration_recovers_known_costs_and_never_goes_negative():
    truth = [2e-6, 1.5e-5, 3e-6, 0.0, 0.0, 7e-5, 1.4e-7, 0.0]  # a term no row has units of solves to 0
    units = [[100, 0, 0, 0, 0, 2, 3000, 0], [0, 200, 50, 0, 0, 0, 200, 1], [300, 0, 100, 0, 0, 0, 10000, 0],
             [0, 0, 0, 0, 0, 4, 200, 1], [50, 100, 20, 0, 0, 0, 5000, 0], [10, 10, 10, 0, 0, 1, 100, 0]]
    rows = [(u, sum(a * b for a, b in zip(u, truth)), 1e-3) for u in units]
    assert calibrate(rows) == pytest.approx(truth, abs=1e-12)
    noisy = [(u, t * (1.3 if i % 2 else 0.7), s) for i, (u, t, s) in enumerate(rows)]
    assert min(calibrate(noisy)) >= 0


def test_the_comm_table_interpolates_between_gaps_on_a_log_scale():
    rows = [{"op": "all_gather", "ranks": 2, "size_bytes": size, "gap_s": gap, "time_s": t, "busy": True}
            for gap, scale in ((1e-4, 1.0), (1e-2, 2.0)) for size, t in ((1024, 1e-4 * scale), (4096, 4e-4 * scale))]
    tight = [{"op": "all_gather", "ranks": 2, "size_bytes": 1024, "time_s": 9.0}]  # replaced by the busy rows
    table = CommTable(rows + tight, "cpu", 2)
    assert table.seconds("all_gather", 2048, 2, gap=1e-4) == pytest.approx(2e-4)
    assert table.seconds("all_gather", 2048, 2, gap=1e-3) == pytest.approx(3e-4)
    assert table.seconds("all_gather", 2048, 2, gap=1.0) == pytest.approx(4e-4)  # clamped to the largest gap
    assert table.busy_worlds == {2}


def test_a_ring_across_nodes_moves_over_each_ranks_nic_and_an_all_to_all_over_its_own():
    """NCCL's rings over a group with g ranks a node drive the node's g NICs side by side (theory/time.RING_OPS): a
    full node's ring crosses at 8 x 50 GB/s, HSDP's replica group (a rank a node) and an all-to-all at one NIC's,
    and FSDP2's flat group over 8 nodes of 8 sees it through the mesh; a CPU run's emulated nodes keep one link."""
    from harness.config.compose import compose
    from harness.config.mesh import mesh_of

    table = CommTable([], "cuda", 64, 450, 50)
    size, ranks = 1e9, 64
    ring = table.seconds("all_gather", size, ranks, True, per_node=8)
    assert ring == pytest.approx(20e-6 + size * 63 / 64 / 400e9)
    assert table.seconds("all_gather", size, ranks, True, per_node=1) == pytest.approx(20e-6 + size * 63 / 64 / 50e9)
    assert table.seconds("all_to_all", size, ranks, True, per_node=8) == pytest.approx(20e-6 + size * 63 / 64 / 50e9)
    # two ranks a node: two NICs; NVLink caps it where it carries more than the NICs can (g / (g - 1) of 450)
    assert table.inter_node_busbw("reduce_scatter", 2) == pytest.approx(100e9)
    assert CommTable([], "cuda", 64, 450, 400).inter_node_busbw("all_reduce", 8) == pytest.approx(450e9 * 8 / 7)
    assert CommTable([], "cpu", 4).inter_node_busbw("all_gather", 2) == CommTable([], "cpu", 4).links[True][1]
    mesh = mesh_of(compose(["backend=fsdp_hsdp", "parallelism=gpu8", "parallelism.nnodes=8"]))
    assert mesh.per_node_of("dp_shard") == 8 and mesh.per_node_of("dp_replicate") == 1
    assert mesh_of(compose(["backend=fsdp", "parallelism=gpu8", "parallelism.nnodes=8"])).per_node_of(None) == 8


def by_op(work: dict, phase: str) -> Counter:
    out = Counter()
    for r in work["ops"]:
        if r[0] == phase:
            out[(r[1], r[2], r[4])] += r[-1]  # kind, op, FLOPs
    return out


def test_a_replayed_rank_counts_the_work_its_real_run_counted(bf16_runs, tmp_path):
    """One backend a family from the bf16 sweep (2 ranks, tiny_gpt2, native), its last rank replayed from its
    own config.yaml in one process over the mirror group (ZeRO-2's last partition holds other parameters than
    the first, and more work), against the real run's same rank's counted step: the same ops of
    every kind, name and FLOPs in every phase, the same collectives, Python lines within 5% (and 30 a
    collective). Two differences
    are the process groups', and both are held exactly: gloo's reduce-scatter splits its input and copies the
    result on the calling thread (one split and one copy a call, which the real run counts and the mirror's
    own copies are not), and FSDP2's gradient-norm all-reduce, which DTensor issues where the real run's
    counter cannot see it, is counted by the replay only."""
    from omegaconf import OmegaConf

    from harness.config import schema
    from harness.config.families import representatives
    from harness.core.rundir import RunDir
    from harness.launcher.replays import replay_work
    from harness.reporting.time_and_comm import slowest_work

    configs, real = {}, {}
    for backend in representatives():
        run_dir = bf16_runs[backend][2]
        configs[backend] = OmegaConf.merge(OmegaConf.structured(schema.RunConfig),
                                           OmegaConf.load(run_dir / "config.yaml"))
        real[backend] = slowest_work(RunDir(run_dir), rank=1)  # ranks differ (ZeRO's partitions): the last's
    from forked_ranks import ForkedPopen

    replayed = replay_work(configs, tmp_path, jobs=1, rank=1, popen=ForkedPopen)  # a fork: no imports to pay
    for backend in configs:
        assert replayed[backend]["ok"], replayed[backend].get("traceback")
        mine, theirs = replayed[backend]["work"], real[backend]
        for phase in ("forward", "backward", "optimizer", "other"):
            scatters = sum(c["count"] for c in theirs["collectives"]
                           if c["op"] == "reduce_scatter" and c["phase"] == phase)
            only_real = by_op(theirs, phase) - by_op(mine, phase)  # what gloo's calls ran on this thread
            assert not by_op(mine, phase) - by_op(theirs, phase), (backend, phase)
            by_name = Counter()
            for (_, op, _), n in only_real.items():
                by_name[op] += n
            assert by_name == Counter({"aten::copy_": scatters, "aten::split.Tensor": scatters}) - Counter(), \
                (backend, phase)
            # the mirror's Python futures cost ~28 lines each on their way back through C++ (torch's
            # _jit_internal._extract_tensors pickles the result to find its tensors): 4 µs a collective here
            calls_here = sum(c["count"] for c in mine["collectives"] if c["phase"] == phase)
            lines = (mine["lines"].get(phase, 0), theirs["lines"].get(phase, 0))
            assert abs(lines[0] - lines[1]) <= 0.05 * lines[1] + 30 * calls_here, (backend, phase, lines)
        calls = [Counter({(c["op"], c["size_bytes"], c["phase"]): c["count"] for c in w["collectives"]})
                 for w in (mine, theirs)]
        only_replayed = calls[0] - calls[1]
        assert not calls[1] - calls[0], backend
        expected = [("all_reduce", "optimizer", 1)] if backend == "fsdp" else []  # the norms, one a gradient
        assert [(op, phase, n) for (op, _, phase), n in only_replayed.items()] == expected, (backend, only_replayed)


def test_grouped_query_attention_counts_the_flops_of_as_many_key_value_heads_as_query_heads():
    """llama_1b's 32 query heads share 8 key/value heads: torch's sdpa formulas assert equal heads, so the
    counter gives the key/value shapes the query's heads, the work a grouped-query kernel does."""
    from types import SimpleNamespace
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, kv = torch.empty(2, 32, 256, 64, device="meta"), torch.empty(2, 8, 256, 64, device="meta")
    forward = SimpleNamespace(_overloadpacket=SimpleNamespace(__name__="_scaled_dot_product_flash_attention"))
    backward = SimpleNamespace(_overloadpacket=SimpleNamespace(__name__="_scaled_dot_product_flash_attention_backward"))
    assert work_count.attention_flops(forward, (q, kv, kv)) == sdpa_flop_count(q.shape, q.shape, q.shape) > 0
    assert work_count.attention_flops(backward, (q, q, kv, kv)) == sdpa_backward_flop_count(*[q.shape] * 4) > 0


def test_attention_that_is_not_causal_is_priced_at_the_whole_square_it_computes():
    """The measured attention rate is causal calls' (FLOPs counted as the whole square, as torch's formulas count
    them; the kernel computes half): a call with is_causal=False, as torch's ring runs all but its first chunk of
    each step, is named so by the counter and takes twice the time of a causal call of the same FLOPs."""
    from harness.theory.op_costs import NON_CAUSAL, OpRow, op_seconds

    q = torch.empty(1, 4, 128, 16)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert work_count.attention_name(op, (q, q, q), {"is_causal": True}) == str(op.name())
    assert work_count.attention_name(op, (q, q, q, 0.0, False), {}) == str(op.name()) + NON_CAUSAL
    assert work_count.attention_name(op, (q, q, q), {}) == str(op.name()) + NON_CAUSAL  # its schema's default
    assert work_count.attention_name(torch.ops.aten.mm.default, (q, q), {}) == "aten::mm"
    costs = DeviceCosts(matmul_tflops={"fp32": 1.0}, copy_gbps=1e9, elementwise={"fp32": 1e12}, host=None,
                        comm=CommTable([], "cpu", 1), attention={"fp32": {"forward": [1e-3, 1e12]}})

    def seconds(name: str) -> float:
        row = OpRow("forward", "compute", name, "float32", 10**12, 1, 1, (0, 0, 0), 1)
        return op_seconds(row, costs)["arithmetic"]
    assert seconds(str(op.name())) == pytest.approx(1.001)
    assert seconds(str(op.name()) + NON_CAUSAL) == pytest.approx(2.001)


def test_a_collective_that_costs_nothing_at_some_size_is_priced_without_dividing_by_zero():
    """One rank on NCCL: a busy all-reduce blocks 0 µs at some sizes (the first H200 run's llama_1b/ddp failed on
    the logarithm of 0)."""
    rows = [{"op": "all_reduce", "ranks": 1, "size_bytes": size, "gap_s": 1e-4, "time_s": t, "busy": True,
             "device": "cuda"}
            for size, t in ((4, 0.0), (1024, 0.0), (1 << 20, 2e-6))]
    table = CommTable(rows, "cuda", 1)
    assert table.seconds("all_reduce", 512, 1) == 0.0
    assert 0.0 < table.seconds("all_reduce", 1 << 19, 1) < 2e-6


def test_an_axis_collective_that_waits_does_not_set_the_hiding_rule_of_the_data_parallel_ones():
    # tensor parallelism without loss parallel all-gathers the whole logits (2.1 GB at 8,192 tokens of Llama 3's
    # 128,256 vocabulary), larger than any FSDP2 block gather at tp 4: the op's largest buffer had decided the rule
    # and exposed every FSDP2 all-gather with it (a 70B step on 32 H200s read 5.8 s exposed, now 0.9 s)
    from harness.config.compose import compose
    from harness.runtime import models
    from harness.theory.hiding import hiding_rule
    from harness.theory.shape import shape_of

    cfg = compose(["model=llama_70b", "backend=fsdp", "parallelism.device=cuda", "parallelism.nproc_per_node=4",
                   "parallelism.nnodes=8", "parallelism.tp=4", "parallelism.loss_parallel=false",
                   "parallelism.seq_len=4096", "parallelism.micro_batch=2", "train.precision=bf16"])
    s = shape_of(cfg, None, models.param_count(cfg.model))
    assert hiding_rule(cfg.backend, s)["all_gather"] == "forward+backward"

"""Expert parallelism (parallel/ep/): transformers' expert parallelism under FSDP2, its experts split over `ep`
ranks borrowed from the data-parallel ones and sharded over `efsdp`. Refused in one line where it cannot run;
laid out by the mesh; counted by the theory (states, the experts' own gathers, the dispatch and combine
all-to-alls); held to DDP's losses and gradient norms at 2 ranks (ep 2, efsdp 1) and 4 ranks (efsdp 2 x ep 2)
on both tiny MoEs, to the memory theory, and resumed exactly from its checkpoint at ep 2 and at ep 1."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from omegaconf import OmegaConf

from harness.config import rules
from harness.config.compose import compose
from harness.config.mesh import mesh_of
from harness.core.records import RankReport
from harness.reporting import routed_memory
from harness.studies.memory import check as memory_check
from harness.runtime import models
from harness.theory import communication, moe
from harness.theory.shape import shape_of

from conftest import zero3_per_module

MOE4 = ["model=tiny_qwen3_moe", "backend=fsdp", "parallelism.nproc_per_node=4"]
MOE_RUN = ["logger=none", "profile=parity", "parallelism.nproc_per_node=2", "parallelism.grad_accum=2", "train.steps=5",
           "train.warmup_steps=2", "train.measure_flops=false", "train.breakdown_steps=0", "train.profile_memory=false",
           "train.count_collectives=false"]


@pytest.mark.parametrize("overrides, says", [
    (["model=tiny_llama", "backend=fsdp", "parallelism.ep=2"], "is dense (model.num_experts=0)"),
    ([*MOE4, "parallelism.ep=3"], "parallelism.ep=3: must divide the 4 ranks a parameter is sharded over"),
    ([*MOE4[:2], "parallelism.nproc_per_node=3", "parallelism.ep=3"], "must divide model.num_experts=8"),
    ([*MOE4, "backend=ddp", "parallelism.ep=2"], "DDP all-reduces every gradient over every rank"),
    ([*MOE4, "backend=fsdp1", "parallelism.ep=2"], "FSDP1's one flat parameter a unit cannot"),
    ([*MOE4, "backend=ds_zeropp", "parallelism.ep=2"], "AutoEP under ZeRO-3 does not support hpZ's secondary"),
    ([*MOE4, "backend=fsdp_partial", "parallelism.nnodes=2", "parallelism.ep=2"],
     "(partial resharding, ZeRO++'s hpZ)"),
    ([*MOE4, "workload=lora", "parallelism.ep=2"], "workload=lora is not split by expert parallelism"),
    ([*MOE4, "parallelism.ep=0"], "parallelism.ep=0: must be positive"),
])
def test_what_expert_parallelism_cannot_run_is_refused_in_one_line(overrides, says):
    found = rules.problems(compose(overrides), lambda: 0)
    assert any(says in line for line in found), found
    assert all("\n" not in line for line in found)


def test_the_ep_ranks_are_borrowed_from_the_shard_group_as_torchtitan_lays_them_out():
    mesh = mesh_of(compose(["model=tiny_qwen3_moe", "backend=fsdp", "parallelism=gpu8", "parallelism.nnodes=2",
                            "parallelism.ep=4"]))
    assert (mesh.world, mesh.dp, mesh.ep, mesh.efsdp) == (16, 16, 4, 4)  # world unchanged: ep is not a factor
    assert mesh.groups("ep")[:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # consecutive: inside a node
    assert mesh.groups("efsdp")[0] == [0, 4, 8, 12] and mesh.link("efsdp") == "inter_node"
    assert mesh.link("ep") == "intra_node"
    assert mesh.describe() == "dp 16 (experts: ep 4 x efsdp 4)"


def test_a_ranks_states_are_its_experts_over_efsdp_and_the_dense_rest_over_every_rank():
    """Qwen3-30B-A3B on 8 ranks: at ep 8 each rank holds 16 of 128 experts whole and 1/8 of the rest, the same
    bytes as 1/8 of everything at ep 1 (no padding: 128 experts divide by 8), while the experts' all-gathers
    (every 128 of a layer over 8 ranks) give way to the all-to-alls over the 8 ep ranks."""
    configs = {ep: compose(["model=qwen3_30b_a3b", "backend=fsdp", "parallelism=gpu8", "train.precision=bf16",
                            f"parallelism.ep={ep}"]) for ep in (1, 8)}
    m = configs[1].model
    counts = models.param_count(m)
    shapes = {ep: shape_of(cfg, None, counts) for ep, cfg in configs.items()}
    experts_per_block = m.num_experts * 3 * m.hidden_size * m.expert_intermediate_size
    assert shapes[8].block_experts * 8 == shapes[1].block_experts == experts_per_block
    assert shapes[8].shard_params == shapes[1].shard_params == counts["total"] // 8
    by_op = {ep: Counter() for ep in shapes}
    for ep, s in shapes.items():
        for c in communication.collectives(configs[ep].backend, s):
            by_op[ep][(c.op, c.group)] += c.size_bytes * c.count
    assert ("all_gather", "efsdp") not in by_op[8]  # efsdp 1: nothing to gather
    s, par = shapes[8], configs[8].parallelism
    layers = m.num_layers * par.grad_accum
    # a layer and micro-batch: k x T rows of the bf16 residual stream (FSDP2's param_dtype) dispatched and
    # combined, forward and backward, and the E int64 split sizes forward
    rows = m.experts_per_token * par.micro_batch * par.seq_len * m.hidden_size * 2
    assert by_op[8][("all_to_all", "ep")] == pytest.approx(layers * (4 * rows + m.num_experts * 8))
    assert by_op[1][("all_to_all", "ep")] == 0


def test_the_estimator_searches_ep_beside_the_data_parallel_families(capsys):
    from harness.studies.predict import estimate

    assert estimate.main(["model=tiny_mixtral", "parallelism=gpu8"]) == 0
    rows = [line.split("│") for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    meshes = {(r[1].strip(), *(c.strip() for c in r[2:6])) for r in rows}
    assert ("fsdp", "8", "1", "1", "8") in meshes and ("fsdp", "8", "1", "1", "2") in meshes
    # DeepSpeed's AutoEP beside it, but not under ZeRO++ (hpZ), DDP or FSDP1, which refuse ep
    assert {("ds_zero2", "8", "1", "1", ep) for ep in ("1", "2", "4", "8")} <= meshes
    assert {m[4] for m in meshes if m[0] in ("ddp", "ds_zeropp") or m[0].startswith("fsdp1")} == {"1"}


def _launch_cells(ep_two_rank_runs, ep_mixtral_two_rank_runs, ep_runs, ep_selective_runs, ep_qwen2_runs) -> dict:
    return {"qwen3_moe at 2 ranks": ep_two_rank_runs["fsdp"], "mixtral at 2 ranks": ep_mixtral_two_rank_runs["fsdp"],
            # selective_op: its recompute sends the forward's all-to-alls again, as full checkpointing's does
            "mixtral at 2 ranks, selective_op": ep_selective_runs["fsdp"],
            "qwen3_moe at 4 ranks": ep_runs["qwen3_moe"], "mixtral at 4 ranks": ep_runs["mixtral"],
            # HSDP's 2 replicas of dp_shard 2, each holding ep 2 x efsdp 1 (the experts' shards all-reduced
            # across the replicas)
            "qwen3_moe at 4 ranks, HSDP": ep_runs["qwen3_moe_hsdp"],
            "qwen3_moe at 4 ranks, AutoEP ZeRO-2": ep_runs["qwen3_moe_autoep_zero2"],
            "mixtral at 4 ranks, AutoEP ZeRO-3": ep_runs["mixtral_autoep_zero3"],
            # Qwen2-MoE's shared expert: dense, over every data-parallel rank, beside the split experts
            "qwen2_moe at 2 ranks, selective_op_half": ep_qwen2_runs["fsdp"],
            "qwen2_moe at 4 ranks": ep_runs["qwen2_moe"],
            "qwen2_moe at 4 ranks, AutoEP ZeRO-3": ep_runs["qwen2_moe_autoep_zero3"]}


def test_expert_parallelism_trains_as_ddp_does(moe_runs, moe_mixtral_runs, moe_qwen2_runs, ep_two_rank_runs,
                                                ep_mixtral_two_rank_runs, ep_runs, ep_selective_runs, ep_qwen2_runs):
    """The same 8 sequences a step as DDP on 2 ranks: the losses and the gradient norm (Adam's m/sqrt(v) hides a
    constant factor in the experts' gradients, which the losses alone would not show), and at 2 ranks the routing
    (moe/aux_loss is rank 0's tokens, which are DDP's rank 0's only there)."""
    for cell, (summary, records, run_dir) in _launch_cells(ep_two_rank_runs, ep_mixtral_two_rank_runs,
                                                           ep_runs, ep_selective_runs, ep_qwen2_runs).items():
        reference = {"qwen3": moe_runs, "mixtral": moe_mixtral_runs, "qwen2": moe_qwen2_runs}[
            cell.split("_")[0].split(" ")[0]]["ddp"][1]
        assert summary["status"] == "ok", (cell, summary.get("reason"))
        for key in ("loss/loss", "loss/grad_norm", *(("moe/aux_loss",) if "2 ranks" in cell else ())):
            assert [r[key] for r in records] == pytest.approx([r[key] for r in reference], rel=1e-4), (cell, key)
        settings = json.loads((run_dir / "settings.json").read_text())["expert_parallel"]
        ranks = 4 if "4 ranks" in cell else 2
        if "AutoEP" in cell:  # DeepSpeed's groups as it built them: the mesh's ep and efsdp groups of rank 0
            mesh = mesh_of(OmegaConf.load(run_dir / "config.yaml"))
            assert (settings["implementation"], settings["config"]["autoep_size"]) == ("DeepSpeed AutoEP", 2)
            assert settings["replaced_layers"] == 2, cell  # both MoE blocks replaced by AutoEPMoELayer
            assert settings["ep_group"] == mesh.groups("ep")[0] == [0, 1], cell
            assert settings["expert_data_parallel_group"] == mesh.groups("efsdp")[0] == [0, 2], cell
            continue
        efsdp = 1 if "HSDP" in cell else ranks // 2  # HSDP: each replica's dp_shard 2 is its ep 2
        assert (settings["ep"], settings["efsdp"], settings["local_experts"]) == (2, efsdp, 4), cell
        assert settings["gradient_divide_factor"] == ranks


def test_expert_parallel_states_bytes_and_peak_are_the_theorys(ep_two_rank_runs, ep_mixtral_two_rank_runs,
                                                               ep_runs, ep_selective_runs, ep_qwen2_runs):
    for cell, (summary, _, run_dir) in _launch_cells(ep_two_rank_runs, ep_mixtral_two_rank_runs, ep_runs,
                                                     ep_selective_runs, ep_qwen2_runs).items():
        f = summary["figures"]
        assert abs(f["memory/model_states_error_pct"]) <= 1, (cell, f["memory/model_states_error_pct"])
        ranks = json.loads((run_dir / "ranks" / "report.json").read_text())["ranks"]
        cfg = OmegaConf.load(run_dir / "config.yaml")  # the run's own config, composed
        predicted = communication.collectives(cfg.backend, shape_of(cfg, None, ranks[0]["params"]))
        mesh = mesh_of(cfg)
        # the dispatch and combine rows are the router's: half of a rank's all-to-alls send back what its experts
        # received, so each rank sends the theory's bytes at its received share of the counted step
        # (parallel/ep/comm.py), and their mean over the ranks is the balanced theory's (each row received once)
        def all_to_all(rows) -> float:  # (op, size, count) rows: the token-carrying all-to-alls' bytes a step
            return sum(size * count for op, size, count in rows if op == "all_to_all" and size > 64)

        def theory_at(share: float) -> float:
            shape = dataclasses.replace(shape_of(cfg, None, ranks[0]["params"]), received_share=share)
            return all_to_all((c.op, c.size_bytes, c.count) for c in communication.collectives(cfg.backend, shape))

        sent = [all_to_all((c["op"], c["size_bytes"], c["count"]) for c in r["collectives"]) for r in ranks]
        micro_batches = [moe.received_shares([r["work"]["routed_rows"][m] for r in ranks], mesh.groups("ep"))
                         for m in range(cfg.parallelism.grad_accum)]
        for rank, bytes_sent in enumerate(sent):
            share = sum(shares[rank] for shares in micro_batches) / len(micro_batches)
            at_share = theory_at(share)
            print(f"EP {cell} rank {rank}: received {share:.3f}x the balanced rows in the counted step, sent "
                  f"{100 * (bytes_sent / at_share - 1):+.3f}% of the all-to-all bytes the theory sends at them")
            assert bytes_sent == pytest.approx(at_share, rel=1e-3), (cell, rank, share, bytes_sent, at_share)
        assert sum(sent) / len(sent) == pytest.approx(theory_at(1.0), rel=1e-3), (cell, sent)
        # the summary compares the rank that sent most with itself
        assert abs(f["comm/bytes_error_pct"]) <= 0.1, (cell, f["comm/bytes_error_pct"])
        # every other collective, by op, size and group, is the theory's (the 4-byte norms and losses aside); under
        # DeepSpeed by op and group, its bytes a step: ZeRO coalesces and buckets what the theory lists by tensor
        deepspeed = "AutoEP" in cell
        measured = Counter()
        for c in ranks[0]["collectives"]:
            if c["op"] != "all_to_all" and c["size_bytes"] > 64:
                key = (c["op"], tuple(c["ranks"])) if deepspeed else (c["op"], c["size_bytes"], c["group"])
                measured[key] += c["count"] * (c["size_bytes"] if deepspeed else 1)
        expected = Counter()
        for c in predicted:
            if c.op != "all_to_all" and c.size_bytes > 64 and mesh.size(c.group) > 1:
                key = ((c.op, tuple(mesh.groups(c.group)[0])) if deepspeed
                       else (c.op, round(c.size_bytes), mesh.size(c.group)))
                expected[key] += c.count * (c.size_bytes if deepspeed else 1)
        assert measured == pytest.approx(expected), cell
        # each rank against the theory at the rows its experts received in its profiled step (reporting/
        # routed_memory.py): tiny Mixtral's router sent ranks 0 and 2 1.22x to 1.52x the balanced rows, by launch
        routed = routed_memory.routed_peaks(cfg, [RankReport.from_dict(r) for r in ranks])
        errors = []
        for rank, r in zip(ranks, routed):
            p = rank["tensor_peak"]
            error, held = (100 * (p["peak"] - r["predicted"]) / r["predicted"],
                           100 * (p["peak"] - p["unaccounted"] - r["predicted"]) / r["predicted"])
            errors.append(error)
            print(f"EP {cell} rank {rank['rank']}: received {r['share']:.3f}x the balanced rows, peak {error:+.1f}% "
                  f"against the theory at them ({held:+.1f}% less what it had not released at the after-backward "
                  "marker)")
            # what a rank keeps follows what its experts receive, under transformers' dispatch and AutoEP's padded
            # one (theory/moe.py). Measured 2026-11-30, one launch of each cell: -1.5% to +5.8% a rank (-6.1% to
            # +13.5% against the balanced theory); the FSDP2 ranks that received most read highest, by the
            # experts' forward working set (not modelled: docs/moe.md), +5% at ep 1 too
            assert abs(error) <= 10, (cell, rank["rank"], r["share"], error)
        # their mean within 10% too. AutoEP ZeRO-3's had read +12.9% and +13.0% (2026-11-30): each block kept its
        # local experts' gathered weights from forward to backward, saved by AutoEP's grouped matmuls
        # (backends/deepspeed/theory.saved_experts, 196,608 B here), now in the theory
        assert abs(sum(errors) / len(errors)) <= 10, (cell, errors)
        # the summary and `shardbench memory-check` judge the busiest rank against its own share's prediction
        busiest = max(routed, key=lambda r: r["peak"])
        assert f["memory/tensor_peak_predicted_bytes"] == pytest.approx(busiest["predicted"]), cell
        row = memory_check.row_of_run(cell, [], run_dir)
        assert row["error_pct"] == pytest.approx(100 * (busiest["peak"] / busiest["predicted"] - 1)), cell


def test_zero3_keeps_each_blocks_gathered_experts_from_forward_to_backward_at_every_ep():
    """AutoEP's grouped matmuls save transposed views of the gathered expert weights, which ZeRO-3's release does
    not free (backends/deepspeed/theory.saved_experts): after forward every block's E/ep experts, in block
    k's backward blocks 0..k's; at ep 1 transformers' grouped matmuls, every expert. Not under ZeRO-2 (its
    parameters are whole: the views are their storage), nor for a block whose parameters stay gathered anyway (a
    reuse distance covering the step)."""
    from harness.config.derive import world_size
    from harness.theory.predict import predict

    def terms(*overrides):
        cfg = compose(["model=tiny_mixtral", "parallelism.nproc_per_node=4", "parallelism.micro_batch=1",
                       "parallelism.grad_accum=2", *overrides])
        counts = models.param_count(cfg.model)
        f = predict(cfg, world_size(cfg), counts)
        saved = {phase: f.get(f"memory/{phase}_saved_experts_predicted_bytes", 0)
                 for phase in ("forward_end", "backward_start", "block_backward")}
        return shape_of(cfg, None, counts), saved, f["memory/peak_block_predicted"]

    released = list(zero3_per_module())
    s, saved, k = terms("backend=ds_zero3", "parallelism.ep=2", *released)
    every_block = 4 * s.block_experts * s.blocks  # fp32: 4 of tiny Mixtral's 8 experts a rank, 2 blocks
    assert s.block_experts == 4 * 3 * 64 * 32 and every_block == 196_608  # measured: 6 gathered weights of 32,768 B
    assert saved["forward_end"] == saved["backward_start"] == every_block
    assert saved["block_backward"] == 4 * s.block_experts * (k + 1)
    assert set(terms("backend=ds_zero2", "parallelism.ep=2")[1].values()) == {0}
    # ep 1: transformers' grouped matmuls save views of every expert weight the same way (all 8 experts a block)
    s1, saved1, k1 = terms("backend=ds_zero3", *released)
    assert s1.block_experts == 2 * s.block_experts
    assert saved1["forward_end"] == saved1["backward_start"] == 4 * s1.block_experts * s1.blocks == 393_216
    assert saved1["block_backward"] == 4 * s1.block_experts * (k1 + 1)
    assert set(terms("backend=ds_zero3")[1].values()) == {0}  # the whole model gathered, forward to backward
    assert set(terms("backend=ds_zero3", "parallelism.ep=2")[1].values()) == {0}  # DeepSpeed's reuse distance


def test_an_expert_parallel_checkpoint_resumes_exactly_at_ep_2_and_at_ep_1(ep_runs, ep_resume_runs):
    # saved after step 3 of 5 at efsdp 2 x ep 2 (DCP); resumed at ep 2 on 2 ranks (efsdp 1) and at ep 1 under
    # FSDP2 and DDP (the experts' shards joined); AutoEP's (ZeRO-2) at ep 2 on 2 ranks through DeepSpeed's
    # universal conversion, and at ep 1 without AutoEP, its experts renamed and regrouped to the model's
    # (ZeRO-2's on tiny Qwen3-MoE, ZeRO-3's on tiny Mixtral, each with its step counters unshared: strategy.py)
    assert set(ep_resume_runs) == {"ep2/fsdp", "ep1/fsdp", "ep1/ddp", "ep2/ds_zero2 (AutoEP)",
                                   "ep1/ds_zero2 (AutoEP)", "ep1/ds_zero3 (AutoEP)"}
    saved = {"ds_zero2 (AutoEP)": "qwen3_moe_autoep_zero2", "ds_zero3 (AutoEP)": "mixtral_autoep_zero3"}
    for cell, (summary, records, run_dir) in ep_resume_runs.items():
        original = ep_runs[saved.get(cell.split("/", 1)[1], "qwen3_moe")][1][3:]
        assert summary["status"] == "ok", (cell, summary.get("reason"))
        assert [r["step"] for r in records] == [3, 4], cell
        if "AutoEP" in cell:
            report = json.loads((run_dir / "ranks" / "report.json").read_text())
            framework = report["ranks"][0]["checkpoint"]["resumed"]["framework"]
            assert framework["load_universal"] and framework["saved_world"] == 4, framework
            assert framework["autoep_experts_renamed"] == cell.startswith("ep1/"), framework
            if "zero3" in cell:  # its 3 sub-groups' one step counter given to each its own
                assert framework["step_counters_unshared"] == 2, framework
        for key in ("loss/loss", "loss/grad_norm"):
            assert [r[key] for r in records] == pytest.approx([r[key] for r in original], rel=1e-5), (cell, key)


def test_experts_the_shard_group_outnumbers_are_sharded_on_their_second_dimension(two_experts_ddp_runs, ep_runs):
    """2 experts (top-1) on 4 ranks, at ep 1 (dp 4 over 2 experts) and at ep 2 (efsdp 2 over 1 expert a rank):
    FSDP2 shards the expert weights on dim 1 (on dim 0 a rank would hold a padded expert: at ep 1 the expert
    shards twice the theory's), trains as DDP does and holds the theory's states."""
    reference = two_experts_ddp_runs["ddp"][1]
    for cell in ("two_experts_ep1", "two_experts"):
        summary, records, run_dir = ep_runs[cell]
        assert summary["status"] == "ok", (cell, summary.get("reason"))
        for key in ("loss/loss", "loss/grad_norm"):
            assert [r[key] for r in records] == pytest.approx([r[key] for r in reference], rel=1e-4), (cell, key)
        assert abs(summary["figures"]["memory/model_states_error_pct"]) <= 1, cell
        assert json.loads((run_dir / "settings.json").read_text())["fsdp"]["experts_shard_dim"] == 1, cell


def test_mixtral_on_256_ranks_holds_a_256th_of_its_experts_not_an_eighth():
    """FSDP2 on dim 0 puts one padded row of Mixtral-8x7B's 8 experts on each of 256 ranks (84 GiB of states a
    rank, traced: docs/moe.md); on dim 1, as torchtitan shards them, 1/256 of every expert, at ep 1 and ep 8."""
    counts = None
    for ep in (1, 8):
        cfg = compose(["model=mixtral_8x7b", "backend=fsdp", "parallelism=multinode", "parallelism.nnodes=32",
                       f"parallelism.ep={ep}"])
        counts = counts or models.param_count(cfg.model)
        s = shape_of(cfg, None, counts)
        assert s.mesh.world == 256
        assert s.shard_params == pytest.approx(counts["total"] / 256, rel=1e-3), ep


@pytest.mark.drill
def test_an_expert_parallel_cell_traces_at_the_balanced_routing():
    """On fake tensors the all-to-all's split sizes cannot be read (they are the router's); the trace answers them
    as the balanced routing the theory assumes (runtime/simulate/traced.balanced_routing), so the real FSDP2 +
    expert-parallel code runs at any world: tiny Qwen3-MoE at 8 ranks, ep 4 x efsdp 2, held to the theory."""
    from harness.studies.predict import traced_cells

    row = traced_cells.trace_cell(["model=tiny_qwen3_moe", "backend=fsdp", "parallelism.ep=4", "train.precision=bf16",
                                   "parallelism.device=cpu",
                                   "logger=none", *traced_cells.world_overrides(8)])
    assert row["ok"], (row.get("error"), row.get("where"))
    row = traced_cells.compare(row)
    assert abs(row["states_error_pct"]) <= 1 and abs(row["bytes_error_pct"]) <= 0.1, row
    sizes = {(c["op"], c["group"]) for c in row["collectives_traced"]}
    assert ("all_to_all", 4) in sizes  # the dispatch and combine, over the 4 ep ranks


def test_transformers_registry_answers_deepspeeds_str_keys_and_its_own_model_keys():
    """DeepSpeed 0.19.8's AutoEP reads and restores transformers 5.23's output-recorder registry by class name;
    transformers keys it on a model. After the fix both work, and transformers' own entries are unchanged."""
    from transformers.utils import output_capturing

    from harness.backends.deepspeed import autoep

    autoep.keyed_output_registry()
    autoep.keyed_output_registry()  # idempotent
    registry, missing = output_capturing._CAN_RECORD_REGISTRY, object()
    key = "<class 'shardbench.Probe'>"
    assert registry.get(key, missing) is missing  # DeepSpeed's (key, default)
    registry[key] = {"router_logits": "probe"}  # DeepSpeed's restore, by name
    assert registry.get(key) == {"router_logits": "probe"} and dict.get(registry, key) == {"router_logits": "probe"}
    del registry[key]
    model = models.build(compose(["model=tiny_qwen3_moe"]).model)
    assert registry.get(model) == (dict.get(registry, str(model.__class__)) or {})  # transformers' own (model)


def test_an_autoep_checkpoint_is_no_layout_of_its_own():
    """AutoEP's experts load at any ep, ep 1 included (their names and tensors converted:
    backends/deepspeed/autoep_checkpoint.py), so ep is not in DeepSpeed's checkpoint layout; a checkpoint whose
    marker named AutoEP in its layout (before this was so) loads as well, and another ZeRO stage still does not."""
    from harness.config import families

    configs = {ep: compose([*MOE4, "backend=ds_zero2", f"parallelism.ep={ep}"]) for ep in (1, 2, 4)}
    family = families.of(configs[1].backend)
    layouts = {ep: family.checkpoint_layout(cfg) for ep, cfg in configs.items()}
    assert set(layouts.values()) == {"ZeRO stage 2, fp32"}
    assert family.layout_loads("ZeRO stage 2, fp32, AutoEP", layouts[1])
    assert not family.layout_loads("ZeRO stage 3, fp32, AutoEP", layouts[1])



@pytest.mark.parametrize("layout", ["gate_up_first", "hidden_first"])
def test_autoeps_experts_regroup_into_the_models_tensors_and_back(layout):
    """A checkpoint moves between AutoEP and ep 1 by the inverse of AutoEP's own repacking
    (deepspeed/moe/ep_repack.py): its gate, up and down from the model's fused gate|up and down, in both layouts
    DeepSpeed knows, put back into the model's tensors to the bit (as_dense), and split again into AutoEP's
    (as_autoep). h != i, so a transposition that should not be there changes the shape."""
    from types import SimpleNamespace

    import torch
    from deepspeed.moe.ep_repack import _repack_fused_3d

    from harness.backends.deepspeed import autoep_checkpoint

    e, h, i = 4, 5, 3
    gate_up, down = ((e, 2 * i, h), (e, h, i)) if layout == "gate_up_first" else ((e, h, 2 * i), (e, i, h))
    experts = torch.nn.Module()
    experts.gate_up_proj = torch.nn.Parameter(torch.randn(gate_up))
    experts.down_proj = torch.nn.Parameter(torch.randn(down))
    spec = SimpleNamespace(expert_w1_name="gate_up_proj", expert_w2_name="down_proj", expert_w3_name=None)
    w1, w2, w3 = _repack_fused_3d(experts, spec, 0, e)  # what AutoEP holds: [E, i, h], [E, h, i], [E, i, h]
    assert tuple(w1.shape) == (e, i, h) and tuple(w2.shape) == (e, h, i)
    assert torch.equal(autoep_checkpoint.to_model([w1, w3], gate_up, down), experts.gate_up_proj.data)
    assert torch.equal(autoep_checkpoint.to_model([w2], down, ()), experts.down_proj.data)
    again = autoep_checkpoint.to_autoep(experts.gate_up_proj.data, 2, gate_up, down)
    assert torch.equal(again[0], w1) and torch.equal(again[1], w3)
    assert torch.equal(autoep_checkpoint.to_autoep(experts.down_proj.data, 1, gate_up, down)[0], w2)


@pytest.mark.drill
def test_a_checkpoint_saved_without_autoep_resumes_under_it(tmp_path):
    """ZeRO-2 at ep 1 on 2 ranks saves after step 3; the same run at ep 2 (AutoEP) resumes it through DeepSpeed's
    universal conversion, the model's fused experts split into AutoEP's and the optimizer's hyperparameters given
    to AutoEP's expert group (autoep_checkpoint.as_autoep), and trains steps 3 and 4 as the saved run did."""
    import subprocess

    from conftest import REPO
    from harness.core.spawn import train_command

    run = ["model=tiny_qwen3_moe", "backend=ds_zero2", *MOE_RUN]

    def train(run_dir, *overrides):
        done = subprocess.run(train_command(*run, *overrides, run_dir=run_dir), cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    saved = train(tmp_path / "ep1", "train.checkpoint_every=3")
    resumed = train(tmp_path / "ep2", "parallelism.ep=2",
                    f"train.resume='{tmp_path / 'ep1' / 'checkpoints' / 'step_0000003'}'")
    original = {r["step"]: r for r in saved}
    assert [r["step"] for r in resumed] == [3, 4]
    for key in ("loss/loss", "loss/grad_norm"):
        assert [r[key] for r in resumed] == pytest.approx([original[r["step"]][key] for r in resumed], rel=1e-5)
    report = json.loads((tmp_path / "ep2" / "ranks" / "report.json").read_text())
    framework = report["ranks"][0]["checkpoint"]["resumed"]["framework"]
    assert framework["load_universal"] and framework["autoep_experts_renamed"], framework
